"""Events made on the hot path are the events their classes make."""

from dataclasses import fields
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentstream.events import EventAdapter, ReasoningDelta, TextDelta, Token, make_token


@given(
    st.sampled_from([TextDelta, ReasoningDelta]),
    st.text(max_size=8),
    st.integers(1, 2**40),
    st.floats(allow_nan=False),
    st.none() | st.text(max_size=8),
    st.integers(1, 100),
    st.text(max_size=8),
    st.none() | st.sampled_from(["", "\n\n"]),
)
def test_a_token_made_field_by_field_is_the_event_its_class_makes(
    kind: type[Token],
    run_id: str,
    seq: int,
    ts: float,
    block_id: str | None,
    step: int,
    delta: str,
    separator: str | None,
) -> None:
    """``make_token`` sets each field on a bare instance: every field is set (a field added
    to a token class and not to ``make_token`` fails here), to what the keyword constructor
    sets, so the two are equal, hash alike and serialize alike. A separator is a text
    token's (``None``: none given, as a pack's tokens are made)."""
    given_separator = {} if separator is None else {"separator": separator}
    made = make_token(kind, run_id, seq, ts, block_id, step, delta, **given_separator)
    extra: dict[str, Any] = given_separator if kind is TextDelta else {}
    expected = kind(
        run_id=run_id, seq=seq, ts=ts, block_id=block_id, step=step, delta=delta, **extra
    )
    assert type(made) is kind
    assert {f.name: getattr(made, f.name) for f in fields(kind)} == {
        f.name: getattr(expected, f.name) for f in fields(kind)
    }
    assert made == expected
    assert hash(made) == hash(expected)
    assert EventAdapter.dump_json(made) == EventAdapter.dump_json(expected)
