"""How much one client may ask of a public chat, over real HTTP: answers in flight, per
client and per deployment, and messages per minute; each refusal a 429 with Retry-After."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from agentstream.agents import AgentSpec
from agentstream.providers.scripted import ScriptedModel
from agentstream.runtime.tools import Tool
from conftest import LiveServer, make_settings, rows, serve, wait_until
from fakes.test_app import call_wait_then_answer, wait


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serve(
        make_settings(tmp_path_factory.mktemp("limits")),
        tools=[Tool.from_function(wait)],
        models=[ScriptedModel("waiter", call_wait_then_answer)],
        agents=[AgentSpec(id="waiter", model="waiter", tools=["wait"])],
    ) as server:
        yield server


def deploy(live: LiveServer, slug: str, agent: str, **limits: int) -> str:
    with live.client() as admin:
        response = admin.post(
            "/api/chat-deployments", json={"slug": slug, "agent_id": agent, **limits}
        )
    assert response.status_code == 201, response.text
    return slug


def visitor(live: LiveServer, address: str = "127.0.0.1") -> httpx.Client:
    """A client from its own loopback address: another visitor to the server."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=live.url, timeout=10, transport=transport)


def running(live: LiveServer) -> int:
    return int(rows(live, "select count(*) from runs where status = 'running'")[0][0])


def assert_too_many(response: httpx.Response, within: int) -> dict[str, Any]:
    assert response.status_code == 429
    assert 0 < int(response.headers["retry-after"]) <= within
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "too_many_attempts"
    return error


def test_one_client_may_have_only_so_many_answers_coming(live: LiveServer) -> None:
    slug = deploy(live, "two-at-once", "waiter", concurrent_runs_per_client=2)
    with ExitStack() as streams, visitor(live) as ann, visitor(live, "127.0.0.2") as bob:
        for _ in range(2):
            held = streams.enter_context(
                ann.stream("POST", f"/api/chat/{slug}", json={"input": "go"})
            )
            assert held.status_code == 200
        error = assert_too_many(ann.post(f"/api/chat/{slug}", json={"input": "go"}), 60)
        assert error["message"] == "Too many answers are coming at once; try again in a moment"
        other = streams.enter_context(bob.stream("POST", f"/api/chat/{slug}", json={"input": "go"}))
        assert other.status_code == 200, "another client is still served"
    wait_until(lambda: running(live) == 0)  # the disconnects cancelled them
    with ExitStack() as streams, visitor(live) as ann:
        for _ in range(2):
            again = streams.enter_context(
                ann.stream("POST", f"/api/chat/{slug}", json={"input": "go"})
            )
            assert again.status_code == 200, "a disconnect gives the slot back"
    wait_until(lambda: running(live) == 0)


def test_the_deployment_has_a_limit_of_its_own(live: LiveServer) -> None:
    slug = deploy(live, "one-at-all", "waiter", concurrent_runs=1)
    with ExitStack() as streams, visitor(live) as ann, visitor(live, "127.0.0.2") as bob:
        held = streams.enter_context(ann.stream("POST", f"/api/chat/{slug}", json={"input": "go"}))
        assert held.status_code == 200
        assert_too_many(bob.post(f"/api/chat/{slug}", json={"input": "go"}), 60)
    wait_until(lambda: running(live) == 0)


def test_finished_answers_give_their_slot_back(live: LiveServer) -> None:
    slug = deploy(live, "one-by-one", "demo", concurrent_runs_per_client=1)
    with visitor(live) as ann:
        for question in ("What is 1 + 1?", "What is 2 + 2?", "What is 3 + 3?"):
            response = ann.post(f"/api/chat/{slug}", json={"input": question})
            assert response.status_code == 200
            assert response.text.endswith('data: "[DONE]"\n\n')


def test_messages_per_minute_per_client(live: LiveServer) -> None:
    slug = deploy(live, "two-a-minute", "demo", runs_per_minute_per_client=2)
    with visitor(live) as ann, visitor(live, "127.0.0.2") as bob:
        statuses = [ann.post(f"/api/chat/{slug}", json={"input": "hi"}).status_code for _ in "ab"]
        assert statuses == [200, 200]
        error = assert_too_many(ann.post(f"/api/chat/{slug}", json={"input": "hi"}), 60)
        assert error["message"].startswith("Too many messages; try again in ")
        assert bob.post(f"/api/chat/{slug}", json={"input": "hi"}).status_code == 200


def test_limits_are_settings_of_the_deployment(live: LiveServer) -> None:
    slug = deploy(live, "defaults", "demo")
    with live.client() as admin:
        shown = admin.get(f"/api/chat-deployments/{slug}").json()["deployment"]
        zero = admin.patch(f"/api/chat-deployments/{slug}", json={"concurrent_runs": 0})
        changed = admin.patch(
            f"/api/chat-deployments/{slug}", json={"runs_per_minute_per_client": 5}
        )
    assert {k: shown[k] for k in shown if "runs" in k} == {
        "concurrent_runs_per_client": 4,
        "concurrent_runs": 100,
        "runs_per_minute_per_client": 30,
    }
    assert (zero.status_code, zero.json()["error"]["field"]) == (422, "concurrent_runs")
    assert changed.json()["deployment"]["runs_per_minute_per_client"] == 5
