"""The native view: every canonical event has a defined frame (or none), in the spec's shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentstream import sse
from agentstream.events import (
    STEP_SEPARATOR,
    ApprovalRequested,
    BlockCompleted,
    BlockError,
    BlockOutput,
    BlockSkipped,
    BlockStarted,
    ContextHandlerCreated,
    DelegationCompleted,
    DelegationStarted,
    EntityChunk,
    EntityText,
    Event,
    EventAdapter,
    Reasoning,
    ReasoningDelta,
    ReasoningSummary,
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
from agentstream.server.streams import _token_sse, encode_events, native
from agentstream.views.native import NativeFrameAdapter, frame

META: dict[str, Any] = {"run_id": "run_1", "seq": 7, "ts": 1.5}

BLOCK: dict[str, Any] = {**META, "block_id": "b"}

CASES: list[tuple[Event, dict[str, Any] | None]] = [
    (
        RunStarted(**META, agent_id="a", session_id="s"),
        {"event": "start", "run_id": "run_1", "session_id": "s"},
    ),
    (StepStarted(**META, step=1), {"event": "step_started", "step": 1}),
    (ReasoningDelta(**META, step=1, delta="hm"), {"event": "reasoning_delta", "delta": "hm"}),
    (Reasoning(**META, step=1, text="hmm"), {"event": "reasoning", "text": "hmm"}),
    (
        ReasoningSummary(**META, step=1, summary="short"),
        {"event": "reasoning_summary", "summary": "short"},
    ),
    (TextDelta(**META, step=1, delta="Hi"), {"event": "content_delta", "delta": "Hi"}),
    (
        TextDelta(**META, step=2, delta="Then", separator="\n\n"),
        {"event": "content_delta", "delta": "\n\nThen"},
    ),
    (
        TextRetracted(**META, step=1, text="Let me look."),
        {"event": "preamble", "step": 1, "text": "Let me look."},
    ),
    (Text(**META, step=1, text="Hi!"), {"event": "chunk", "content": "Hi!"}),
    (Text(**META, step=2, text="Hi!"), None),
    (
        ToolCall(**META, step=1, call_id="c", tool_name="t", arguments={"x": 1}),
        {"event": "tool_call", "tool_call_id": "c", "tool_name": "t", "arguments": {"x": 1}},
    ),
    (
        ToolResult(**META, step=1, call_id="c", tool_name="t", status="success", result=[1]),
        {
            "event": "tool_result",
            "tool_call_id": "c",
            "tool_name": "t",
            "result": [1],
            "status": "success",
        },
    ),
    (
        ApprovalRequested(**META, step=1, call_id="c", tool_name="t", tool_input={"x": 1}),
        {
            "event": "approval_requested",
            "tool_call_id": "c",
            "tool_name": "t",
            "tool_input": {"x": 1},
        },
    ),
    (
        ContextHandlerCreated(**META, step=1, call_id="c", context_handler_id="ctx_1"),
        {"event": "context_handler_created", "tool_call_id": "c", "context_handler_id": "ctx_1"},
    ),
    (RunPaused(**META, awaiting=["c"]), None),
    (StepCompleted(**META, step=1), {"event": "step_completed", "step": 1}),
    (
        RunCompleted(**META, content="Hi!", usage=Usage(input_tokens=3, output_tokens=4)),
        {
            "event": "complete",
            "run_id": "run_1",
            "content": "Hi!",
            "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7, "cost_usd": None},
        },
    ),
    (
        RunFailed(**META, status="timeout", message="late"),
        {"event": "error", "message": "late", "status": "timeout"},
    ),
    (
        DelegationStarted(**META, entity="e", entity_run_id="run_2", task="do"),
        {"event": "delegation_start", "entity": "e", "entity_run_id": "run_2", "task": "do"},
    ),
    (
        EntityChunk(**META, entity="e", entity_run_id="run_2", delta="Hi"),
        {"event": "entity_chunk", "entity": "e", "entity_run_id": "run_2", "delta": "Hi"},
    ),
    (
        EntityText(**META, entity="e", entity_run_id="run_2", text="Hi there"),
        {"event": "entity_chunk", "entity": "e", "entity_run_id": "run_2", "delta": "Hi there"},
    ),
    (
        DelegationCompleted(**META, entity="e", entity_run_id="run_2", status="error", error="no"),
        {
            "event": "delegation_complete",
            "entity": "e",
            "entity_run_id": "run_2",
            "status": "error",
            "content": None,
            "error": "no",
        },
    ),
    # An agent run has no blocks: the workflow surface shows these (views.workflow).
    (BlockStarted(**BLOCK, block_type="agent"), None),
    (BlockOutput(**BLOCK, output={"content": "Hi"}), None),
    (BlockCompleted(**BLOCK), None),
    (BlockError(**BLOCK, error="no", handled=False), None),
    (BlockSkipped(**BLOCK), None),
]


@pytest.mark.parametrize(("event", "expected"), CASES, ids=[type(e).__name__ for e, _ in CASES])
def test_frame_shapes(event: Event, expected: dict[str, Any] | None) -> None:
    """As stored events are shown (a replay); every frame starts with the event's seq."""
    shown = frame(event)
    assert shown == (None if expected is None else {"seq": 7, **expected})
    if shown is not None:
        model = type(NativeFrameAdapter.validate_python(shown))
        assert list(shown) == list(model.model_fields), "the documented keys, in order"


def test_every_event_type_is_covered() -> None:
    covered = {type(event) for event, _ in CASES}
    union = EventAdapter.core_schema["choices"]
    assert len(covered) == len(union)


@pytest.mark.parametrize("event", [e for e, _ in CASES], ids=[type(e).__name__ for e, _ in CASES])
def test_events_round_trip_through_json(event: Event) -> None:
    """What the store writes, it reads back identical."""
    dumped = EventAdapter.dump_json(event)
    assert EventAdapter.validate_json(dumped) == event


def test_only_deltas_and_preambles_are_forwarded_only() -> None:
    """Spec 000: "intermediate preamble is never persisted"."""
    forwarded_only = {type(e).__name__ for e, _ in CASES if not type(e).persisted}
    assert forwarded_only == {"EntityChunk", "ReasoningDelta", "TextDelta", "TextRetracted"}


def test_live_viewers_are_not_shown_entity_text_twice() -> None:
    """Live, the entity's text went out as its entity_chunk deltas; only a replay, which has
    no deltas, shows the assembled text."""
    said = EntityText(**META, entity="e", entity_run_id="run_2", text="Hi there")
    assert frame(said, live=True) is None
    for event, _ in CASES:
        if not isinstance(event, EntityText):
            assert frame(event, live=True) == frame(event)


@given(
    st.one_of(
        st.text(),
        st.text(st.sampled_from(["\ud800", "\x7f", "\x00", "\u2028", '"', "\\", "\n", "é", "😀"])),
    ),
    st.sampled_from(["", STEP_SEPARATOR]),
    st.integers(1, 2**53),
    st.booleans(),
)
def test_a_tokens_frame_on_the_wire_is_the_encoders_to_the_byte(
    delta: str, separator: str, seq: int, ids: bool
) -> None:
    """A live stream writes a token's frame as JSON at once (``streams.native``), or as its
    SSE text at once where it writes the token through (``streams._token_sse``), every other
    frame through the encoder: the same bytes as the encoder's, whatever the text (escapes,
    lone surrogates, U+007F), and as the standard library's ``json.dumps``."""
    token = TextDelta(run_id="r", seq=seq, ts=0.0, step=1, delta=delta, separator=separator)
    shown = frame(token, live=True)
    assert shown is not None
    assert encode_events([token], native, ids=ids) == encode_events(
        [token], lambda _: [shown], ids=ids
    )
    data = json.dumps(shown, separators=(",", ":"), allow_nan=False)
    assert encode_events([token], native) == f"data: {data}\n\n".encode() == _token_sse(token)
    assert encode_events([token], native, ids=True) == sse.encode(data, id=seq).encode()
