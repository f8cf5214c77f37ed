"""The shared live log's codec: a run's tokens packed into one entry come back equal, any
text (half a surrogate pair included) and any time, whole or split."""

from __future__ import annotations

from dataclasses import fields

from hypothesis import example, given
from hypothesis import strategies as st

from agentstream.cluster.wire import Pack, packed_events, packed_first_seq, packs_json
from agentstream.events import ReasoningDelta, TextDelta, Token

texts = st.text(st.characters() | st.sampled_from(["\ud800", "\udfff", "\n", '"', "\\"]))


@given(
    deltas=st.lists(texts, min_size=1, max_size=20),
    times=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=20, max_size=20),
    split=st.integers(min_value=1, max_value=19),
    kind=st.sampled_from([TextDelta, ReasoningDelta]),
)
@example(deltas=["a", "\ud800"], times=[1.5] * 20, split=1, kind=TextDelta)
def test_a_packs_tokens_come_back_equal_whole_or_split(
    deltas: list[str], times: list[float], split: int, kind: type[Token]
) -> None:
    """A pack written (``packs_json``, a lone surrogate's by the standard library) reads
    back (``packed_events``) as the tokens that were packed, in order; so do its two parts
    once split (a batch takes the first part of a run's pack that has more than it has
    room for)."""
    tokens = [
        kind(run_id="run ☃", seq=7 + i, ts=ts, block_id="agent", step=2, delta=delta)
        for i, (delta, ts) in enumerate(zip(deltas, times, strict=False))
    ]
    pack = Pack.of(tokens[0])
    for later in tokens[1:]:
        pack.ts.append(later.ts)
        pack.deltas.append(later.delta)
    assert pack.last_seq == tokens[-1].seq
    [whole] = packs_json([pack])
    assert packed_events(whole) == tokens
    if split < len(tokens):
        head = pack.split_off(split)
        payloads = packs_json([head, pack])
        assert [packed_events(payload) for payload in payloads] == [tokens[:split], tokens[split:]]
        assert packed_first_seq(payloads[1]) == tokens[split].seq


def test_a_pack_carries_every_field_of_a_token() -> None:
    """A pack writes a token's fields by name (``wire.Pack``): a field a token gains must
    be packed too, or it is lost on its way to another process."""
    packed = {"run_id", "seq", "ts", "block_id", "step", "type", "delta"}
    assert {field.name for field in fields(ReasoningDelta)} == packed
    assert {field.name for field in fields(TextDelta)} == packed | {"separator"}, (
        "a separator is never packed (a token with one goes alone)"
    )
