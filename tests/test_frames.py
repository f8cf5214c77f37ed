"""A token's frame filled into a template is, byte for byte, what the encoder writes of the
whole frame: for any text and number, in any place, and for every frame the protocol views
send so, over random agent runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_runs import Run, agent_runs
from agentstream.events import Event, TextDelta
from agentstream.views.ag_ui import AGUIEvents
from agentstream.views.chat import ChatPolicy, ChatView
from agentstream.views.frames import SLOT, Frame, JSONText, Template, to_json
from agentstream.views.openai import ChatCompletionChunks, ResponseEvents
from agentstream.views.ui_messages import UIMessageChunks

ANY_TEXT = st.text(st.characters(codec=None, categories=None))
"""Any code point: lone surrogates, controls, U+007F, U+2028, quotes, backslashes, braces."""

ONE_SLOT: list[Callable[[Any], dict[str, Any]]] = [
    lambda value: {"delta": value},
    lambda value: {"delta": value, "after": "}{\\"},
    lambda value: {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "delta": {"content": value}, "logprobs": None}],
        "usage": None,
    },
]
TWO_SLOTS: list[Callable[[Any, Any], dict[str, Any]]] = [
    lambda number, text: {"sequence_number": number, "delta": text, "logprobs": []},
    lambda number, text: {"a": {"b": [number]}, "c": [{"d": text}]},
]


@given(ANY_TEXT, st.integers())
def test_a_filled_template_is_the_frame_encoded(text: str, number: int) -> None:
    for shape in ONE_SLOT:
        assert Template(shape(SLOT)).fill(text) == to_json(shape(text))
    for two in TWO_SLOTS:
        assert Template(two(SLOT, SLOT)).fill(number, text) == to_json(two(number, text))


def test_a_template_refuses_what_it_cannot_write_alike() -> None:
    with pytest.raises(ValueError, match="one or two slots"):
        Template({"delta": "text"})
    with pytest.raises(ValueError, match="one or two slots"):
        Template({"a": SLOT, "b": SLOT, "c": SLOT})
    with pytest.raises(ValueError, match="1 slots, not 2"):
        Template({"delta": SLOT}).fill("a", "b")
    with pytest.raises(TypeError, match="string or an integer"):
        Template({"delta": SLOT}).fill(True)  # JSON's true, not Python's True


def sent(view: Callable[[Event], Any], run: Run) -> list[Frame]:
    return [frame for event in run.live for frame in view(event)]


VIEWS: dict[str, Callable[[], Callable[[Event], Any]]] = {
    "chat completions": lambda: ChatCompletionChunks("chatcmpl-1", "a", 1, include_usage=True),
    "responses": lambda: ResponseEvents.begin("run_1", model="a", created_at=1.0),
    "ai sdk": lambda: UIMessageChunks("run_1"),
    "ag-ui": lambda: AGUIEvents("thread_1", "run_1"),
    "public chat": lambda: (
        ChatView(
            ChatPolicy(protocol_v1=True), output_blocks=["a"], run_block="a", conversation_id="c"
        ).frames
    ),
}


@given(agent_runs())
def test_every_token_frame_a_view_writes_itself_is_what_the_encoder_writes(run: Run) -> None:
    """A view's JSON text is read back as the data of its frame, which the encoder writes
    as that very text; and the tokens' frames are the ones written so."""
    for name, make in VIEWS.items():
        frames = sent(make(), run)
        written = [frame for frame in frames if type(frame) is JSONText]
        for frame in written:
            assert to_json(json.loads(frame)) == frame, name
        tokens = [e for e in run.live if isinstance(e, TextDelta) and e.delta]
        # The public chat makes a frame of the first token a step shows, then writes.
        first = len(run.texts) if name == "public chat" else 0
        assert len(written) >= len(tokens) - first, f"{name}: a token's frame is written"
