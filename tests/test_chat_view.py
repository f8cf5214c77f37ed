"""The public chat view, over random runs of the real agent loop, for every policy.

Properties (spec 000): the displayed answer (append ``chunk``, honour ``chunk_reset``)
converges to the final content; no frame carries a tool argument or result; thinking
appears only with the header and ``include_thinking``; legacy clients never see
provisional text, thinking or tool frames.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from agentstream.agents import AgentSpec
from agentstream.events import BaseEvent, Event, RunCompleted
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
from agentstream.runlog import RunLog
from agentstream.runtime.agent import AgentState, run_agent
from agentstream.runtime.context import RunContext
from agentstream.runtime.tools import Tool
from agentstream.views.chat import PUBLIC_ERRORS, THINKING_CAP, ChatPolicy, ChatView
from agentstream.views.frames import as_dict


def sent(view: ChatView, events: Iterable[Event]) -> list[dict[str, Any]]:
    """The frames the view sends for ``events``, as dicts (a token's may be JSON text)."""
    return [as_dict(frame) for event in events for frame in view.frames(event)]


@dataclass(frozen=True)
class Turn:
    thinking: list[str]
    text: list[str]
    calls: list[str]
    """Argument markers of this turn's tool calls; none in the final turn."""


def probe(value: str) -> str:
    """Echo a marker the view must never show."""
    return value.replace("ARG", "RES")


words = st.text(alphabet="abcdefgh ", min_size=1, max_size=6)
marker = st.integers(0, 10**6).map(lambda n: f"ARG{n}x")


@st.composite
def runs(draw: st.DrawFn) -> list[Turn]:
    turns = []
    for _ in range(draw(st.integers(0, 3))):
        turns.append(
            Turn(
                thinking=draw(st.lists(words.map(lambda w: f"THINK{w}"), max_size=3)),
                text=draw(st.lists(words.map(lambda w: f"PRE{w}"), max_size=3)),
                calls=draw(st.lists(marker, min_size=1, max_size=2)),
            )
        )
    final = Turn(
        thinking=draw(st.lists(words.map(lambda w: f"THINK{w}"), max_size=3)),
        text=draw(st.lists(words, max_size=4)),
        calls=[],
    )
    return [*turns, final]


def script(turns: list[Turn]) -> Any:
    def parts(request: ModelRequest) -> list[ModelPart]:
        turn = turns[sum(1 for m in request.messages if m.role == "assistant")]
        out: list[ModelPart] = [ReasoningPart(t) for t in turn.thinking]
        out += [TextPart(t) for t in turn.text]
        for index, argument in enumerate(turn.calls):
            call_id = f"c{len(request.messages)}_{index}"
            out += [
                ToolCallStartPart(call_id, "probe"),
                ToolCallArgsPart(call_id, json.dumps({"value": argument})),
                ToolCallEndPart(call_id),
            ]
        return [*out, TurnEndPart("tool_calls" if turn.calls else "end_turn")]

    return parts


class _NoStore:
    async def append_events(self, *events: BaseEvent) -> None:
        pass


def canonical_events(turns: list[Turn]) -> list[Event]:
    """Run the real agent loop on the scripted turns and collect what it emits."""
    log = RunLog()

    async def go() -> list[Event]:
        log.open("run")
        subscription = log.subscribe("run")
        ctx = RunContext("run", log=log, store=_NoStore())  # type: ignore[arg-type]
        agent = AgentSpec(id="a", max_steps=10)
        answer = await run_agent(
            ctx,
            agent,
            ScriptedModel("s", script(turns)),
            [Tool.from_function(probe)],
            state=AgentState.begin(agent, [], "go"),
            reasoning=True,
        )
        await ctx.emit(RunCompleted, content=answer.content)
        log.close("run")
        return [event async for event in subscription]

    return anyio.run(go)


def displayed(frames: list[dict[str, Any]]) -> str:
    """What a v1 client shows: append chunk, clear on chunk_reset."""
    text = ""
    for frame in frames:
        if "chunk" in frame:
            text += frame["chunk"]
        elif frame.get("event") == "chunk_reset":
            text = ""
    return text


policies = st.builds(
    ChatPolicy,
    protocol_v1=st.booleans(),
    include_thinking=st.booleans(),
    include_tool_calls=st.booleans(),
    redact=st.sampled_from([None, str.upper]),
)


@settings(max_examples=300)
@given(turns=runs(), policy=policies)
def test_public_frames_keep_every_promise(turns: list[Turn], policy: ChatPolicy) -> None:
    events = canonical_events(turns)
    view = ChatView(policy, output_blocks=["b"], run_block="b", conversation_id="c")
    frames = sent(view, events)
    final = "".join(turns[-1].text)
    shown = policy.redact(final) if policy.redact else final
    wire = [json.dumps(frame) for frame in frames]

    assert displayed(frames) == shown
    assert not any("ARG" in f or "RES" in f for f in wire), "tool arguments/results leaked"
    assert all("arguments" not in f and "result" not in f for f in frames)
    thinking = [f for f in frames if f.get("event") == "thinking"]
    if not (policy.protocol_v1 and policy.include_thinking):
        assert not thinking
        assert not any("THINK" in f for f in wire)
    assert not any("THINK" in f.get("chunk", "") for f in frames), "thinking in the answer"
    assert all("chunk" not in f for f in thinking)
    tools = [f for f in frames if f.get("event") == "tool"]
    if policy.protocol_v1 and policy.include_tool_calls:
        assert len(tools) == 2 * sum(len(t.calls) for t in turns)
        assert {tuple(sorted(f)) for f in tools} <= {
            ("blockId", "event", "id", "name", "phase"),
            ("blockId", "event", "id", "name", "phase", "status"),
        }
    else:
        assert not tools
    if not policy.protocol_v1 or policy.redact:
        assert not any("PRE" in f for f in wire), "provisional text reached a settled client"
        assert not any(f.get("event") == "chunk_reset" for f in frames)
        assert len([f for f in frames if "chunk" in f]) <= 1, "settled text comes in one piece"
    assert frames[-1]["event"] == "final"
    assert [f.get("event") for f in frames].count("final") == 1
    assert frames[-1]["data"]["output"]["content"] == shown
    assert all(
        set(c) == {"id", "name", "status"} for c in frames[-1]["data"]["output"]["toolCalls"]
    )


def test_live_text_is_retracted_when_the_turn_calls_tools() -> None:
    turns = [Turn([], ["PREa", " b"], ["ARG1x"]), Turn([], ["Done", "."], [])]
    view = ChatView(
        ChatPolicy(protocol_v1=True), output_blocks=["b"], run_block="b", conversation_id="c"
    )
    frames = sent(view, canonical_events(turns))
    assert frames[:6] == [
        {"blockId": "b", "chunk": "PREa"},
        {"blockId": "b", "chunk": " b"},
        {"blockId": "b", "event": "chunk_reset"},
        {"blockId": "b", "chunk": "Done"},
        {"blockId": "b", "chunk": "."},
        {
            "event": "final",
            "data": {
                "success": True,
                "conversationId": "c",
                "output": {
                    "content": "Done.",
                    "toolCalls": [{"id": "c2_0", "name": "probe", "status": "success"}],
                },
            },
        },
    ]


def test_thinking_is_capped_per_block() -> None:
    turns = [Turn(["x" * 300_000, "y" * 300_000], ["Hi"], [])]
    policy = ChatPolicy(protocol_v1=True, include_thinking=True)
    view = ChatView(policy, output_blocks=["b"], run_block="b", conversation_id="c")
    frames = sent(view, canonical_events(turns))
    thinking = "".join(f["data"] for f in frames if f.get("event") == "thinking")
    assert len(thinking) == THINKING_CAP
    assert displayed(frames) == "Hi"


def test_errors_end_the_stream_without_final() -> None:
    from agentstream.events import RunFailed

    view = ChatView(
        ChatPolicy(protocol_v1=False), output_blocks=["b"], run_block="b", conversation_id="c"
    )
    failed = RunFailed(run_id="r", seq=1, ts=0, status="timeout", message="too slow")
    assert view.frames(failed) == [{"event": "error", "error": "too slow"}]


@settings(max_examples=200)
@given(
    turns=runs(),
    policy=policies,
    cut=st.floats(0, 1),
    status=st.sampled_from(["error", "timeout", "cancelled"]),
)
def test_runs_that_fail_part_way_end_with_one_error_and_leak_nothing(
    turns: list[Turn], policy: ChatPolicy, cut: float, status: str
) -> None:
    from agentstream.events import RunFailed

    events = canonical_events(turns)[:-1]  # everything but the completion
    events = events[: int(len(events) * cut)]
    failed = RunFailed(run_id="run", seq=10**6, ts=0, status=status, message="stopped")  # type: ignore[arg-type]
    view = ChatView(policy, output_blocks=["b"], run_block="b", conversation_id="c")
    frames = sent(view, [*events, failed])
    wire = [json.dumps(frame) for frame in frames]

    said = PUBLIC_ERRORS.get(status, "stopped")
    assert frames[-1] == {"event": "error", "error": policy.redact(said) if policy.redact else said}
    assert not any(f.get("event") == "final" for f in frames)
    assert not any("ARG" in f or "RES" in f for f in wire)
    if not (policy.protocol_v1 and policy.include_thinking):
        assert not any("THINK" in f for f in wire)
    if not policy.live_text:
        assert not any("PRE" in f for f in wire), "no provisional text for settled clients"


def paused_run() -> list[Event]:
    from agentstream.events import ApprovalRequested, RunPaused, ToolCall

    common: dict[str, Any] = {"run_id": "r", "ts": 0}
    arguments = {"expression": "ARG1x"}
    return [
        ToolCall(
            **common, seq=1, step=1, call_id="c1", tool_name="calculator", arguments=arguments
        ),
        ApprovalRequested(
            **common, seq=2, step=1, call_id="c1", tool_name="calculator", tool_input=arguments
        ),
        RunPaused(**common, seq=3, awaiting=["c1"]),
    ]


def test_a_paused_run_says_the_answer_waits_for_approval() -> None:
    """The final envelope tells every client; the approval_required frame is part of the
    tool lifecycle: header and include_tool_calls (spec 000: the header alone exposes
    nothing)."""
    final = {
        "event": "final",
        "data": {
            "success": False,
            "awaitingApproval": True,
            "error": "The answer is waiting for an approval.",
            "conversationId": "c",
        },
    }
    shown = {
        ChatPolicy(protocol_v1=False, include_tool_calls=True): [final],
        ChatPolicy(protocol_v1=True): [final],
        ChatPolicy(protocol_v1=True, include_tool_calls=True): [
            {"blockId": "b", "event": "tool", "phase": "start", "id": "c1", "name": "calculator"},
            {"blockId": "b", "event": "approval_required", "id": "c1", "name": "calculator"},
            final,
        ],
    }
    for policy, expected in shown.items():
        view = ChatView(policy, output_blocks=["b"], run_block="b", conversation_id="c")
        frames = sent(view, paused_run())
        assert frames == expected
        assert "ARG" not in json.dumps(frames), "never the tool's arguments"
