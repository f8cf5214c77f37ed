"""Following a public chat answer (``GET /api/chat/{slug}/runs/{run_id}/stream``): from the
start it is the message's own stream; from any frame's id, exactly what came after it; by
the deployment's access rules, toggles, cadence and redaction; for answers of that
deployment only. Across processes: ``test_cluster_surfaces.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentstream.agents import AgentSpec
from agentstream.providers.base import (
    ModelPart,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
)
from agentstream.providers.scripted import ScriptedModel
from agentstream.runtime.tools import Tool
from agentstream.sse import ServerSentEvent
from conftest import LiveServer, make_settings, read_events, serve
from fakes.test_app import wait

V1 = {"X-Sim-Stream-Protocol": "agent-events-v1"}


def think_call_then_answer(request: ModelRequest) -> list[ModelPart]:
    """Thinks, says a preamble and calls the tool; then thinks again and answers."""
    if request.messages[-1].role == "tool":
        return [
            ReasoningPart("It came "),
            ReasoningPart("back."),
            TextPart("It "),
            TextPart("waited."),
            TurnEndPart("end_turn"),
        ]
    return [
        ReasoningPart("Better "),
        ReasoningPart("wait."),
        TextPart("Let me "),
        TextPart("wait."),
        ToolCallStartPart("call_1", "wait"),
        ToolCallArgsPart("call_1", '{"seconds": 0.01}'),
        ToolCallEndPart("call_1"),
        TurnEndPart("tool_calls"),
    ]


TWO_AGENTS = {
    "id": "two-agents",
    "blocks": [
        {"id": "start", "type": "start"},
        {"id": "left", "type": "agent", "agent": "thinker", "input": "<start.input>"},
        {"id": "right", "type": "agent", "agent": "thinker", "input": "<start.input>"},
    ],
    "edges": [{"from": "start", "to": "left"}, {"from": "start", "to": "right"}],
}
"""Two output blocks in parallel: the chat holds the right one's frames until the left's
are out."""

AGENTS = [
    AgentSpec(id="thinker", model="thinker", tools=["wait"]),
    AgentSpec(id="asker", model="thinker", tools=["wait"], approval_required=["wait"]),
]


def _server(data_dir: Path, **overrides: Any) -> Iterator[LiveServer]:
    with (
        serve(
            make_settings(data_dir, **overrides),
            tools=[Tool.from_function(wait)],
            models=[ScriptedModel("thinker", think_call_then_answer)],
            agents=AGENTS,
        ) as server,
        server.client() as admin,
    ):
        assert admin.post("/api/workflows", json=TWO_AGENTS).status_code == 201
        for deployment in (
            {"slug": "open", "agent_id": "thinker"},
            {"slug": "other", "agent_id": "thinker"},
            {"slug": "flow", "workflow_id": "two-agents", "output_blocks": ["left", "right"]},
            {"slug": "asking", "agent_id": "asker"},
            {"slug": "locked", "agent_id": "thinker", "access": "password", "password": "s3cret!!"},
            {"slug": "keyed", "agent_id": "thinker", "access": "api_key"},
            {"slug": "masked", "agent_id": "demo", "redact_pii": True},
        ):
            shown = {"include_thinking": True, "include_tool_calls": True}
            created = admin.post("/api/chat-deployments", json=deployment | shown)
            assert created.status_code == 201, created.text
        yield server


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from _server(tmp_path_factory.mktemp("follow"))


@pytest.fixture(scope="module")
def forgetful(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server whose live log keeps nothing of a run once it ends: follows read the store."""
    yield from _server(tmp_path_factory.mktemp("forgetful"), run_retention_seconds=0)


def ask(
    client: httpx.Client, slug: str, message: str = "go", headers: dict[str, str] | None = None
) -> tuple[httpx.Response, list[Any]]:
    """Send a message and read the whole answer: the response and each frame's JSON."""
    with client.stream("POST", f"/api/chat/{slug}", json={"input": message}, headers=headers) as r:
        assert r.status_code == 200, r.read()
        return r, [e.json() for e in read_events(r)]


def follow(
    client: httpx.Client,
    slug: str,
    answered: httpx.Response,
    after: int | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """The follow of the answer ``answered`` streamed, as one response (read whole)."""
    run_id = answered.headers["x-run-id"]
    params = {"conversationId": answered.headers["x-conversation-id"]}
    sent = dict(headers or {})
    if after is not None:
        sent["Last-Event-ID"] = str(after)
    return client.get(f"/api/chat/{slug}/runs/{run_id}/stream", params=params, headers=sent)


def sse(response: httpx.Response) -> list[ServerSentEvent]:
    assert response.status_code == 200, response.text
    return read_events(response)


def ids(events: list[ServerSentEvent]) -> list[int]:
    """Each frame's id but the ``[DONE]``'s, which has none (the decoder repeats the last)."""
    return [int(e.id or "") for e in events[:-1]]


def assert_resumes_everywhere(
    client: httpx.Client, slug: str, answered: httpx.Response, headers: dict[str, str]
) -> None:
    """Resumed after each id the stream has, the follow is exactly what came after it."""
    whole = sse(follow(client, slug, answered, headers=headers))
    seen = ids(whole)
    assert seen == sorted(seen)
    for after in sorted(set(seen)):
        resumed = follow(client, slug, answered, after, headers)
        expected = [e.json() for e, i in zip(whole, seen, strict=False) if i > after]
        if after == seen[-1]:
            assert resumed.status_code == 204, "after the final, nothing more"
        else:
            assert [e.json() for e in sse(resumed)] == [*expected, "[DONE]"], f"after {after}"


@pytest.mark.parametrize("slug", ["open", "flow"])
@pytest.mark.parametrize("protocol", [V1, {}], ids=["v1", "legacy"])
def test_a_follow_is_the_answer_stream_and_resumes_after_any_frame(
    live: LiveServer, slug: str, protocol: dict[str, str]
) -> None:
    with httpx.Client(base_url=live.url, timeout=10) as client:
        answered, posted = ask(client, slug, headers=protocol)
        followed = follow(client, slug, answered, headers=protocol)
        assert_resumes_everywhere(client, slug, answered, protocol)

    assert answered.headers["x-run-id"].startswith("run_" if slug == "open" else "wfx_")
    assert [e.json() for e in sse(followed)] == posted
    assert followed.text.endswith('\n\ndata: "[DONE]"\n\n'), "[DONE] has no id line"
    assert followed.headers.get("x-sim-stream-protocol") == protocol.get("X-Sim-Stream-Protocol")
    assert posted[-2]["data"]["success"] is True
    kinds = {f.get("event", "chunk") for f in posted[:-2]}
    if protocol:
        assert kinds == {"chunk", "chunk_reset", "thinking", "tool"}
    else:  # settled text only, one chunk per block, whatever the toggles
        assert kinds == {"chunk"}
        assert len(posted) == (4 if slug == "flow" else 3)


def test_a_resumed_answer_keeps_what_came_before_it(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=10) as client:
        answered, posted = ask(client, "open", headers=V1)
        whole = sse(follow(client, "open", answered, headers=V1))

        def after(frame: dict[str, Any]) -> list[Any]:
            [seen] = [e for e in whole if e.json() == frame]
            resumed = follow(client, "open", answered, int(seen.id or ""), V1)
            return [e.json() for e in sse(resumed)]

        after_preamble = after({"blockId": "thinker", "chunk": "wait."})
        after_tool = after(next(f for f in posted if f.get("phase") == "end"))

    # What comes next depends on what came before: the reset takes back text sent before
    # the resume point, and the final lists the tool called before it.
    assert after_preamble[0] == {"blockId": "thinker", "event": "chunk_reset"}
    assert after_tool[-2] == posted[-2]
    assert after_tool[-2]["data"]["output"]["toolCalls"] == [
        {"id": "call_1", "name": "wait", "status": "success"}
    ]


def test_an_answer_no_longer_in_the_live_log_comes_settled(forgetful: LiveServer) -> None:
    with httpx.Client(base_url=forgetful.url, timeout=10) as client:
        answered, posted = ask(client, "open", headers=V1)
        replayed = [e.json() for e in sse(follow(client, "open", answered, headers=V1))]

    # The store keeps no deltas and no preamble: thinking whole per step, the final turn's
    # text in one chunk, the same final.
    assert replayed == [
        {"blockId": "thinker", "event": "thinking", "data": "Better wait."},
        {"blockId": "thinker", "event": "tool", "phase": "start", "id": "call_1", "name": "wait"},
        {
            "blockId": "thinker",
            "event": "tool",
            "phase": "end",
            "id": "call_1",
            "name": "wait",
            "status": "success",
        },
        {"blockId": "thinker", "event": "thinking", "data": "\n\nIt came back."},
        {"blockId": "thinker", "chunk": "It waited."},
        posted[-2],
        "[DONE]",
    ]


def test_a_paused_answer_is_followed_to_its_pause_and_after_the_approval_to_its_end(
    live: LiveServer,
) -> None:
    with httpx.Client(base_url=live.url, timeout=10) as client, live.client() as admin:
        answered, posted = ask(client, "asking", headers=V1)
        paused = sse(follow(client, "asking", answered, headers=V1))
        waiting = follow(client, "asking", answered, ids(paused)[-1], V1)
        run_id = answered.headers["x-run-id"]
        decided = admin.post(f"/api/agents/runs/{run_id}/approve", json={"tool_call_id": "call_1"})
        assert decided.status_code == 200, decided.text
        rest = [e.json() for e in sse(follow(client, "asking", answered, ids(paused)[-1], V1))]
        again = [e.json() for e in sse(follow(client, "asking", answered, headers=V1))]

    assert posted[-2]["data"]["awaitingApproval"] is True
    assert [e.json() for e in paused] == posted, "up to the pause, as the message had it"
    assert waiting.status_code == 204, "nothing more until it is decided"
    assert rest[-3:] == [
        {"blockId": "asker", "chunk": "waited."},
        {
            "event": "final",
            "data": {
                "success": True,
                "conversationId": answered.headers["x-conversation-id"],
                "output": {
                    "content": "It waited.",
                    "toolCalls": [{"id": "call_1", "name": "wait", "status": "success"}],
                },
            },
        },
        "[DONE]",
    ]
    # From the start, one answer at a time: up to the pause. Its live part has given way
    # to the continuation's, so it is read from the store, where only settled text is.
    assert again == [
        {"blockId": "asker", "event": "thinking", "data": "Better wait."},
        {"blockId": "asker", "event": "tool", "phase": "start", "id": "call_1", "name": "wait"},
        {"blockId": "asker", "event": "approval_required", "id": "call_1", "name": "wait"},
        *posted[-2:],
    ]


def test_redaction_holds_on_a_follow(live: LiveServer) -> None:
    message = "Reach me at jane.doe@example.com"
    with httpx.Client(base_url=live.url, timeout=10) as client:
        answered, posted = ask(client, "masked", message, V1)
        followed = [e.json() for e in sse(follow(client, "masked", answered, headers=V1))]

    assert followed == posted
    assert "jane.doe@example.com" not in str(followed)
    assert "[EMAIL]" in str(followed)


def test_a_follow_needs_the_deployments_access(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=10) as visitor, live.client() as keyed:
        signed_in = visitor.post("/api/chat/locked", json={"password": "s3cret!!"})
        assert signed_in.status_code == 200
        answered, posted = ask(visitor, "locked")
        stranger = httpx.get(
            f"{live.url}/api/chat/locked/runs/{answered.headers['x-run-id']}/stream",
            params={"conversationId": answered.headers["x-conversation-id"]},
        )
        own = [e.json() for e in sse(follow(visitor, "locked", answered))]

        by_key, by_key_posted = ask(keyed, "keyed")
        keyless = follow(visitor, "keyed", by_key)
        with_key = [e.json() for e in sse(follow(keyed, "keyed", by_key))]

    assert (stranger.status_code, stranger.json()["error"]["field"]) == (401, "password")
    assert own == posted
    assert (keyless.status_code, keyless.json()["error"]["field"]) == (401, "apikey")
    assert with_key == by_key_posted


def test_only_the_deployments_answers_in_that_conversation_are_followed(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=10) as client, live.client() as admin:
        answered, _ = ask(client, "open")
        run_id, conversation = answered.headers["x-run-id"], answered.headers["x-conversation-id"]
        native = admin.post("/api/agents/thinker/run/stream", json={"message": "go"})
        native_run = read_events(native)[0].json()["run_id"]
        flow, _ = ask(client, "flow")

        def get(slug: str, run: str, conversation_id: str | None = conversation) -> httpx.Response:
            params = {} if conversation_id is None else {"conversationId": conversation_id}
            return client.get(f"/api/chat/{slug}/runs/{run}/stream", params=params)

        refused = {
            "same agent, other deployment": get("other", run_id),
            "other conversation": get("open", run_id, "another"),
            "a run of the API": get("open", native_run),
            "an answer of a workflow deployment": get("open", flow.headers["x-run-id"]),
            "a workflow deployment, an agent's answer": get("flow", run_id),
            "no such run": get("open", "run_0"),
        }
        no_conversation = get("open", run_id, None)
        no_deployment = get("nowhere", run_id)

    for why, response in refused.items():
        assert response.status_code == 404, why
        assert response.json()["error"]["field"] == "run_id", why
    assert no_conversation.status_code == 422
    assert no_conversation.json()["error"]["field"] == "conversationId"
    assert (no_deployment.status_code, no_deployment.json()["error"]["field"]) == (404, "slug")


def test_an_eventsource_opts_in_with_a_query_parameter(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=10) as client:
        answered, posted = ask(client, "open", headers=V1)
        run_id = answered.headers["x-run-id"]
        params = {
            "conversationId": answered.headers["x-conversation-id"],
            "protocol": "agent-events-v1",
        }
        followed = client.get(f"/api/chat/open/runs/{run_id}/stream", params=params)

    assert [e.json() for e in sse(followed)] == posted
    assert followed.headers["x-sim-stream-protocol"] == "agent-events-v1"
