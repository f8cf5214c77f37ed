"""The public chat over real HTTP: negotiation, toggles, access control, abort, redaction."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentstream.agents import AgentSpec
from agentstream.providers.scripted import ScriptedModel
from agentstream.runtime.tools import Tool
from conftest import (
    LiveServer,
    latest_run_id,
    make_settings,
    read_events,
    serve,
    wait_for_status,
)
from fakes.test_app import call_wait_then_answer, wait

V1 = {"X-Sim-Stream-Protocol": "agent-events-v1"}
MAIL: list[tuple[str, str]] = []


async def capture_mail(to: str, subject: str, body: str) -> None:
    MAIL.append((to, body))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serve(
        make_settings(tmp_path_factory.mktemp("chat")),
        tools=[Tool.from_function(wait)],
        models=[ScriptedModel("waiter", call_wait_then_answer)],
        agents=[AgentSpec(id="waiter", model="waiter", tools=["wait"])],
        email_sender=capture_mail,
    ) as server:
        yield server


def deploy(live: LiveServer, **settings: Any) -> str:
    settings.setdefault("agent_id", "demo")
    with live.client() as client:
        response = client.post("/api/chat-deployments", json=settings)
    assert response.status_code == 201, response.text
    return str(settings["slug"])


def chat(
    live: LiveServer,
    slug: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    client: httpx.Client | None = None,
) -> tuple[httpx.Response, list[Any]]:
    """POST to the chat and read the whole stream: the response and each frame's JSON."""
    own = client is None
    client = client or httpx.Client(base_url=live.url, timeout=10)
    try:
        with client.stream("POST", f"/api/chat/{slug}", json=body, headers=headers or {}) as r:
            if r.status_code != 200:
                r.read()
                return r, []
            frames = [e.json() for e in read_events(r)]
        return r, frames
    finally:
        if own:
            client.close()


def kinds(frames: list[Any]) -> list[str]:
    return [
        "chunk"
        if isinstance(f, dict) and "chunk" in f
        else f.get("event", "?")
        if isinstance(f, dict)
        else f
        for f in frames
    ]


def test_the_spec_example_works_verbatim(live: LiveServer) -> None:
    response, frames = chat(live, "your-slug", {"input": "Think briefly, then say hi"}, V1)

    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-sim-stream-protocol"] == "agent-events-v1"
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers["cache-control"] == "no-cache"
    assert frames[-1] == "[DONE]"
    assert kinds(frames)[0] == "thinking"
    assert kinds(frames)[-3:] == ["chunk", "final", "[DONE]"]
    assert {k for k in kinds(frames)} == {"thinking", "chunk", "final", "[DONE]"}
    answer = "".join(f["chunk"] for f in frames if "chunk" in f)
    assert answer == "Hi! I'm the offline demo model, a rule-based stand-in for a real LLM."
    assert len([f for f in frames if "chunk" in f]) > 3, "live, token by token"
    assert all(f["blockId"] == "demo" for f in frames[:-2])


def test_tool_turn_streams_then_resets_and_hides_arguments(live: LiveServer) -> None:
    _, frames = chat(live, "your-slug", {"input": "What is 17 * 23?"}, V1)

    order = kinds(frames)
    first_reset = order.index("chunk_reset")
    assert order[:first_reset] == ["thinking"] * order.index("chunk") + ["chunk"] * (
        first_reset - order.index("chunk")
    )
    assert order[first_reset + 1 : first_reset + 3] == ["tool", "tool"]
    start, end = frames[first_reset + 1 : first_reset + 3]
    assert start == {
        "blockId": "demo",
        "event": "tool",
        "phase": "start",
        "id": start["id"],
        "name": "calculator",
    }
    assert end == {
        "blockId": "demo",
        "event": "tool",
        "phase": "end",
        "id": start["id"],
        "name": "calculator",
        "status": "success",
    }
    final = frames[-2]
    assert final["data"]["output"] == {
        "content": "The answer is 391.",
        "toolCalls": [{"id": start["id"], "name": "calculator", "status": "success"}],
    }
    raw = "".join(str(f) for f in frames)
    assert "17 * 23" not in raw.replace("What is 17 * 23?", ""), "no tool arguments"
    assert "391" not in raw.split("chunk_reset")[0], "no tool result before the answer"


def test_legacy_clients_get_settled_text_only(live: LiveServer) -> None:
    for headers in ({}, {"X-Sim-Stream-Protocol": "agent-events-v2"}):
        response, frames = chat(live, "your-slug", {"input": "What is 17 * 23?"}, headers)
        assert "x-sim-stream-protocol" not in response.headers
        assert frames[:1] == [{"blockId": "demo", "chunk": "The answer is 391."}]
        assert kinds(frames) == ["chunk", "final", "[DONE]"]


def test_toggles_off_keep_live_text_but_no_thinking_or_tools(live: LiveServer) -> None:
    slug = deploy(live, slug="plain")
    _, frames = chat(live, slug, {"input": "What is 2 + 2?"}, V1)
    assert set(kinds(frames)) == {"chunk", "chunk_reset", "final", "[DONE]"}


def test_toggles_are_independent(live: LiveServer) -> None:
    slug = deploy(live, slug="tools-only", includeToolCalls=True)
    _, frames = chat(live, slug, {"input": "What is 2 + 2?"}, V1)
    assert "tool" in kinds(frames)
    assert "thinking" not in kinds(frames)


def test_header_and_toggles_change_what_is_shown_not_what_the_agent_does(
    live: LiveServer,
) -> None:
    deploy(live, slug="no-toggles")
    stored = []
    for slug, headers in (
        ("your-slug", V1),
        ("your-slug", {}),
        ("no-toggles", V1),
        ("no-toggles", {}),
    ):
        _, frames = chat(live, slug, {"input": "What is 3 * 4?"}, headers)
        with live.client() as client:
            run = client.get(f"/api/agents/runs/{latest_run_id(live, 'demo')}").json()
        stored.append(
            (
                [e["event"] for e in run["events"]],
                [e["text"] for e in run["events"] if e["event"] == "reasoning"],
                run["content"],
            )
        )
        shown = "thinking" in kinds(frames)
        assert shown == (slug == "your-slug" and headers == V1)
    assert stored[0][1], "the demo agent reasons"
    assert stored[0][2] == "The answer is 12."
    assert stored == [stored[0]] * 4


def test_conversation_continues_by_id(live: LiveServer) -> None:
    _, first = chat(live, "your-slug", {"input": "What is 5 * 5?"}, V1)
    conversation = first[-2]["data"]["conversationId"]
    _, second = chat(
        live, "your-slug", {"input": "What did I ask before?", "conversationId": conversation}, V1
    )
    assert second[-2]["data"]["output"]["content"] == "Earlier you asked: 'What is 5 * 5?'."
    assert second[-2]["data"]["conversationId"] == conversation


def test_authenticated_api_keeps_full_tool_calls(live: LiveServer) -> None:
    chat(live, "your-slug", {"input": "What is 6 * 7?"}, V1)
    with live.client() as client:
        run = client.get(f"/api/agents/runs/{latest_run_id(live)}").json()
    assert run["tool_calls"][0]["arguments"] == {"expression": "6 * 7"}
    assert run["tool_calls"][0]["result"] == 42
    assert run["content"] == "The answer is 42."


def test_password_access_with_cookie_and_rate_limit(live: LiveServer) -> None:
    slug = deploy(live, slug="secret", access="password", password="correct horse")
    with httpx.Client(base_url=live.url, timeout=10) as client:
        refused, _ = chat(live, slug, {"input": "hi"}, client=client)
        assert refused.status_code == 401
        assert refused.json()["error"]["field"] == "password"
        wrong, _ = chat(live, slug, {"password": "nope"}, client=client)
        assert wrong.status_code == 401
        assert wrong.json()["error"]["message"] == "Wrong password"
        signed_in = client.post(f"/api/chat/{slug}", json={"password": "correct horse"})
        assert signed_in.json() == {"authenticated": True}
        assert client.get(f"/api/chat/{slug}").json()["authenticated"] is True
        ok, frames = chat(live, slug, {"input": "hi"}, V1, client=client)
        assert ok.status_code == 200
        assert frames[-1] == "[DONE]"
    with httpx.Client(base_url=live.url, timeout=10) as stranger:
        statuses = [
            stranger.post(f"/api/chat/{slug}", json={"password": "guess"}).status_code
            for _ in range(8)
        ]
        assert statuses == [401] * 8, "2 guesses above, 8 more make 10"
        limited = stranger.post(f"/api/chat/{slug}", json={"password": "correct horse"})
    assert limited.status_code == 429
    assert 0 < int(limited.headers["retry-after"]) <= 900
    assert limited.json()["error"]["code"] == "too_many_attempts"


def test_changing_the_password_signs_everyone_out(live: LiveServer) -> None:
    slug = deploy(live, slug="rotating", access="password", password="first password")
    with httpx.Client(base_url=live.url, timeout=10) as client:
        client.post(f"/api/chat/{slug}", json={"password": "first password"})
        with live.client() as admin:
            admin.patch(f"/api/chat-deployments/{slug}", json={"password": "second password"})
        assert client.get(f"/api/chat/{slug}").json()["authenticated"] is False


def test_a_malformed_access_cookie_is_no_cookie(live: LiveServer) -> None:
    deploy(live, slug="cookie-pw", access="password", password="correct horse")
    deploy(live, slug="cookie-mail", access="email", allowed_emails=["@example.com"])
    for slug in ("cookie-pw", "cookie-mail"):
        for token in (b".\xb2.x", b"." + b"9" * 5000 + b"." + b"a" * 64):
            cookie = {b"Cookie": b"agentstream_chat_" + slug.encode() + b"=" + token}
            with httpx.Client(base_url=live.url, timeout=10, headers=cookie) as client:
                info = client.get(f"/api/chat/{slug}")
                message = client.post(f"/api/chat/{slug}", json={"input": "hi"})
            assert (info.status_code, info.json()["authenticated"]) == (200, False)
            assert message.status_code == 401
            assert message.json()["error"]["code"] == "unauthorized"


def test_email_access_with_a_one_time_code(live: LiveServer) -> None:
    slug = deploy(live, slug="invited", access="email", allowed_emails=["@example.com"])
    with httpx.Client(base_url=live.url, timeout=10) as client:
        outsider = client.post(f"/api/chat/{slug}", json={"email": "eve@elsewhere.org"})
        assert outsider.status_code == 403
        asked = client.post(f"/api/chat/{slug}", json={"email": "Ann@Example.com"})
        assert asked.status_code == 401
        assert asked.json()["error"]["field"] == "otp"
        to, body = MAIL[-1]
        code = body.split("code is ")[1][:6]
        assert to == "ann@example.com"
        bad = client.post(
            f"/api/chat/{slug}",
            json={"email": "ann@example.com", "otp": "000000" if code != "000000" else "111111"},
        )
        assert bad.status_code == 401
        good = client.post(f"/api/chat/{slug}", json={"email": "ann@example.com", "otp": code})
        assert good.json() == {"authenticated": True}
        reused = httpx.post(
            f"{live.url}/api/chat/{slug}", json={"email": "ann@example.com", "otp": code}
        )
        assert reused.status_code == 401, "a code works once"
        ok, frames = chat(live, slug, {"input": "hi"}, client=client)
    assert ok.status_code == 200
    assert frames[-1] == "[DONE]"


def test_api_key_access(live: LiveServer) -> None:
    slug = deploy(live, slug="internal", access="api_key")
    refused, _ = chat(live, slug, {"input": "hi"})
    assert refused.status_code == 401
    ok, frames = chat(live, slug, {"input": "hi"}, {"Authorization": f"Bearer {live.key}"})
    assert ok.status_code == 200
    assert frames[-1] == "[DONE]"


def test_redaction_disables_live_text(live: LiveServer) -> None:
    with live.client() as admin:
        admin.post("/api/agents", json={"id": "echo", "reasoning": True})
    slug = deploy(live, slug="redacted", agent_id="echo", redact_pii=True, includeThinking=True)
    message = "Reach me at jane.doe@example.com or +1 415-555-2671"
    _, frames = chat(live, slug, {"input": message}, V1)
    chunks = [f["chunk"] for f in frames if isinstance(f, dict) and "chunk" in f]
    assert len(chunks) == 1, "settled text in one piece"
    assert "jane.doe@example.com" not in str(frames)
    assert "415-555-2671" not in str(frames)
    assert "[EMAIL]" in chunks[0]
    assert "[PHONE]" in chunks[0]
    assert "[EMAIL]" in frames[-2]["data"]["output"]["content"]
    thinking = [f for f in frames if isinstance(f, dict) and f.get("event") == "thinking"]
    assert len(thinking) == 1, "thinking too is settled, and redacted"
    assert "[EMAIL]" in thinking[0]["data"]


def test_visitors_read_no_server_details_when_the_model_cannot_run(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with live.client() as admin:
        admin.post("/api/agents", json={"id": "keyless", "model": "gpt-4o-mini"})
        deployed = admin.post(
            "/api/chat-deployments", json={"slug": "keyless", "agent_id": "keyless"}
        ).json()
        native = admin.post("/api/agents/keyless/run/stream", json={"message": "hi"})
    detail = "Set OPENAI_API_KEY to use gpt-4o-mini (OpenAI)"
    assert deployed["unavailable"] == detail
    assert (native.status_code, native.json()["error"]["message"]) == (503, detail)
    for headers in (V1, {}):
        refused, _ = chat(live, "keyless", {"input": "hi"}, headers)
        assert refused.status_code == 503
        assert refused.json()["error"] == {
            "code": "model_unavailable",
            "message": "The assistant is unavailable right now.",
            "field": None,
        }
    assert detail in caplog.text, "the detail is in the server log"


def test_an_answer_waiting_for_approval_says_so(live: LiveServer) -> None:
    with live.client() as admin:
        guarded = {"id": "guarded", "tools": ["calculator"], "approval_required": ["calculator"]}
        assert admin.post("/api/agents", json=guarded).status_code == 201
    slug = deploy(live, slug="guarded", agent_id="guarded", includeToolCalls=True)
    _, frames = chat(live, slug, {"input": "What is 6 * 7?"}, V1)
    start = next(f for f in frames if f.get("event") == "tool")
    assert frames[-3:] == [
        {
            "blockId": "guarded",
            "event": "approval_required",
            "id": start["id"],
            "name": "calculator",
        },
        {
            "event": "final",
            "data": {
                "success": False,
                "awaitingApproval": True,
                "error": "The answer is waiting for an approval.",
                "conversationId": frames[-2]["data"]["conversationId"],
            },
        },
        "[DONE]",
    ]
    assert "6 * 7" not in str(frames).replace("What is 6 * 7?", ""), "no tool arguments"
    conversation = frames[-2]["data"]["conversationId"]
    _, legacy = chat(live, slug, {"input": "What is 6 * 7?"})
    assert kinds(legacy) == ["final", "[DONE]"]
    assert legacy[0]["data"]["awaitingApproval"] is True

    again, _ = chat(live, slug, {"input": "Well?", "conversationId": conversation}, V1)
    assert again.status_code == 409
    assert again.json()["error"] == {
        "code": "conflict",
        "message": "The answer to your last message is waiting for an approval. Try again "
        "once it has been decided, or start a new conversation.",
        "field": "conversationId",
    }


def test_a_second_message_while_answering_gets_a_public_conflict(live: LiveServer) -> None:
    slug = deploy(live, slug="busy", agent_id="waiter")
    body = {"input": "go", "conversationId": "conv-1"}
    with (
        httpx.Client(base_url=live.url, timeout=10) as client,
        client.stream("POST", f"/api/chat/{slug}", json=body, headers=V1) as first,
    ):
        assert first.status_code == 200
        second = client.post(f"/api/chat/{slug}", json=body, headers=V1)
    assert second.status_code == 409
    assert second.json()["error"] == {
        "code": "conflict",
        "message": "The answer to your last message is still coming; wait for it to finish.",
        "field": "conversationId",
    }
    wait_for_status(live, latest_run_id(live, agent_id="waiter"))


def test_stop_cancels_the_run_and_settles_tools(live: LiveServer) -> None:
    slug = deploy(live, slug="slow", agent_id="waiter", includeToolCalls=True)
    with (
        httpx.Client(base_url=live.url, timeout=10) as client,
        client.stream("POST", f"/api/chat/{slug}", json={"input": "go"}, headers=V1) as response,
    ):
        for line in response.iter_lines():
            if '"phase":"start"' in line:
                break
    run = wait_for_status(live, latest_run_id(live, agent_id="waiter"))
    assert run["status"] == "cancelled"
    assert run["error"] == "Client cancelled request"
    assert run["tool_calls"][0]["status"] == "cancelled"


def test_deployment_pins_the_agent_until_redeployed(live: LiveServer) -> None:
    with live.client() as admin:
        admin.post("/api/agents", json={"id": "pinned", "tools": ["calculator"]})
        deploy(live, slug="pinned", agent_id="pinned")
        admin.patch("/api/agents/pinned", json={"tools": []})
        _, before = chat(live, "pinned", {"input": "What is 2 + 2?"})
        assert before[0]["chunk"] == "The answer is 4.", "still the deployed tools"
        redeployed = admin.post("/api/chat-deployments/pinned/redeploy").json()
        assert redeployed["agent_version"] == 2
        _, after = chat(live, "pinned", {"input": "What is 2 + 2?"})
        assert "calculator" not in after[0]["chunk"]
        assert after[0]["chunk"].startswith("You said:")


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"slug": "x1", "agent_id": "nobody"}, 404, "agent_id"),
        ({"slug": "x2", "agent_id": "demo", "access": "password"}, 422, "password"),
        ({"slug": "x3", "agent_id": "demo", "access": "email"}, 422, "allowed_emails"),
        ({"slug": "Bad Slug", "agent_id": "demo"}, 422, "slug"),
        ({"slug": "your-slug", "agent_id": "demo"}, 409, "slug"),
    ],
)
def test_invalid_deployments(
    live: LiveServer, body: dict[str, Any], status: int, field: str
) -> None:
    with live.client() as client:
        response = client.post("/api/chat-deployments", json=body)
    assert response.status_code == status
    assert response.json()["error"]["field"] == field


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"workflow_id": "answer"}, "output_blocks"),
        ({"output_blocks": ["reply"]}, "output_blocks"),
        ({"agent_id": "demo", "workflow_id": "answer", "output_blocks": ["reply"]}, "workflow_id"),
    ],
)
def test_updates_into_an_invalid_deployment_are_refused(
    live: LiveServer, change: dict[str, Any], field: str
) -> None:
    with live.client() as client:
        before = client.get("/api/chat-deployments/your-slug").json()
        response = client.patch("/api/chat-deployments/your-slug", json=change)
        after = client.get("/api/chat-deployments/your-slug").json()
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["field"] == field
    assert after == before, "nothing changed"


def test_new_deployments_name_the_field_at_fault(live: LiveServer) -> None:
    with live.client() as client:
        both = client.post(
            "/api/chat-deployments",
            json={"slug": "two", "agent_id": "demo", "workflow_id": "w", "output_blocks": ["b"]},
        )
        none = client.post("/api/chat-deployments", json={"slug": "zero"})
        blocks = client.post(
            "/api/chat-deployments",
            json={"slug": "blocks", "agent_id": "demo", "output_blocks": ["b"]},
        )
    assert [(r.status_code, r.json()["error"]["field"]) for r in (both, none, blocks)] == [
        (422, "workflow_id"),
        (422, "workflow_id"),
        (422, "output_blocks"),
    ]


def test_bad_chat_requests(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url) as client:
        unknown = client.post("/api/chat/nowhere", json={"input": "hi"})
        extra = client.post("/api/chat/your-slug", json={"input": "hi", "x": 1})
        files = client.post("/api/chat/your-slug", json={"input": "hi", "files": [{"a": 1}]})
    assert (unknown.status_code, unknown.json()["error"]["field"]) == (404, "slug")
    assert (extra.status_code, extra.json()["error"]["field"]) == (422, "x")
    assert (files.status_code, files.json()["error"]["field"]) == (422, "files")


def test_hosted_page_is_served(live: LiveServer, tmp_path: Path) -> None:
    page = httpx.get(f"{live.url}/chat/your-slug")
    script = httpx.get(f"{live.url}/static/chat.js")
    assert page.status_code == 200
    assert "/static/chat.js" in page.text
    assert "X-Sim-Stream-Protocol" in script.text


def test_only_plain_addresses_get_codes(live: LiveServer) -> None:
    slug = deploy(live, slug="strict", access="email", allowed_emails=["@example.com"])
    sent = len(MAIL)
    for email in [
        "attacker%evil.com@example.com",
        "a@evil.com@example.com",
        "victim@x.org\r\nBcc: y@example.com",
        "no-at-sign",
    ]:
        response = httpx.post(f"{live.url}/api/chat/{slug}", json={"email": email})
        assert response.status_code == 422, email
        assert response.json()["error"]["field"] == "email"
    assert len(MAIL) == sent, "no code was sent"


def test_a_code_dies_after_five_wrong_tries(live: LiveServer) -> None:
    slug = deploy(live, slug="tries", access="email", allowed_emails=["bo@example.com"])
    with httpx.Client(base_url=live.url, timeout=10) as client:
        client.post(f"/api/chat/{slug}", json={"email": "bo@example.com"})
        code = MAIL[-1][1].split("code is ")[1][:6]
        wrong = f"{(int(code) + 1) % 10**6:06d}"
        for _ in range(5):
            client.post(f"/api/chat/{slug}", json={"email": "bo@example.com", "otp": wrong})
        late = client.post(f"/api/chat/{slug}", json={"email": "bo@example.com", "otp": code})
    assert late.status_code == 401
    assert late.json()["error"]["message"] == "Wrong or expired code"


def test_signed_out_visitors_see_only_how_to_sign_in(live: LiveServer) -> None:
    slug = deploy(
        live,
        slug="quiet",
        access="password",
        password="long enough",
        greeting="Welcome, insider",
        includeThinking=True,
    )
    info = httpx.get(f"{live.url}/api/chat/{slug}").json()
    assert info == {
        "slug": "quiet",
        "title": "Demo assistant",
        "greeting": "",
        "accentColor": "#0a84ff",
        "logoUrl": None,
        "suggestedPrompts": [],
        "access": "password",
        "authenticated": False,
        "includeThinking": False,
        "includeToolCalls": False,
        "includeCitations": False,
    }


def test_demo_chat_keeps_changes_across_restarts(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with serve(settings) as first, first.client() as admin:
        admin.patch(
            "/api/chat-deployments/your-slug",
            json={"access": "password", "password": "long enough"},
        )
    with serve(settings) as second, second.client() as admin:
        kept = admin.get("/api/chat-deployments/your-slug").json()
    assert kept["deployment"]["access"] == "password"


def test_the_agents_file_is_applied_at_each_start(tmp_path: Path) -> None:
    definitions = tmp_path / "agents.yaml"
    definitions.write_text("agents:\n  - {id: filed, instructions: First.}\n")
    settings = make_settings(tmp_path, agents_file=definitions)
    with serve(settings) as first, first.client() as admin:
        assert admin.get("/api/agents/filed").json()["agent"]["instructions"] == "First."
    definitions.write_text("agents:\n  - {id: filed, instructions: Second.}\n")
    with serve(settings) as second, second.client() as admin:
        agent = admin.get("/api/agents/filed").json()
    assert (agent["agent"]["instructions"], agent["version"]) == ("Second.", 2)
