"""What the console stands on, over HTTP: signing in with an API key for an HttpOnly
session cookie that the API accepts in its place (and refuses from other sites), signing
out, and the lists of sessions and workflow executions; on either store."""

from __future__ import annotations

import json
import uuid
from base64 import urlsafe_b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.requests import Request

from agentstream.server.auth import same_origin
from agentstream.store import Store
from conftest import STORES, LiveServer, run_events, serve_on

SESSION = "/api/console/session"


@pytest.fixture(params=STORES)
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    with serve_on(request, tmp_path) as live:
        yield live


def browser(live: LiveServer) -> httpx.Client:
    """A client as the console's page is one: no key, this server's own ``Origin``."""
    return httpx.Client(base_url=live.url, headers={"Origin": live.url}, timeout=10)


def sign_in(client: httpx.Client, key: str) -> httpx.Response:
    return client.post(SESSION, json={"api_key": key})


def test_a_key_is_exchanged_for_a_cookie_the_api_accepts_until_sign_out(
    live: LiveServer,
) -> None:
    with browser(live) as client:
        assert client.get("/api/agents").status_code == 401
        signed_in = sign_in(client, live.key)
        assert signed_in.status_code == 204
        cookie = signed_in.headers["set-cookie"]
        assert cookie.startswith("agentstream_console=cs_")
        assert {"httponly", "samesite=strict", "path=/"} <= {
            part.strip().lower() for part in cookie.split(";")
        }
        assert live.key not in cookie
        assert client.get(SESSION).json() == {"key_name": "demo"}
        assert client.get("/api/agents").status_code == 200
        first = client.cookies["agentstream_console"]
        sign_in(client, live.key).raise_for_status()
        token = client.cookies["agentstream_console"]
        assert refused_with(live, first), "signing in again ends the session before"

        assert client.delete(SESSION).status_code == 204
        assert "agentstream_console" not in client.cookies
    assert refused_with(live, token), "signed out everywhere"


def refused_with(live: LiveServer, token: str) -> bool:
    with httpx.Client(base_url=live.url, cookies={"agentstream_console": token}) as other:
        return other.get("/api/agents").status_code == 401


def test_a_wrong_key_gets_no_cookie_and_names_the_field(live: LiveServer) -> None:
    with browser(live) as client:
        refused = sign_in(client, "as_not-a-key")
        assert refused.status_code == 401
        assert refused.json()["error"]["field"] == "api_key"
        assert "set-cookie" not in refused.headers
        missing = client.post(SESSION, json={})
        assert (missing.status_code, missing.json()["error"]["field"]) == (422, "api_key")


def test_a_cookie_changes_nothing_from_another_site(live: LiveServer) -> None:
    with browser(live) as client:
        sign_in(client, live.key).raise_for_status()
        token = client.cookies["agentstream_console"]
    body = {"id": f"forged-{uuid.uuid4().hex[:6]}"}
    for origin in ({"Origin": "https://evil.example"}, {}):
        with httpx.Client(
            base_url=live.url, cookies={"agentstream_console": token}, headers=origin
        ) as other:
            refused = other.post("/api/agents", json=body)
            assert refused.status_code == 403, origin
            assert refused.json()["error"]["code"] == "forbidden"
            assert other.get("/api/agents").status_code == 200, "reading is no harm"
    with live.client() as client:
        assert client.get(f"/api/agents/{body['id']}").status_code == 404
    with httpx.Client(base_url=live.url, headers={"Origin": "https://evil.example"}) as evil:
        assert sign_in(evil, live.key).status_code == 403, "nor signs anyone in"


def test_revoking_the_key_ends_its_console_sessions(live: LiveServer) -> None:
    # A second key, so that the demo key stays for the server's other uses.
    async def new_key() -> str:
        store = await Store.open(live.settings.database)
        try:
            return await store.create_api_key("ops")
        finally:
            await store.close()

    async def revoke(name: str) -> None:
        store = await Store.open(live.settings.database)
        try:
            [key] = [k for k in await store.list_api_keys() if k.name == name]
            assert await store.revoke_api_key(key.id)
        finally:
            await store.close()

    key = anyio.run(new_key)
    with browser(live) as client:
        sign_in(client, key).raise_for_status()
        assert client.get(SESSION).json() == {"key_name": "ops"}
        anyio.run(revoke, "ops")
        assert client.get(SESSION).status_code == 401


def paged(live: LiveServer, url: str, key: str, **params: Any) -> list[dict[str, Any]]:
    """Every item of a list endpoint, following its cursors."""
    items: list[dict[str, Any]] = []
    cursor = None
    with live.client() as client:
        while True:
            response = client.get(url, params={**params, **({"cursor": cursor} if cursor else {})})
            assert response.status_code == 200, response.text
            page = response.json()
            items += page[key]
            if (cursor := page["next_cursor"]) is None:
                return items


def test_sessions_are_listed_newest_first_with_their_runs(live: LiveServer) -> None:
    agent = f"talker-{uuid.uuid4().hex[:8]}"
    with live.client() as client:
        assert client.post("/api/agents", json={"id": agent}).status_code == 201
    sessions = []
    for n in range(3):
        first = run_events(live, agent, {"message": f"Write {n + 1} words"})[0].json()
        sessions.append(first["session_id"])
    run_events(live, agent, {"message": "And again", "session_id": sessions[0]})

    listed = paged(live, "/api/sessions", "sessions", agent_id=agent, limit=2)
    assert [s["id"] for s in listed] == sessions[::-1], "each once, newest first"
    assert [s["runs"] for s in listed] == [1, 1, 2]
    assert all(s["agent_id"] == agent for s in listed)
    assert listed[-1]["last_run_at"] > listed[-1]["created_at"]
    with live.client() as client:
        since = client.get(
            "/api/sessions", params={"agent_id": agent, "since": listed[0]["created_at"]}
        )
        refused = client.get("/api/sessions", params={"cursor": "nope"})
    assert [s["id"] for s in since.json()["sessions"]] == [sessions[-1]]
    assert (refused.status_code, refused.json()["error"]["field"]) == (422, "cursor")


def test_executions_of_every_workflow_are_listed_and_filtered(live: LiveServer) -> None:
    workflow = f"flow-{uuid.uuid4().hex[:8]}"
    definition = {
        "id": workflow,
        "blocks": [
            {"id": "start", "type": "start"},
            {"id": "out", "type": "response", "output": "<start.input>"},
        ],
        "edges": [{"from": "start", "to": "out"}],
    }
    with live.client() as client:
        assert client.post("/api/workflows", json=definition).status_code == 201
        ids = []
        for n in range(3):
            ran = client.post(f"/api/workflows/{workflow}/run/stream", json={"input": n})
            first = ran.text.split("\n", 1)[0].removeprefix("data: ")
            ids.append(json.loads(first)["execution_id"])

    listed = paged(live, "/api/workflows/executions", "executions", workflow_id=workflow, limit=2)
    assert [x["id"] for x in listed] == ids[::-1]
    assert {(x["workflow_id"], x["status"], x["draft"]) for x in listed} == {
        (workflow, "completed", False)
    }
    assert [x["result"] for x in listed] == [2, 1, 0]
    assert (
        paged(live, "/api/workflows/executions", "executions", workflow_id=workflow, status="error")
        == []
    )
    with live.client() as client:
        refused = client.get("/api/workflows/executions", params={"status": "done"})
    assert (refused.status_code, refused.json()["error"]["field"]) == (422, "status")


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://console.test:3000", "console.test:3000", True),
        ("https://console.test", "console.test:443", True),  # the default port, said or not
        ("https://Console.test:443", "console.test", True),
        ("http://console.test", "console.test:3000", False),
        ("https://evil.test", "console.test", False),
        ("null", "console.test", False),  # a sandboxed frame, a file
        ("null", "", False),
        ("http://console.test:x", "console.test", False),
        (None, "console.test", False),
    ],
)
def test_same_origin_compares_host_and_port(origin: str | None, host: str, same: bool) -> None:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    request = Request({"type": "http", "method": "POST", "path": "/", "headers": headers})
    assert same_origin(request) is same


@pytest.mark.parametrize("url", ["/api/agents/runs", "/api/sessions", "/api/workflows/executions"])
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "0001-01-01T00:00:00+01:00"}, "since"),
        ({"until": "9999-12-31T23:59:59-01:00"}, "until"),
        ({"cursor": urlsafe_b64encode(b"0001-01-01T00:00:00+01:00|run_x").decode()}, "cursor"),
        ({"limit": 10_000}, "limit"),
    ],
)
def test_dates_past_the_calendar_name_the_field(
    server: LiveServer, url: str, params: dict[str, Any], field: str
) -> None:
    with server.client() as client:
        refused = client.get(url, params=params)
    assert (refused.status_code, refused.json()["error"]["field"]) == (422, field)


def test_no_workflow_takes_the_executions_list_s_name(server: LiveServer) -> None:
    workflow = {"id": "executions", "blocks": [{"id": "start", "type": "start"}]}
    with server.client() as client:
        refused = client.post("/api/workflows", json=workflow)
    assert (refused.status_code, refused.json()["error"]["field"]) == (422, "id")
