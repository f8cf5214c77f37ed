"""The AG-UI view over random agent runs: every event is one the official package defines,
every message, reasoning, tool call and step begun is ended, exactly one ending, and the
assistant messages hold each step's text."""

from __future__ import annotations

from typing import Any

from ag_ui.core import Event as AGUIEvent
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from agent_runs import Run, agent_runs, reasoning_within_text
from agentstream.events import (
    ApprovalRequested,
    BaseEvent,
    Event,
    RunPaused,
    RunStarted,
    StepCompleted,
    StepStarted,
    ToolCall,
    ToolResult,
)
from agentstream.views.ag_ui import AGUIEvents
from agentstream.views.continued import continued
from agentstream.views.frames import as_dict

EVENTS: TypeAdapter[Any] = TypeAdapter(AGUIEvent)
PAIRS = {
    "TEXT_MESSAGE_START": "TEXT_MESSAGE_END",
    "REASONING_START": "REASONING_END",
    "REASONING_MESSAGE_START": "REASONING_MESSAGE_END",
    "TOOL_CALL_START": "TOOL_CALL_END",
    "STEP_STARTED": "STEP_FINISHED",
}


def frames(events: list[Event], after: int = 0) -> list[dict[str, Any]]:
    view = AGUIEvents("thread_1", "run_1")
    shown = continued(view, after, view.opening)
    return [as_dict(frame) for event in events for frame in shown(event)]


def key(frame: dict[str, Any]) -> str:
    """What a begun thing is known by: its message, tool call or step."""
    return str(frame.get("messageId") or frame.get("toolCallId") or frame["stepName"])


@given(agent_runs())
def test_events_are_well_formed(run: Run) -> None:
    sent = frames(run.live)
    for frame in sent:
        EVENTS.validate_python(frame)
    assert sent[0] == {
        "type": "RUN_STARTED",
        "threadId": "thread_1",
        "runId": "run_1",
        "protocolVersion": "1.0",
    }
    endings = [f for f in sent if f["type"] in ("RUN_FINISHED", "RUN_ERROR")]
    assert endings == [sent[-1]]
    open_: set[tuple[str, str]] = set()
    for frame in sent:
        if frame["type"] in PAIRS:
            assert (frame["type"], key(frame)) not in open_
            open_.add((frame["type"], key(frame)))
        for start, end in PAIRS.items():
            if frame["type"] == end:
                open_.remove((start, key(frame)))
    assert open_ == set(), "everything begun is ended"
    outcome = sent[-1].get("outcome", {}).get("type")
    if run.paused:
        assert outcome == "interrupt"
        asked = [i["toolCallId"] for i in sent[-1]["outcome"]["interrupts"]]
        last: Any = run.live[-1]
        assert asked == last.awaiting
    elif run.answer is not None:
        assert outcome == "success"


@given(agent_runs())
def test_messages_hold_each_step_s_text(run: Run) -> None:
    read = [(run.live, run.texts)]
    if run.answer is not None:
        read.append((run.stored, run.stored_texts))
    for events, expected in read:
        texts: dict[str, str] = {}
        for frame in frames(events):
            if frame["type"] == "TEXT_MESSAGE_START":
                texts[frame["messageId"]] = ""
            if frame["type"] == "TEXT_MESSAGE_CONTENT":
                texts[frame["messageId"]] += frame["delta"]
        assert [t for t in texts.values() if t] == expected


@given(agent_runs(), st.data())
def test_a_continued_run_starts_again(run: Run, data: st.DataObject) -> None:
    after = data.draw(st.integers(1, len(run.live)))
    later = frames(run.live, after=after)
    if after < len(run.live):
        assert later[0]["type"] == "RUN_STARTED"
        assert [f["type"] for f in later].count("RUN_STARTED") == 1
    else:
        assert later == []


def test_a_second_pause_asks_only_its_own_calls() -> None:
    """A run continued after one pause that pauses again: its interrupts are the new ones."""
    seq = iter(range(1, 100))

    def e(kind: type[BaseEvent], **fields: Any) -> Any:
        return kind(run_id="run_1", seq=next(seq), ts=1.0, **fields)

    run = [
        e(RunStarted, agent_id="a", session_id="s"),
        e(StepStarted, step=1),
        e(ToolCall, step=1, call_id="c1", tool_name="t", arguments={}),
        e(ApprovalRequested, step=1, call_id="c1", tool_name="t", tool_input={}),
        e(RunPaused, awaiting=["c1"]),
    ]
    paused_at = run[-1].seq
    run += [
        e(ToolResult, step=1, call_id="c1", tool_name="t", status="success", result=1),
        e(StepCompleted, step=1),
        e(StepStarted, step=2),
        e(ToolCall, step=2, call_id="c2", tool_name="t", arguments={}),
        e(ApprovalRequested, step=2, call_id="c2", tool_name="t", tool_input={}),
        e(RunPaused, awaiting=["c2"]),
    ]
    first = frames(run[:paused_at])
    later = frames(run, after=paused_at)
    assert [i["id"] for i in first[-1]["outcome"]["interrupts"]] == ["c1"]
    assert [i["id"] for i in later[-1]["outcome"]["interrupts"]] == ["c2"]


def test_reasoning_that_comes_within_the_text_ends_before_the_text_goes_on() -> None:
    """The reasoning message ends before the next text content, and an empty piece sends
    nothing (AG-UI refuses an empty delta)."""
    assert [(f["type"], f.get("delta")) for f in frames(reasoning_within_text())[2:]] == [
        ("TEXT_MESSAGE_START", None),
        ("TEXT_MESSAGE_CONTENT", "a"),
        ("REASONING_START", None),
        ("REASONING_MESSAGE_START", None),
        ("REASONING_MESSAGE_CONTENT", "r"),
        ("REASONING_MESSAGE_END", None),
        ("REASONING_END", None),
        ("TEXT_MESSAGE_CONTENT", "b"),
        ("TEXT_MESSAGE_CONTENT", "c"),
    ]
