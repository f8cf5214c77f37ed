"""The OpenAI views over random agent runs, shaped as the agent loop emits them: well-formed
(every item added is done, numbered without gaps, exactly one ending), and the text a
client reassembles is the run's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentstream.events import (
    STEP_SEPARATOR,
    BaseEvent,
    Event,
    Reasoning,
    ReasoningDelta,
    RunCompleted,
    RunFailed,
    RunStarted,
    StepCompleted,
    StepStarted,
    Text,
    TextDelta,
    TextRetracted,
    ToolCall,
    ToolResult,
    Usage,
)
from agentstream.views.openai import NUMBERS_PER_EVENT, ChatCompletionChunks, ResponseEvents

pieces = st.lists(st.text(min_size=1, max_size=5), max_size=4)


@dataclass
class Run:
    """A run's events, live (with deltas) and as stored; the answer and every step's text."""

    live: list[Event]
    stored: list[Event]
    answer: str | None
    shown: str
    """All steps' text as streamed, with separators."""


@st.composite
def agent_runs(draw: st.DrawFn) -> Run:
    events: list[Any] = []

    def emit(kind: type[BaseEvent], **fields: Any) -> None:
        events.append(kind(run_id="run_1", seq=len(events) + 1, ts=1.0, **fields))

    emit(RunStarted, agent_id="a", session_id="s")
    steps = draw(st.integers(1, 3))
    shown = ""
    answer = None
    fails_at = draw(st.none() | st.integers(1, steps))
    for step in range(1, steps + 1):
        emit(StepStarted, step=step)
        if thinking := draw(pieces):
            for delta in thinking:
                emit(ReasoningDelta, step=step, delta=delta)
            emit(Reasoning, step=step, text="".join(thinking))
        text = draw(pieces)
        for i, delta in enumerate(text):
            separator = STEP_SEPARATOR if shown and i == 0 else ""
            emit(TextDelta, step=step, delta=delta, separator=separator)
            shown += separator + delta
        if step == fails_at:
            emit(RunFailed, status=draw(st.sampled_from(["error", "cancelled"])), message="no")
            break
        if step < steps:  # a turn of tool calls
            if text:
                emit(TextRetracted, step=step, text="".join(text))
            for call in range(draw(st.integers(1, 2))):
                call_id = f"c{step}_{call}"
                emit(ToolCall, step=step, call_id=call_id, tool_name="t", arguments={"x": call})
                status = draw(st.sampled_from(["success", "error"]))
                emit(ToolResult, step=step, call_id=call_id, tool_name="t", status=status, result=1)
        else:
            answer = "".join(text)
            emit(Text, step=step, text=answer)
        emit(StepCompleted, step=step)
    else:
        emit(RunCompleted, content=answer or "", usage=Usage(input_tokens=3, output_tokens=4))
    stored = [e for e in events if e.persisted]
    return Run(events, stored, answer, shown)


def responses(events: list[Event]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    view = ResponseEvents.begin("run_1", model="a", created_at=1.0)
    return [frame for event in events for frame in view(event)], view.response


@given(agent_runs())
def test_response_events_are_well_formed(run: Run) -> None:
    frames, response = responses(run.live)
    numbers = [f["sequence_number"] for f in frames]
    assert numbers == sorted(set(numbers))
    assert numbers[0] == 0
    assert [f["type"] for f in frames[:2]] == ["response.created", "response.in_progress"]
    ends = [f for f in frames if f["type"] in ("response.completed", "response.failed")]
    assert ends == [frames[-1]]
    added = [f["item"]["id"] for f in frames if f["type"] == "response.output_item.added"]
    done = [f["item"]["id"] for f in frames if f["type"] == "response.output_item.done"]
    assert added == sorted(set(added), key=added.index)  # each item once
    assert sorted(added) == sorted(done)
    assert [item["id"] for item in response["output"]] == added
    for item in response["output"]:
        deltas = "".join(
            f["delta"]
            for f in frames
            if f.get("item_id") == item["id"] and f["type"].endswith("text.delta")
        )
        if item["type"] == "message":
            assert item["content"][0]["text"] == deltas
        if item["type"] == "reasoning":
            assert item["summary"][0]["text"] == deltas


@given(agent_runs(), st.booleans())
def test_an_event_s_frames_are_numbered_from_its_seq(run: Run, stored: bool) -> None:
    """So live and stored, where there are no deltas, number an event's frames alike."""
    view = ResponseEvents.begin("run_1", model="a", created_at=1.0)
    events = run.stored if stored else run.live
    for event in events[:-1]:
        for frame in view(event):
            assert frame["sequence_number"] // NUMBERS_PER_EVENT == event.seq - 1


@given(agent_runs())
def test_a_response_s_answer_is_the_run_s(run: Run) -> None:
    _, live = responses(run.live)
    _, stored = responses(run.stored)
    messages = [item for item in live["output"] if item["type"] == "message"]
    if run.answer is not None:
        assert live["status"] == "completed"
        if run.answer:
            assert messages[-1]["content"][0]["text"] == run.answer
    else:
        assert live["status"] in ("failed", "cancelled")
    # Read back from the store (no deltas), a completed response has the same output.
    if run.answer is not None:
        assert stored["output"] == live["output"]


@given(agent_runs())
def test_chat_chunks_reassemble_the_streamed_text(run: Run) -> None:
    view = ChatCompletionChunks("chatcmpl-1", "a", 1, include_usage=True)
    frames = [frame for event in run.live for frame in view(event)]
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunks = [f for f in frames if f.get("choices")]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == run.shown
    finishes = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]
    ]
    errors = [f for f in frames if "error" in f]
    if run.answer is not None:
        assert (finishes, errors) == (["stop"], [])
        assert frames[-1]["choices"] == []
        assert frames[-1]["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "total_tokens": 7,
        }
    else:
        assert (finishes, len(errors)) == ([], 1)
        assert frames[-1] is errors[0]
