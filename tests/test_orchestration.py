"""Orchestrations over real HTTP: a coordinator delegating to entity agents, in parallel or in
sequence, with a failing entity, a cancel, and replay."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agentstream.agents import AgentSpec, StoredAgent
from agentstream.errors import ProviderError
from agentstream.events import BaseEvent, RunCompleted, RunStarted, TextDelta
from agentstream.providers.base import (
    ModelPart,
    ModelRequest,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
)
from agentstream.providers.offline import tokens
from agentstream.providers.scripted import ScriptedModel
from agentstream.runlog import LogSubscription, RunLog
from agentstream.runtime.context import RunContext
from agentstream.runtime.orchestration import delegate_tools
from agentstream.runtime.ports import StartedRun
from agentstream.runtime.tools import Tool
from agentstream.sse import SSEDecoder
from agentstream.views.native import NativeFrameAdapter
from conftest import (
    LiveServer,
    make_settings,
    read_events,
    serve,
    stream_frames,
    wait_until,
)
from fakes.test_app import call_wait_then_answer, wait

ALPHA = "Alpha reporting: the north wall is sound and the gate is shut."
BETA = "Beta reporting: the south field is dry and the well is full."
DELTAS = ("content_delta", "reasoning_delta", "entity_chunk")
Frame = dict[str, Any]


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def answers(text: str) -> Callable[[ModelRequest], list[ModelPart]]:
    """A model that answers ``text``, a word at a time."""
    return lambda request: [*(TextPart(token) for token in tokens(text)), TurnEndPart("end_turn")]


def calls(name: str, arguments: dict[str, Any]) -> list[ModelPart]:
    call_id = f"call_{name}"
    return [
        ToolCallStartPart(call_id, name),
        ToolCallArgsPart(call_id, json.dumps(arguments)),
        ToolCallEndPart(call_id),
        TurnEndPart("tool_calls"),
    ]


def relay(request: ModelRequest) -> list[ModelPart]:
    """A coordinator that asks alpha, hands alpha's answer on to beta, then answers."""
    results = [json.loads(m.content) for m in request.messages if m.role == "tool"]
    if not results:
        return calls("delegate_to_alpha", {"task": "Check the north."})
    if len(results) == 1:
        return calls("delegate_to_beta", {"task": f"Alpha said: {results[0]}"})
    return [TextPart("Both checked in."), TurnEndPart("end_turn")]


def broken(request: ModelRequest) -> list[ModelPart]:
    raise ProviderError("model down", provider="fake", kind="server")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    agents = [
        AgentSpec(id="alpha", model="alpha-model"),
        AgentSpec(id="beta", model="beta-model"),
        AgentSpec(id="broken", model="broken-model"),
        AgentSpec(id="slow-a", model="scripted-wait", tools=["wait"]),
        AgentSpec(id="slow-b", model="scripted-wait", tools=["wait"]),
        AgentSpec(id="duo", delegates=["alpha", "beta"]),
        AgentSpec(id="relay", model="relay", delegates=["alpha", "beta"]),
        AgentSpec(id="shaky", delegates=["alpha", "broken"]),
        AgentSpec(id="stuck", delegates=["slow-a", "slow-b"]),
    ]
    models = [
        ScriptedModel("alpha-model", answers(ALPHA), delay=0.04),
        ScriptedModel("beta-model", answers(BETA), delay=0.04),
        ScriptedModel("broken-model", broken),
        ScriptedModel("scripted-wait", call_wait_then_answer),
        ScriptedModel("relay", relay),
    ]
    with serve(
        make_settings(tmp_path), tools=[Tool.from_function(wait)], models=models, agents=agents
    ) as server:
        yield server


def collapse(frames: list[Frame]) -> list[Frame]:
    """Join runs of consecutive deltas of one kind (and one entity run) into one frame."""
    out: list[Frame] = []
    for (kind, _), group in itertools.groupby(
        frames, key=lambda f: (f["event"], f.get("entity_run_id"))
    ):
        items = list(group)
        if kind in DELTAS:
            out.append({**items[0], "delta": "".join(f["delta"] for f in items)})
        else:
            out += items
    return out


def where(frames: list[Frame], event: str, entity: str | None = None) -> list[int]:
    """The positions of the ``event`` frames (about ``entity``, if given)."""
    return [
        i
        for i, f in enumerate(frames)
        if f["event"] == event and (entity is None or f.get("entity") == entity)
    ]


def only(frames: list[Frame], event: str, entity: str) -> Frame:
    [index] = where(frames, event, entity)
    return frames[index]


def get_run(live: LiveServer, run_id: str) -> dict[str, Any]:
    with live.client() as client:
        run: dict[str, Any] = client.get(f"/api/agents/runs/{run_id}").json()
    return run


def test_parallel_entities_stream_interleaved(live: LiveServer) -> None:
    ids, frames = stream_frames(live, "duo", {"message": "Report in.", "reasoning": False})

    for seq, frame in zip(ids, frames, strict=True):
        model = type(NativeFrameAdapter.validate_python({"seq": seq, **frame}))
        assert {"seq", *frame} == set(model.model_fields), "exactly the documented keys"
    assert where(frames, "complete") == [len(frames) - 1], "one complete, last"
    assert max(where(frames, "delegation_start")) < min(where(frames, "delegation_complete")), (
        "both entities run at once"
    )
    for entity, answer in (("alpha", ALPHA), ("beta", BETA)):
        start = only(frames, "delegation_start", entity)
        chunks = where(frames, "entity_chunk", entity)
        assert start["task"] == "Report in."
        assert where(frames, "delegation_start", entity)[0] < chunks[0], "started, then streams"
        assert {frames[i]["entity_run_id"] for i in chunks} == {start["entity_run_id"]}
        assert "".join(frames[i]["delta"] for i in chunks) == answer
        assert chunks[-1] < where(frames, "delegation_complete", entity)[0]
        assert only(frames, "delegation_complete", entity) == {
            "event": "delegation_complete",
            "entity": entity,
            "entity_run_id": start["entity_run_id"],
            "status": "completed",
            "content": answer,
            "error": None,
        }
        [result] = [f for f in frames if f.get("tool_name") == f"delegate_to_{entity}"][1:]
        assert (result["event"], result["status"], result["result"]) == (
            "tool_result",
            "success",
            answer,
        )
    speakers = [frames[i]["entity"] for i in where(frames, "entity_chunk")]
    assert len(list(itertools.groupby(speakers))) > 2, "the entities' text interleaves"
    assert frames[-1]["content"] == f"alpha: {ALPHA} beta: {BETA}"


def test_sequential_delegation_passes_one_answer_on(live: LiveServer) -> None:
    _, frames = stream_frames(live, "relay", {"message": "Check everything."})

    alpha_run = only(frames, "delegation_start", "alpha")["entity_run_id"]
    beta_run = only(frames, "delegation_start", "beta")["entity_run_id"]
    run_id = frames[0]["run_id"]
    handed_on = f"Alpha said: {ALPHA}"
    assert collapse(frames) == [
        {"event": "start", "run_id": run_id, "session_id": frames[0]["session_id"]},
        {"event": "step_started", "step": 1},
        {
            "event": "tool_call",
            "tool_call_id": "call_delegate_to_alpha",
            "tool_name": "delegate_to_alpha",
            "arguments": {"task": "Check the north."},
        },
        {
            "event": "delegation_start",
            "entity": "alpha",
            "entity_run_id": alpha_run,
            "task": "Check the north.",
        },
        {"event": "entity_chunk", "entity": "alpha", "entity_run_id": alpha_run, "delta": ALPHA},
        {
            "event": "delegation_complete",
            "entity": "alpha",
            "entity_run_id": alpha_run,
            "status": "completed",
            "content": ALPHA,
            "error": None,
        },
        {
            "event": "tool_result",
            "tool_call_id": "call_delegate_to_alpha",
            "tool_name": "delegate_to_alpha",
            "result": ALPHA,
            "status": "success",
        },
        {"event": "step_completed", "step": 1},
        {"event": "step_started", "step": 2},
        {
            "event": "tool_call",
            "tool_call_id": "call_delegate_to_beta",
            "tool_name": "delegate_to_beta",
            "arguments": {"task": handed_on},
        },
        {
            "event": "delegation_start",
            "entity": "beta",
            "entity_run_id": beta_run,
            "task": handed_on,
        },
        {"event": "entity_chunk", "entity": "beta", "entity_run_id": beta_run, "delta": BETA},
        {
            "event": "delegation_complete",
            "entity": "beta",
            "entity_run_id": beta_run,
            "status": "completed",
            "content": BETA,
            "error": None,
        },
        {
            "event": "tool_result",
            "tool_call_id": "call_delegate_to_beta",
            "tool_name": "delegate_to_beta",
            "result": BETA,
            "status": "success",
        },
        {"event": "step_completed", "step": 2},
        {"event": "step_started", "step": 3},
        {"event": "content_delta", "delta": "Both checked in."},
        {"event": "step_completed", "step": 3},
        {
            "event": "complete",
            "run_id": run_id,
            "content": "Both checked in.",
            "usage": frames[-1]["usage"],
        },
    ]
    assert get_run(live, beta_run)["input"] == handed_on, "the entity ran on the task it was given"


def test_a_failing_entity_is_a_tool_error_the_coordinator_reads(live: LiveServer) -> None:
    _, frames = stream_frames(live, "shaky", {"message": "Report in."})

    failed = only(frames, "delegation_complete", "broken")
    assert failed == {
        "event": "delegation_complete",
        "entity": "broken",
        "entity_run_id": failed["entity_run_id"],
        "status": "error",
        "content": None,
        "error": "model down",
    }
    [result] = [f for f in frames if f.get("tool_name") == "delegate_to_broken"][1:]
    assert result["status"] == "error"
    assert "model down" in result["result"]
    assert only(frames, "delegation_complete", "alpha")["status"] == "completed"
    assert frames[-1]["event"] == "complete"
    assert frames[-1]["content"] == f"alpha: {ALPHA} broken could not answer."
    entity_run = get_run(live, failed["entity_run_id"])
    assert (entity_run["status"], entity_run["error"]) == ("error", "model down")
    assert get_run(live, frames[0]["run_id"])["status"] == "completed"


def test_cancel_stops_every_entity(live: LiveServer) -> None:
    with (
        live.client() as client,
        client.stream("POST", "/api/agents/stuck/run/stream", json={"message": "go"}) as response,
    ):
        stream = frames_of(response)
        frames: list[Frame] = []
        for frame in stream:
            frames.append(frame)
            if len(where(frames, "delegation_start")) == 2:
                break
        entity_runs = [frames[i]["entity_run_id"] for i in where(frames, "delegation_start")]
        wait_until(lambda: all(in_tool(live, run_id) for run_id in entity_runs))
        cancel = client.post(f"/api/agents/runs/{frames[0]['run_id']}/cancel")
        frames += stream

    assert cancel.json() == {"run_id": frames[0]["run_id"], "status": "cancelled"}
    ending = where(frames, "delegation_complete")[0]
    assert max(where(frames, "entity_chunk")) < ending, "no entity streams after the cancel"
    tail = [(f["event"], f.get("entity"), f["status"]) for f in frames[ending:]]
    assert sorted(tail[:2]) == [
        ("delegation_complete", "slow-a", "cancelled"),
        ("delegation_complete", "slow-b", "cancelled"),
    ]
    assert tail[2:] == [
        ("tool_result", None, "cancelled"),
        ("tool_result", None, "cancelled"),
        ("error", None, "cancelled"),
    ]
    coordinator = get_run(live, frames[0]["run_id"])
    assert coordinator["status"] == "cancelled"
    assert [(c["name"], c["status"]) for c in coordinator["tool_calls"]] == [
        ("delegate_to_slow-a", "cancelled"),
        ("delegate_to_slow-b", "cancelled"),
    ]
    for run_id in entity_runs:
        entity = get_run(live, run_id)  # at once: the coordinator waited for its entities
        assert (entity["status"], entity["error"]) == (
            "cancelled",
            "Cancelled with its coordinator's run",
        )
        assert [(c["name"], c["status"]) for c in entity["tool_calls"]] == [("wait", "cancelled")]
        with live.client() as client:
            after = entity["events"][-1]["seq"]
            rest = client.get(f"/api/agents/runs/{run_id}/stream", params={"after": after})
        assert rest.status_code == 204, "the entity's run has nothing more to stream"


def frames_of(response: httpx.Response) -> Iterator[Any]:
    """The frames of a streaming response, as they arrive: each a ``Frame``, but for the
    closing ``"[DONE]"`` of the chat protocols."""
    decoder = SSEDecoder()
    for chunk in response.iter_bytes():
        for sse in decoder.feed(chunk):
            yield sse.json()


def in_tool(live: LiveServer, run_id: str) -> bool:
    """The entity run is going, inside its tool call."""
    run = get_run(live, run_id)
    return run["status"] == "running" and [c["status"] for c in run["tool_calls"]] == [None]


def said(frames: list[Frame]) -> dict[str, str]:
    """What each delegation's entity said, as a client joining entity_chunk frames has it."""
    texts: dict[str, str] = {}
    for frame in frames:
        if frame["event"] == "entity_chunk":
            run_id = frame["entity_run_id"]
            texts[run_id] = texts.get(run_id, "") + frame["delta"]
    return texts


def test_replay_shows_what_each_entity_said_once(tmp_path: Path) -> None:
    """Live, each entity's text comes once, as deltas; the record and the replay stream
    (once the live log is gone: another server on the same store) have its final-turn text
    whole, one entity_chunk per delegation, where the delegation's deltas would have been:
    an entity's preamble is never persisted, as the run's own is not."""
    question = {"message": "What is 6 * 7 and what time is it?"}
    with serve(make_settings(tmp_path)) as first:
        ids, frames = stream_frames(first, "team", question)
    live_said = said(frames)
    assert sorted(live_said.values())[0] == "Let me use the calculator tool.\n\nThe answer is 42."
    assert len(live_said) == 2
    assert all(text.startswith("Let me use the ") for text in live_said.values())

    run_id = frames[0]["run_id"]
    with serve(make_settings(tmp_path)) as second:
        run = get_run(second, run_id)
        with (
            second.client() as client,
            client.stream("GET", f"/api/agents/runs/{run_id}/stream") as response,
        ):
            replayed = [sse.json() for sse in read_events(response)]
        entity_runs = [
            get_run(second, e["entity_run_id"])
            for e in run["events"]
            if e["event"] == "delegation_complete"
        ]

    assert replayed == run["events"], "the replay stream is the record's events"
    assert said(run["events"]) == {
        entity_run_id: text.split("\n\n")[-1] for entity_run_id, text in live_said.items()
    }
    assert "Let me use" not in str(run["events"])
    assert [e["event"] for e in run["events"]].count("entity_chunk") == 2
    streamed = [
        {"seq": seq, **frame}
        for seq, frame in zip(ids, frames, strict=True)
        if frame["event"] not in (*DELTAS, "preamble")
    ]
    assert [e for e in run["events"] if e["event"] != "entity_chunk"] == streamed
    for chunk in (e for e in run["events"] if e["event"] == "entity_chunk"):
        complete = only(run["events"], "delegation_complete", chunk["entity"])
        assert chunk["seq"] < complete["seq"], "what it said, then how it ended"
        assert chunk["delta"].endswith(complete["content"])
    assert run["content"].startswith("mathematician: The answer is 42. timekeeper: The current")
    for entity_run in entity_runs:
        complete = only(run["events"], "delegation_complete", entity_run["agent_id"])
        assert (entity_run["status"], entity_run["content"]) == ("completed", complete["content"])


def test_public_chat_shows_delegations_only_as_tool_calls(live: LiveServer) -> None:
    with live.client() as client:
        deployment = {"slug": "duo-chat", "agent_id": "duo", "include_tool_calls": True}
        assert client.post("/api/chat-deployments", json=deployment).status_code == 201
        with client.stream(
            "POST",
            "/api/chat/duo-chat",
            json={"input": "Report in."},
            headers={"X-Sim-Stream-Protocol": "agent-events-v1"},
        ) as response:
            frames = list(frames_of(response))

    *shown, final, done = frames
    assert done == "[DONE]"
    tools = [(f["phase"], f["name"]) for f in shown if f.get("event") == "tool"]
    assert sorted(tools) == [
        ("end", "delegate_to_alpha"),
        ("end", "delegate_to_beta"),
        ("start", "delegate_to_alpha"),
        ("start", "delegate_to_beta"),
    ]
    text = [f for f in shown if f.get("event") != "tool"]
    answer = f"alpha: {ALPHA} beta: {BETA}"
    assert "".join(f.get("chunk", "") for f in text if f.get("event") is None).endswith(answer)
    assert {f.get("event") for f in text} <= {None, "chunk_reset"}, "no entity frames"
    assert all(set(f) <= {"blockId", "chunk", "event"} for f in text)
    assert final["data"]["output"]["content"] == answer


def test_a_deployed_orchestration_keeps_the_entities_it_was_deployed_with(
    server: LiveServer,
) -> None:
    def ask() -> str:
        with client.stream("POST", "/api/chat/team-chat", json={"input": "6 * 7"}) as response:
            *_, final, _done = frames_of(response)
        content: str = final["data"]["output"]["content"]
        return content

    with server.client() as client:
        deployment = {"slug": "team-chat", "agent_id": "team"}
        assert client.post("/api/chat-deployments", json=deployment).status_code == 201
        assert ask().startswith("mathematician: The answer is 42.")

        changed = client.patch("/api/agents/mathematician", json={"tools": []})
        assert changed.status_code == 200
        assert ask().startswith("mathematician: The answer is 42."), "pinned: no redeploy yet"

        assert client.post("/api/chat-deployments/team-chat/redeploy").status_code == 200
        assert not ask().startswith("mathematician: The answer is 42.")


def test_delegations_must_end(live: LiveServer) -> None:
    with live.client() as client:
        itself = client.post("/api/agents", json={"id": "narcissus", "delegates": ["narcissus"]})
        client.post("/api/agents", json={"id": "ping", "delegates": ["pong"]})
        missing = client.post("/api/agents/ping/run/stream", json={"message": "go"})
        client.post("/api/agents", json={"id": "pong", "delegates": ["ping"]})
        loop = client.post("/api/agents/ping/run/stream", json={"message": "go"})

    assert itself.status_code == 422
    assert "cannot delegate to itself" in itself.text
    assert missing.status_code == 404
    assert (
        missing.json()["error"]["message"]
        == "Agent 'ping' delegates to 'pong', which does not exist"
    )
    assert loop.status_code == 422
    assert loop.json()["error"]["message"] == (
        "Agent 'ping' delegates to 'pong', which delegates back to it"
    )


class OneFinishedRun:
    """``Runs`` whose every delegation is one run that already said ``answer``."""

    def __init__(self, answer: str) -> None:
        self.log = RunLog()
        self.log.open("run_e")
        for event in (
            RunStarted(run_id="run_e", seq=1, ts=0.0, agent_id="e", session_id="ses_e"),
            TextDelta(run_id="run_e", seq=2, ts=0.0, step=1, delta=answer),
            RunCompleted(run_id="run_e", seq=3, ts=0.0, content=answer),
        ):
            self.log.append(event)
        self.log.close("run_e")

    async def start(
        self, agent: StoredAgent, message: str, *, parent_run_id: str | None = None
    ) -> StartedRun:
        return StartedRun(run_id="run_e", session_id="ses_e")

    def subscribe(self, run_id: str) -> LogSubscription:
        return self.log.subscribe(run_id)

    def cancel(self, run_id: str, reason: str) -> anyio.Event | None:
        return None

    async def cancel_paused(self, run_id: str) -> bool:
        return False


@pytest.mark.anyio
async def test_a_delegation_hands_over_what_comes_at_once_together() -> None:
    """What the coordinator's run shows of a batch of the entity's events goes in one
    hand-over, and the delegation's answer with its end in one more: one write each."""
    batches: list[list[str]] = []

    async def sink(events: Sequence[BaseEvent]) -> None:
        batches.append([type(event).__name__ for event in events])

    entity = StoredAgent(spec=AgentSpec(id="e"), version=1, created_at=NOW, updated_at=NOW)
    ctx = RunContext("run_c", sink=sink)
    (tool,) = delegate_tools(OneFinishedRun("42."), ctx, {"e": entity})
    outcome = await tool.call({"task": "the answer"})
    assert outcome.result == "42."
    assert batches == [
        ["DelegationStarted", "EntityChunk"],
        ["EntityText", "DelegationCompleted"],
    ]
