"""A chat deployment that serves a workflow: its output blocks are the answer, one after
the other, with the public chat's rules (header, toggles, no tool arguments)."""

from __future__ import annotations

import json
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from agentstream.events import (
    BlockCompleted,
    BlockOutput,
    BlockStarted,
    Emitted,
    Event,
    RunCompleted,
    RunFailed,
    RunStarted,
    StepStarted,
    Text,
    TextDelta,
    TextRetracted,
    ToolCall,
    ToolResult,
)
from agentstream.views.chat import ChatPolicy, ChatView
from agentstream.views.frames import as_dict
from conftest import LiveServer, read_events

META: dict[str, Any] = {"run_id": "wfx_1", "ts": 0.0}


def events(*made: Emitted) -> list[Event]:
    return [
        cast(Event, kind(**META, seq=seq, **fields)) for seq, (kind, fields) in enumerate(made, 1)
    ]


# Two output blocks in parallel: "b" streams while "a" is still going, and "a" retracts a
# preamble before its answer. A third block, "hidden", is not an output block.
PARALLEL = events(
    (RunStarted, {"workflow_id": "w"}),
    (BlockStarted, {"block_id": "a", "block_type": "agent"}),
    (BlockStarted, {"block_id": "b", "block_type": "agent"}),
    (TextDelta, {"block_id": "a", "step": 1, "delta": "Let me check."}),
    (TextDelta, {"block_id": "b", "step": 1, "delta": "Bee "}),
    (TextDelta, {"block_id": "hidden", "step": 1, "delta": "secret"}),
    (TextRetracted, {"block_id": "a", "step": 1, "text": "Let me check."}),
    (ToolCall, {"block_id": "a", "step": 1, "call_id": "c1", "tool_name": "calculator",
                "arguments": {"expression": "6*7"}}),
    (ToolResult, {"block_id": "a", "step": 1, "call_id": "c1", "tool_name": "calculator",
                  "status": "success", "result": 42}),
    (TextDelta, {"block_id": "b", "step": 1, "delta": "done."}),
    (Text, {"block_id": "b", "step": 1, "text": "Bee done."}),
    (BlockOutput, {"block_id": "b", "output": {"content": "Bee done."}}),
    (BlockCompleted, {"block_id": "b"}),
    (TextDelta, {"block_id": "a", "step": 2, "delta": "42."}),
    (Text, {"block_id": "a", "step": 2, "text": "42."}),
    (BlockOutput, {"block_id": "a", "output": {"content": "42."}}),
    (BlockCompleted, {"block_id": "a"}),
    (RunCompleted, {"result": {"x": 1}}),
)  # fmt: skip


def render(policy: ChatPolicy, stream: list[Event]) -> list[dict[str, Any]]:
    view = ChatView(policy, output_blocks=["a", "b"], conversation_id="cnv")
    return [as_dict(frame) for event in stream for frame in view.frames(event)]


@st.composite
def interleaved(draw: st.DrawFn) -> list[Event]:
    """Blocks "a" and "b" (output blocks) and "hidden", their events in any order: steps,
    tokens (some empty), retractions, settled texts, outputs; each block completes once."""
    made: list[Emitted] = [(RunStarted, {"workflow_id": "w"})]
    ended: set[str] = set()
    moves = st.sampled_from(["step", "token", "token", "token", "retract", "text", "end"])
    for block_id, move in draw(
        st.lists(st.tuples(st.sampled_from(["a", "b", "hidden"]), moves), max_size=40)
    ):
        if block_id in ended:
            continue
        text = draw(st.sampled_from(["", "x", "é ", "\n\n"]))
        scope = {"block_id": block_id, "step": 1}
        if move == "step":
            made.append((StepStarted, scope))
        elif move == "token":
            made.append((TextDelta, {**scope, "delta": text}))
        elif move == "retract":
            made.append((TextRetracted, {**scope, "text": text}))
        elif move == "text":
            made.append((Text, {**scope, "text": text}))
        else:
            ended.add(block_id)
            made.append((BlockOutput, {"block_id": block_id, "output": {"content": text}}))
            made.append((BlockCompleted, {"block_id": block_id}))
    return events(*made, (RunCompleted, {"result": {}}))


policies = st.builds(
    ChatPolicy,
    protocol_v1=st.booleans(),
    include_thinking=st.booleans(),
    redact=st.sampled_from([None, str.upper]),
)


@settings(max_examples=300)
@given(interleaved(), policies)
def test_a_token_written_at_once_is_the_frame_the_held_path_makes(
    stream: list[Event], policy: ChatPolicy
) -> None:
    """A token of the current block whose text shows already goes out at once, from the
    block's template; in every order and policy, the frames are the ones a view that
    holds every frame back and releases it would send."""
    held = ChatView(policy, output_blocks=["a", "b"], conversation_id="cnv")
    held._showing = lambda event: None  # type: ignore[method-assign]
    assert render(policy, stream) == [as_dict(f) for e in stream for f in held.frames(e)]


def test_output_blocks_stream_one_after_the_other_live() -> None:
    frames = render(ChatPolicy(protocol_v1=True, include_tool_calls=True), PARALLEL)
    assert frames == [
        {"blockId": "a", "chunk": "Let me check."},
        {"blockId": "a", "event": "chunk_reset"},
        {"blockId": "a", "event": "tool", "phase": "start", "id": "c1", "name": "calculator"},
        {
            "blockId": "a",
            "event": "tool",
            "phase": "end",
            "id": "c1",
            "name": "calculator",
            "status": "success",
        },
        {"blockId": "a", "chunk": "42."},
        # b ran alongside; its frames were held until a ended.
        {"blockId": "b", "chunk": "\n\nBee "},
        {"blockId": "b", "chunk": "done."},
        {
            "event": "final",
            "data": {
                "success": True,
                "conversationId": "cnv",
                "output": {
                    "content": "42.\n\nBee done.",
                    "toolCalls": [{"id": "c1", "name": "calculator", "status": "success"}],
                },
            },
        },
    ]


def test_without_the_header_only_settled_text_and_no_tool_frames() -> None:
    frames = render(ChatPolicy(protocol_v1=False, include_tool_calls=True), PARALLEL)
    assert frames[:-1] == [
        {"blockId": "a", "chunk": "42."},
        {"blockId": "b", "chunk": "\n\nBee done."},
    ]
    assert frames[-1]["event"] == "final"


def test_a_block_with_no_stream_answers_with_its_output_and_errors_stay_generic() -> None:
    stream = events(
        (BlockOutput, {"block_id": "a", "output": {"text": "From a template."}}),
        (BlockCompleted, {"block_id": "a"}),
        (
            RunFailed,
            {"status": "error", "message": "block 'b' failed: KeyError at /srv/app.py:12"},
        ),
    )
    frames = render(ChatPolicy(protocol_v1=True), stream)
    assert frames[0] == {"blockId": "a", "chunk": "From a template."}
    assert frames[1]["event"] == "error"
    assert "KeyError" not in frames[1]["error"]


def test_redaction_masks_every_text_and_forwards_nothing_live() -> None:
    def redact(text: str) -> str:
        return text.replace("Bee", "[REDACTED]")

    frames = render(ChatPolicy(protocol_v1=True, redact=redact), PARALLEL)
    assert {"blockId": "a", "chunk": "Let me check."} not in frames
    assert "Bee" not in json.dumps(frames)
    assert frames[-1]["data"]["output"]["content"] == "42.\n\n[REDACTED] done."


def chat(live: LiveServer, slug: str, headers: dict[str, str]) -> list[Any]:
    with (
        live.client() as client,
        client.stream(
            "POST", f"/api/chat/{slug}", json={"input": "17 * 23"}, headers=headers
        ) as response,
    ):
        assert response.status_code == 200, response.read()
        return [json.loads(event.data) for event in read_events(response)]


def test_the_demo_workflow_deployment_answers_over_http(server: LiveServer) -> None:
    frames = chat(server, "two-questions", {"X-Sim-Stream-Protocol": "agent-events-v1"})
    assert frames[-1] == "[DONE]"
    final = frames[-2]
    assert final["event"] == "final"
    content = final["data"]["output"]["content"]
    arithmetic, clock = content.split("\n\n")
    assert arithmetic == "The answer is 391."
    assert clock.startswith("The current time is")

    shown: dict[str, str] = {}  # what a client shows, by block: a reset takes back its own
    for frame in frames[:-2]:
        if frame.get("event") == "chunk_reset":
            shown[frame["blockId"]] = ""
        elif "chunk" in frame:
            shown[frame["blockId"]] = shown.get(frame["blockId"], "") + frame["chunk"]
    assert "".join(shown.values()) == content
    block_order = [f["blockId"] for f in frames[:-2] if "blockId" in f]
    assert block_order == sorted(block_order, key=["arithmetic", "clock"].index)
    tools = [f for f in frames if isinstance(f, dict) and f.get("event") == "tool"]
    assert {t["name"] for t in tools} == {"calculator", "current_time"}
    assert all(set(t) <= {"blockId", "event", "phase", "id", "name", "status"} for t in tools)


def test_deploying_a_workflow_checks_its_output_blocks(server: LiveServer) -> None:
    with server.client() as client:
        body = {"slug": "wf-bad", "workflow_id": "demo-parallel", "output_blocks": ["nope"]}
        refused = client.post("/api/chat-deployments", json=body)
        assert refused.status_code == 422
        assert refused.json()["error"]["field"] == "output_blocks"

        for bad in [
            {"slug": "wf-none"},
            {"slug": "wf-both", "agent_id": "demo", "workflow_id": "demo-parallel"},
            {"slug": "wf-empty", "workflow_id": "demo-parallel"},
        ]:
            response = client.post("/api/chat-deployments", json=bad)
            assert response.status_code == 422, bad

        made = client.post(
            "/api/chat-deployments",
            json={"slug": "wf-ok", "workflow_id": "demo-parallel", "output_blocks": ["report"]},
        )
        assert made.status_code == 201, made.text
        assert made.json()["workflow_version"] == 1
        assert made.json()["agent_version"] is None
        assert client.get("/api/chat/wf-ok").json()["title"] == "Two questions at once"


def test_a_template_output_block_answers_legacy_clients(server: LiveServer) -> None:
    slug = "report-only"
    with server.client() as client:
        client.post(
            "/api/chat-deployments",
            json={"slug": slug, "workflow_id": "demo-parallel", "output_blocks": ["report"]},
        ).raise_for_status()
    frames = chat(server, slug, {})
    chunks = [f for f in frames if isinstance(f, dict) and "chunk" in f]
    assert len(chunks) == 1
    assert chunks[0]["chunk"].startswith("The answer is 391.\nThe current time is")
    assert frames[-2]["data"]["output"]["content"] == chunks[0]["chunk"]
