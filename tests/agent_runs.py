"""Random agent runs, shaped as the agent loop emits them, for the views' property tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from agentstream.events import (
    STEP_SEPARATOR,
    ApprovalRequested,
    BaseEvent,
    Event,
    Reasoning,
    ReasoningDelta,
    RunCompleted,
    RunFailed,
    RunPaused,
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

__all__ = ["Run", "agent_runs", "reasoning_within_text"]

pieces = st.lists(st.text(min_size=1, max_size=5), max_size=4)


@dataclass
class Run:
    """A run's events, live (with deltas) and as stored; the answer and every step's text."""

    live: list[Event]
    stored: list[Event]
    answer: str | None
    """The final answer of a completed run; None if it failed or paused."""
    shown: str
    """All steps' text as streamed, with separators."""
    texts: list[str]
    """Each step's text, of the steps that wrote some."""
    paused: bool
    """It stopped for an approval (no terminal event yet)."""

    @property
    def stored_texts(self) -> list[str]:
        """What the store keeps of ``texts``: the final turn's only (spec 000: an
        intermediate preamble is never persisted)."""
        return [self.answer] if self.answer else []


@st.composite
def agent_runs(draw: st.DrawFn) -> Run:
    events: list[Any] = []

    def emit(kind: type[BaseEvent], **fields: Any) -> None:
        events.append(kind(run_id="run_1", seq=len(events) + 1, ts=1.0, **fields))

    emit(RunStarted, agent_id="a", session_id="s")
    steps = draw(st.integers(1, 3))
    shown = ""
    answer = None
    texts = []
    paused = False
    fails_at = draw(st.none() | st.integers(1, steps))
    pauses_at = draw(st.none() | st.integers(1, steps - 1)) if steps > 1 else None
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
        if text:
            texts.append("".join(text))
        if step == fails_at:
            emit(RunFailed, status=draw(st.sampled_from(["error", "cancelled"])), message="no")
            break
        if step < steps:  # a turn of tool calls
            if text:
                emit(TextRetracted, step=step, text="".join(text))
            for call in range(draw(st.integers(1, 2))):
                call_id = f"c{step}_{call}"
                emit(ToolCall, step=step, call_id=call_id, tool_name="t", arguments={"x": call})
                if step == pauses_at:
                    emit(
                        ApprovalRequested, step=step, call_id=call_id, tool_name="t", tool_input={}
                    )
                    continue
                status = draw(st.sampled_from(["success", "error"]))
                emit(ToolResult, step=step, call_id=call_id, tool_name="t", status=status, result=1)
            if step == pauses_at:
                paused = True
                emit(
                    RunPaused,
                    awaiting=[e.call_id for e in events if e.type == "approval_requested"],
                )
                break
        else:
            answer = "".join(text)
            emit(Text, step=step, text=answer)
        emit(StepCompleted, step=step)
    else:
        emit(RunCompleted, content=answer or "", usage=Usage(input_tokens=3, output_tokens=4))
    stored = [e for e in events if e.persisted]
    return Run(events, stored, answer, shown, texts, paused)


def reasoning_within_text() -> list[Event]:
    """A step whose model thinks again after its text began, then goes on (with an empty
    piece): the reasoning must end before the text goes on."""
    deltas: list[tuple[type[TextDelta | ReasoningDelta], str]] = [
        (TextDelta, "a"),
        (ReasoningDelta, "r"),
        (TextDelta, "b"),
        (TextDelta, ""),
        (TextDelta, "c"),
    ]
    return [
        RunStarted(run_id="run_1", seq=1, ts=1.0, agent_id="a", session_id="s"),
        StepStarted(run_id="run_1", seq=2, ts=1.0, step=1),
        *(
            kind(run_id="run_1", seq=seq, ts=1.0, step=1, delta=delta)
            for seq, (kind, delta) in enumerate(deltas, 3)
        ),
    ]
