"""The shared live log's codec: a run's tokens packed into one entry come back equal, any
text (half a surrogate pair included) and any time, each run's in order (runs taken
together, as a batch takes them)."""

from __future__ import annotations

from dataclasses import fields

from hypothesis import example, given
from hypothesis import strategies as st

from agentstream.cluster.wire import event_of, packed_events, tokens_json
from agentstream.events import Event, ReasoningDelta, TextDelta

texts = st.text(st.characters() | st.sampled_from(["\ud800", "\udfff", "\n", '"', "\\"]))


@given(
    deltas=st.lists(texts, min_size=1, max_size=20),
    times=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=20, max_size=20),
    runs=st.lists(st.sampled_from(["run_a", "run_b", "run ☃"]), min_size=20, max_size=20),
)
@example(deltas=["a", "\ud800"], times=[1.5] * 20, runs=["run_a"] * 20)  # a pack with one
def test_tokens_come_back_equal_and_each_runs_in_order(
    deltas: list[str], times: list[float], runs: list[str]
) -> None:
    seqs: dict[str, int] = {}
    tokens: list[TextDelta] = []
    for delta, ts, run_id in zip(deltas, times, runs, strict=False):
        seqs[run_id] = seqs.get(run_id, 0) + 1
        tokens.append(TextDelta(run_id=run_id, seq=seqs[run_id], ts=ts, step=1, delta=delta))
    read: list[Event] = []
    for packed, last, payload in tokens_json(sorted(tokens, key=lambda token: token.run_id)):
        entry = packed_events(payload) if packed else [event_of(payload)]
        assert entry[-1] == last, "an entry is keyed by its last token's seq"
        read += entry
    for run_id in seqs:
        assert [e for e in read if e.run_id == run_id] == [t for t in tokens if t.run_id == run_id]


def test_a_pack_carries_every_field_of_a_token() -> None:
    """A pack writes a token's fields by name (``wire._Pack``): a field a token gains must
    be packed too, or it is lost on its way to another process."""
    packed = {"run_id", "seq", "ts", "block_id", "step", "type", "delta"}
    assert {field.name for field in fields(ReasoningDelta)} == packed
    assert {field.name for field in fields(TextDelta)} == packed | {"separator"}, (
        "a separator is never packed (a token with one goes alone)"
    )
