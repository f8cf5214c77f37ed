"""The canvas execution-events view (spec 000 "Canvas (draft Run)"): frame shapes for every
workflow event, order, the PII redaction rule, tool secrecy and the thinking cap."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentstream.agents import AgentSpec
from agentstream.events import (
    BaseEvent,
    BlockCompleted,
    BlockError,
    BlockOutput,
    BlockSkipped,
    BlockStarted,
    Event,
    Reasoning,
    ReasoningDelta,
    RunCompleted,
    RunFailed,
    RunStarted,
    Text,
    TextDelta,
    TextRetracted,
    ToolCall,
    ToolResult,
)
from agentstream.providers.catalog import load_catalog
from agentstream.providers.registry import ModelRegistry
from agentstream.runtime.blocks import RuntimeAgentRunner
from agentstream.runtime.builtin_tools import BUILTIN_TOOLS
from agentstream.runtime.context import RunContext
from agentstream.runtime.executions import terminal
from agentstream.runtime.tools import ToolRegistry
from agentstream.server.streams import encode_events
from agentstream.sse import SSEDecoder
from agentstream.views.canvas import LIVE_ONLY, CanvasPolicy, CanvasView
from agentstream.views.chat import THINKING_CAP
from agentstream.workflows import WorkflowEngine, parse_workflow

EXE = "wfx_1"
TS = 1_700_000_000.25
STAMP = "2023-11-14T22:13:20.250Z"


class Events:
    """Builds an execution's events with consecutive seqs."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: type[BaseEvent], **fields: Any) -> Event:
        self.seq += 1
        return cast(Event, kind(run_id=EXE, seq=self.seq, ts=TS, **fields))


def render(events: list[Event], policy: CanvasPolicy | None = None) -> list[Any]:
    view = CanvasView(workflow_id="wf", policy=policy)
    return [frame for event in events for frame in view.frames(event)]


def frame(kind: str, seq: int, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": kind,
        "timestamp": STAMP,
        "executionId": EXE,
        "workflowId": "wf",
        "eventId": seq,
        "data": data,
    }


def agent_block(e: Events, block_id: str, *, answer: str = "Hi there") -> list[Event]:
    """A live agent block: preamble text retracted, a tool call, thinking, then the answer."""
    return [
        e(BlockStarted, block_id=block_id, block_type="agent"),
        e(TextDelta, block_id=block_id, step=1, delta="Let me look."),
        e(TextRetracted, block_id=block_id, step=1, text="Let me look."),
        e(
            ToolCall,
            block_id=block_id,
            step=1,
            call_id="c1",
            tool_name="calculator",
            arguments={"expression": "SECRET_ARG"},
        ),
        e(
            ToolResult,
            block_id=block_id,
            step=1,
            call_id="c1",
            tool_name="calculator",
            status="success",
            result="SECRET_RESULT",
        ),
        e(ReasoningDelta, block_id=block_id, step=2, delta="Mail bob@example.com "),
        e(ReasoningDelta, block_id=block_id, step=2, delta="now."),
        e(Reasoning, block_id=block_id, step=2, text="Mail bob@example.com now."),
        e(TextDelta, block_id=block_id, step=2, delta=answer[:3]),
        e(TextDelta, block_id=block_id, step=2, delta=answer[3:]),
        e(Text, block_id=block_id, step=2, text=answer),
        e(BlockOutput, block_id=block_id, output={"content": answer}),
        e(BlockCompleted, block_id=block_id),
    ]


def test_every_event_of_a_live_agent_block_and_the_execution() -> None:
    e = Events()
    events = [
        e(RunStarted, workflow_id="wf"),
        e(BlockStarted, block_id="start", block_type="start"),
        e(BlockOutput, block_id="start", output={"input": "hi"}),
        e(BlockCompleted, block_id="start"),
        *agent_block(e, "ask"),
        e(BlockSkipped, block_id="other"),
        e(RunCompleted, result={"answer": "Hi there"}),
    ]
    assert render(events) == [
        frame("execution:started", 1, {}),
        frame("block:started", 2, {"blockId": "start", "blockType": "start"}),
        frame("block:completed", 4, {"blockId": "start", "output": {"input": "hi"}}),
        frame("block:started", 5, {"blockId": "ask", "blockType": "agent"}),
        frame("stream:chunk", 6, {"blockId": "ask", "chunk": "Let me look."}),
        frame("stream:chunk_reset", 7, {"blockId": "ask"}),
        frame(
            "stream:tool", 8, {"blockId": "ask", "phase": "start", "id": "c1", "name": "calculator"}
        ),
        frame(
            "stream:tool",
            9,
            {
                "blockId": "ask",
                "phase": "end",
                "id": "c1",
                "name": "calculator",
                "status": "success",
            },
        ),
        frame("stream:thinking", 10, {"blockId": "ask", "text": "Mail bob@example.com "}),
        frame("stream:thinking", 11, {"blockId": "ask", "text": "now."}),
        frame("stream:chunk", 13, {"blockId": "ask", "chunk": "Hi "}),
        frame("stream:chunk", 14, {"blockId": "ask", "chunk": "there"}),
        frame("stream:done", 16, {"blockId": "ask"}),
        frame("block:completed", 17, {"blockId": "ask", "output": {"content": "Hi there"}}),
        frame("block:skipped", 18, {"blockId": "other"}),
        frame("execution:completed", 19, {"result": {"answer": "Hi there"}}),
    ]


def test_errors_and_cancellation() -> None:
    e = Events()
    events = [
        e(RunStarted, workflow_id="wf"),
        e(BlockStarted, block_id="fetch", block_type="http"),
        e(BlockError, block_id="fetch", error="HTTP 500", handled=True),
        e(BlockStarted, block_id="calc", block_type="function"),
        e(BlockError, block_id="calc", error="division by zero", handled=False),
        e(
            RunFailed,
            status="error",
            message="Block 'calc' failed: division by zero",
            failed_block="calc",
        ),
    ]
    assert render(events) == [
        frame("execution:started", 1, {}),
        frame("block:started", 2, {"blockId": "fetch", "blockType": "http"}),
        frame("block:error", 3, {"blockId": "fetch", "error": "HTTP 500", "handled": True}),
        frame("block:started", 4, {"blockId": "calc", "blockType": "function"}),
        frame("block:error", 5, {"blockId": "calc", "error": "division by zero", "handled": False}),
        frame(
            "execution:error",
            6,
            {"error": "Block 'calc' failed: division by zero", "blockId": "calc"},
        ),
    ]
    e = Events()
    cancelled = [
        e(RunStarted, workflow_id="wf"),
        e(RunFailed, status="error", message="Internal error"),
    ]
    assert render(cancelled)[1] == frame("execution:error", 2, {"error": "Internal error"})
    e = Events()
    stopped = [e(RunStarted, workflow_id="wf"), e(RunFailed, status="cancelled", message="Stopped")]
    assert render(stopped)[1] == frame("execution:cancelled", 2, {"reason": "Stopped"})
    for status in ("timeout", "interrupted"):  # not somebody's cancel: an error
        e = Events()
        ended = [
            e(RunStarted, workflow_id="wf"),
            e(RunFailed, status=status, message="Late"),
        ]
        assert render(ended)[1] == frame("execution:error", 2, {"error": "Late"})


def test_a_reset_with_nothing_streamed_and_an_output_less_completion_send_nothing_extra() -> None:
    e = Events()
    events = [
        e(BlockStarted, block_id="b", block_type="agent"),
        e(TextRetracted, block_id="b", step=1, text=""),
        e(TextDelta, block_id="b", step=1, delta=""),
        e(BlockCompleted, block_id="b"),
    ]
    assert [f["type"] for f in render(events)] == ["block:started", "block:completed"]
    assert render(events)[-1]["data"] == {"blockId": "b"}


def test_replay_shows_assembled_thinking_once_per_segment_on_its_own_paragraph() -> None:
    """Replay has only persisted events: no deltas, so the assembled segments are shown; live,
    a segment that went out as deltas is not repeated, and the next starts a new paragraph."""
    e = Events()
    persisted = [
        e(BlockStarted, block_id="b", block_type="agent"),
        e(Reasoning, block_id="b", step=1, text="First."),
        e(ToolCall, block_id="b", step=1, call_id="c", tool_name="t", arguments={"a": 1}),
        e(ToolResult, block_id="b", step=1, call_id="c", tool_name="t", status="error", result=1),
        e(Reasoning, block_id="b", step=2, text="Second."),
        e(BlockOutput, block_id="b", output={"content": "ok"}),
        e(BlockCompleted, block_id="b"),
    ]
    thinking = [f["data"]["text"] for f in render(persisted) if f["type"] == "stream:thinking"]
    assert thinking == ["First.", "\n\nSecond."]

    e = Events()
    live = [
        e(ReasoningDelta, block_id="b", step=1, delta="Fir"),
        e(ReasoningDelta, block_id="b", step=1, delta="st."),
        e(Reasoning, block_id="b", step=1, text="First."),
        e(ReasoningDelta, block_id="b", step=2, delta="Second."),
        e(Reasoning, block_id="b", step=2, text="Second."),
    ]
    thinking = [f["data"]["text"] for f in render(live)]
    assert thinking == ["Fir", "st.", "\n\nSecond."]


def test_thinking_is_capped_per_block_and_the_answer_is_not() -> None:
    e = Events()
    big = "x" * (THINKING_CAP - 10)
    events = [
        e(ReasoningDelta, block_id="a", step=1, delta=big),
        e(ReasoningDelta, block_id="a", step=1, delta="y" * 25),
        e(ReasoningDelta, block_id="a", step=1, delta="z"),
        e(ReasoningDelta, block_id="b", step=1, delta="other block"),
        e(TextDelta, block_id="a", step=1, delta="answer"),
    ]
    frames = render(events)
    assert [f["data"].get("text", f["data"].get("chunk")) for f in frames] == [
        big,
        "y" * 10,
        "other block",
        "answer",
    ]


def test_a_redacted_block_forwards_nothing_live_and_completes_redacted() -> None:
    e = Events()
    events = [
        e(RunStarted, workflow_id="wf"),
        *agent_block(e, "secret", answer="Write to bob@example.com"),
        *agent_block(e, "open", answer="Write to ann@example.com"),
        e(BlockError, block_id="secret", error="bad address bob@example.com", handled=True),
        e(RunCompleted, result={"answer": "bob@example.com"}),
    ]
    policy = CanvasPolicy(redacted_blocks={"secret"})
    frames = render(events, policy)
    secret = [f for f in frames if f["data"].get("blockId") == "secret"]
    assert [f["type"] for f in secret] == ["block:started", "block:completed", "block:error"]
    assert secret[1]["data"]["output"] == {"content": "Write to [EMAIL]"}
    assert secret[2]["data"]["error"] == "bad address [EMAIL]"
    assert "@example.com" not in json.dumps(secret)
    assert frames[-1]["data"] == {"result": {"answer": "[EMAIL]"}}
    # The other block is unaffected: live text, live thinking, output as is.
    opened = [f for f in frames if f["data"].get("blockId") == "open"]
    assert [f["type"] for f in render(agent_block(Events(), "open"))] == [f["type"] for f in opened]
    assert opened[-1]["data"]["output"] == {"content": "Write to ann@example.com"}


def test_a_reconnect_gets_what_happened_without_the_live_only_frames() -> None:
    """Spec 000: stream:chunk, stream:chunk_reset, stream:thinking and stream:tool are
    live-only, not buffered for a reconnect's replay (nor the stream:done that closes
    them); everything else is."""
    e = Events()
    events = [e(RunStarted, workflow_id="wf"), *agent_block(e, "a"), e(RunCompleted, result=1)]
    view = CanvasView(workflow_id="wf")
    replayed = [frame for event in events for frame in view.replayed(event)]
    watched = render(events)
    assert {f["type"] for f in watched} >= LIVE_ONLY
    assert replayed == [f for f in watched if f["type"] not in LIVE_ONLY]
    assert [f["type"] for f in replayed] == [
        "execution:started",
        "block:started",
        "block:completed",
        "execution:completed",
    ]


def test_the_result_is_not_redacted_when_no_redacted_block_ran() -> None:
    e = Events()
    events = [
        e(BlockSkipped, block_id="secret"),
        e(RunCompleted, result="ann@example.com"),
    ]
    frames = render(events, CanvasPolicy(redacted_blocks={"secret"}))
    assert frames[-1]["data"] == {"result": "ann@example.com"}


def test_frames_encode_as_data_lines_with_the_event_id_inside() -> None:
    """A POST stream is ``data:`` lines only, the position in ``eventId``; a GET stream also
    has ``id:`` lines, for EventSource."""
    e = Events()
    start = e(RunStarted, workflow_id="wf")
    (started,) = render([start])
    posted = encode_events([start], CanvasView(workflow_id="wf").frames)
    followed = encode_events([start], CanvasView(workflow_id="wf").frames, ids=True)
    assert posted.startswith(b"data: {")
    assert followed == b"id: 1\n" + posted
    (event,) = SSEDecoder().feed(posted)
    assert (event.id, event.json(), started["eventId"]) == (None, started, 1)


secret = st.integers(0, 10**6).map(lambda n: f"ARG{n}x")
tool_events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.sampled_from(["start", "end"]),
        secret,
        st.sampled_from(["success", "error", "cancelled"]),
    ),
    max_size=8,
)


@given(
    st.floats(0, 4e9)
    | st.integers(0, 4 * 10**9).map(lambda second: second + 0.9995)
    | st.integers(0, 4 * 10**9).map(lambda second: second + 0.9999995)
    | st.integers(0, 4 * 10**9).map(float)
)
def test_a_frame_s_time_is_written_as_datetime_writes_it(ts: float) -> None:
    """ISO 8601 in UTC with milliseconds, rounded as ``datetime`` rounds a Unix time (to
    the microsecond, half to even), also where that carries into the next second."""
    started = RunStarted(run_id=EXE, seq=1, ts=ts, workflow_id="wf")
    [shown] = CanvasView(workflow_id="wf").frames(started)
    expected = datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
    assert shown["timestamp"] == expected.replace("+00:00", "Z")


@settings(max_examples=50)
@given(tools=tool_events, redacted=st.sets(st.sampled_from(["a", "b"])))
def test_no_tool_frame_carries_arguments_or_results(
    tools: list[tuple[str, str, str, str]], redacted: set[str]
) -> None:
    e = Events()
    events = [
        e(
            ToolCall,
            block_id=block_id,
            step=1,
            call_id=f"c{i}",
            tool_name="tool",
            arguments={"q": marker},
        )
        if phase == "start"
        else e(
            ToolResult,
            block_id=block_id,
            step=1,
            call_id=f"c{i}",
            tool_name="tool",
            status=status,
            result={"r": marker},
        )
        for i, (block_id, phase, marker, status) in enumerate(tools)
    ]
    frames = render(events, CanvasPolicy(redacted_blocks=redacted))
    assert len(frames) == len([tool for tool in tools if tool[0] not in redacted])
    assert "ARG" not in json.dumps(frames)
    for f in frames:
        assert set(f["data"]) <= {"blockId", "phase", "id", "name", "status"}


# --- over the real engine -----------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_real_execution_assembles_each_blocks_text_and_keeps_tool_arguments_out() -> None:
    """Two offline agents in parallel, one with a tool: the text a client assembles from
    ``stream:chunk`` / ``stream:chunk_reset`` is each block's output; frames are in seq order."""
    flow = parse_workflow(
        {
            "id": "pair",
            "blocks": [
                {"id": "start", "type": "start"},
                {"id": "calc", "type": "agent", "agent": "calc", "input": "What is 6*7?"},
                {"id": "chat", "type": "agent", "agent": "chat", "input": "<start.input>"},
                {"id": "out", "type": "response", "output": "<calc.content> <chat.content>"},
            ],
            "edges": [
                {"from": "start", "to": "calc"},
                {"from": "start", "to": "chat"},
                {"from": "calc", "to": "out"},
                {"from": "chat", "to": "out"},
            ],
        }
    )
    specs = {
        "calc": AgentSpec(id="calc", tools=["calculator"], reasoning=True),
        "chat": AgentSpec(id="chat"),
    }

    async def find(agent_id: str) -> AgentSpec:
        return specs[agent_id]

    runner = RuntimeAgentRunner(
        models=ModelRegistry(load_catalog()), tools=ToolRegistry(BUILTIN_TOOLS), agents=find
    )
    events: list[Event] = []

    async def sink(batch: Sequence[BaseEvent]) -> None:
        events.extend(cast(Sequence[Event], batch))  # the runtime makes only the union's events

    ctx = RunContext(EXE, sink=sink)
    with anyio.fail_after(10):
        result = await WorkflowEngine(agents=runner).execution(flow, ctx).run("hello")
    events.append(terminal(ctx, result))  # as the server ends it

    frames = render(events)
    ids = [f["eventId"] for f in frames]
    assert ids == sorted(set(ids))
    assert frames[0]["type"] == "execution:started"
    assert frames[-1]["type"] == "execution:completed"
    tool_starts = [e for e in events if isinstance(e, ToolCall) and e.arguments]
    assert tool_starts, "the calc agent called its tool"
    assert '"expression"' not in json.dumps(frames)

    text: dict[str, str] = {}
    outputs: dict[str, Any] = {}
    for f in frames:
        data = f["data"]
        match f["type"]:
            case "stream:chunk":
                text[data["blockId"]] = text.get(data["blockId"], "") + data["chunk"]
            case "stream:chunk_reset":
                text[data["blockId"]] = ""
            case "block:completed":
                outputs[data["blockId"]] = data.get("output")
    for block_id in ("calc", "chat"):
        assert text[block_id] == outputs[block_id]["content"]
    assert any(f["type"] == "stream:thinking" for f in frames)
    assert [f["type"] for f in frames].count("stream:done") == 2
