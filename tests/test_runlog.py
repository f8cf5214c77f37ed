"""The run log: any number of viewers, from any seq, through the end of the run."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
import weakref
from collections.abc import AsyncGenerator
from unittest.mock import ANY, patch

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentstream.agents import AgentSpec
from agentstream.events import (
    STEP_SEPARATOR,
    Event,
    Reasoning,
    ReasoningDelta,
    StepStarted,
    TextDelta,
)
from agentstream.providers.base import (
    ModelPart,
    ModelRequest,
    ReasoningPart,
    TextPart,
    TurnEndPart,
)
from agentstream.runlog import RunLog, _Deltas, _Stream
from agentstream.runtime.agent import AgentState, run_agent
from agentstream.runtime.context import RunContext

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def step(seq: int) -> StepStarted:
    return StepStarted(run_id="r", seq=seq, ts=0.0, step=seq)


async def read_all(log: RunLog, after: int = 0) -> list[int]:
    subscription = log.subscribe("r", after=after)
    return [event.seq async for event in subscription]


async def test_viewers_see_every_event_from_where_they_joined() -> None:
    log = RunLog(retention=60)
    log.open("r")
    log.append(step(1))
    log.append(step(2))
    seen: dict[str, list[int]] = {}

    async def view(name: str, after: int) -> None:
        seen[name] = await read_all(log, after)

    async with anyio.create_task_group() as group:
        group.start_soon(view, "early", 0)
        group.start_soon(view, "late", 1)
        await anyio.lowlevel.checkpoint()
        for seq in range(3, 6):
            log.append(step(seq))
            await anyio.lowlevel.checkpoint()
        log.close("r")

    assert seen == {"early": [1, 2, 3, 4, 5], "late": [2, 3, 4, 5]}


async def test_next_batch_returns_everything_pending_at_once() -> None:
    log = RunLog()
    log.open("r")
    subscription = log.subscribe("r")
    for seq in range(1, 4):
        log.append(step(seq))
    batch: list[Event] = await subscription.next_batch()
    assert [e.seq for e in batch] == [1, 2, 3]
    log.close("r")
    assert subscription.ended
    assert await subscription.next_batch() == []


async def test_cancelled_wait_loses_nothing() -> None:
    log = RunLog()
    log.open("r")
    subscription = log.subscribe("r")
    with anyio.move_on_after(0.01):
        await subscription.next_batch()
    log.append(step(1))
    assert [e.seq for e in await subscription.next_batch()] == [1]


async def test_a_viewer_that_stops_waiting_leaves_nothing_behind() -> None:
    """Clients that come and go while a run is quiet (a long tool call) leave no waits
    behind for its next event to wake."""
    log = RunLog()
    log.open("r")
    for _ in range(3):
        subscription = log.subscribe("r")
        with anyio.move_on_after(0.001):
            await subscription.next_batch()
        subscription.close()
    assert log._streams["r"].waiting == []


async def test_a_waiting_viewer_takes_each_new_event_in_the_task_that_appends_it() -> None:
    """What its ``take`` takes is read and the viewer waits on, never woken; what it does
    not take wakes it, and its batch starts there. Events a viewer resumed past (it saw
    more than the stream holds yet) are not offered again, nor is anything once it
    stopped waiting."""
    log = RunLog()
    log.open("r")
    taken: list[tuple[int, str | None]] = []

    def take(event: Event) -> bool:
        task = asyncio.current_task()
        taken.append((event.seq, task.get_name() if task else None))
        return event.seq != 3

    subscription = log.subscribe("r")
    viewer = asyncio.create_task(subscription.next_batch(take), name="viewer")
    await asyncio.sleep(0)

    async def run() -> None:
        for seq in (1, 2, 3, 4):
            log.append(step(seq))

    await asyncio.create_task(run(), name="run")
    assert taken == [(1, "run"), (2, "run"), (3, "run")], "4 came after it woke"
    assert [event.seq for event in await viewer] == [3, 4]

    ahead = log.subscribe("r", after=6)  # seen up to 6 elsewhere
    waiting = asyncio.create_task(ahead.next_batch(take))
    await asyncio.sleep(0)
    taken.clear()
    log.append(step(5))
    log.append(step(6))
    log.append(step(7))
    assert [seq for seq, _ in taken] == [7]
    assert not waiting.done(), "it took 7 and waits on"
    waiting.cancel()
    log.append(step(8))
    assert [seq for seq, _ in taken] == [7]
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert log._streams["r"].waiting == []
    assert [event.seq for event in await ahead.next_batch()] == [8]


async def test_an_event_one_viewer_refuses_wakes_it_alone() -> None:
    """Of three waiting viewers, the one whose ``take`` refuses an event wakes to read it,
    as does the one with no ``take``; the one that took it waits on and is offered the
    next."""
    log = RunLog()
    log.open("r")
    taken: list[int] = []

    def takes(event: Event) -> bool:
        taken.append(event.seq)
        return True

    def refuses(event: Event) -> bool:
        return False

    viewers = [log.subscribe("r") for _ in range(3)]
    taking, refusing, plain = (
        asyncio.create_task(viewers[0].next_batch(takes)),
        asyncio.create_task(viewers[1].next_batch(refuses)),
        asyncio.create_task(viewers[2].next_batch()),
    )
    await asyncio.sleep(0)
    log.append(step(1))
    assert [event.seq for event in await refusing] == [1]
    assert [event.seq for event in await plain] == [1]
    log.append(step(2))
    assert taken == [1, 2]
    assert not taking.done()
    log.close("r")
    assert await taking == []


async def test_closed_log_is_dropped_after_retention() -> None:
    log = RunLog(retention=0.01)
    log.open("r")
    log.close("r")
    assert "r" in log
    await anyio.sleep(0.05)
    assert "r" not in log
    with pytest.raises(KeyError):
        log.subscribe("r")


async def test_a_reopened_run_outlives_the_old_streams_retention() -> None:
    """A run continued after a pause gets a new stream; the paused one's timer spares it."""
    log = RunLog(retention=0.01)
    log.open("r")
    log.close("r")
    log.open("r", after=5)
    await anyio.sleep(0.05)
    assert "r" in log
    log.append(step(6))
    assert [e.seq for e in await log.subscribe("r", after=5).next_batch()] == [6]


def token(seq: int, kind: str, step_: int, block: str | None) -> Event:
    """A token of the kind: ``text``, ``first`` (a text token with a separator), ``long``
    (a text token longer than a byte can count) or ``reasoning``."""
    if kind == "long":
        return TextDelta(
            run_id="r", seq=seq, ts=seq / 7, block_id=block, step=step_, delta="é" * 300
        )
    if kind == "reasoning":
        return ReasoningDelta(
            run_id="r", seq=seq, ts=seq / 7, block_id=block, step=step_, delta=f"é{seq}"
        )
    separator = STEP_SEPARATOR if kind == "first" else ""
    return TextDelta(
        run_id="r",
        seq=seq,
        ts=seq / 7,
        block_id=block,
        step=step_,
        delta=f" w{seq}",
        separator=separator,
    )


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["text", "text", "text", "first", "long", "reasoning", "step"]),
            st.integers(1, 2),
            st.sampled_from([None, "b"]),
            st.booleans(),
            st.integers(1, 12),
        ),
        min_size=8,
        max_size=100,
    ),
    st.integers(0, 320),
    st.integers(0, 5),
    st.integers(1, 40),
    st.sampled_from([16, 20, 64, _Stream.BEHIND]),
)
def test_a_viewer_from_any_seq_gets_the_very_events_appended(
    runs: list[tuple[str, int, str | None, bool, int]],
    after: int,
    base: int,
    most: int,
    behind: int,
) -> None:
    """Older tokens are packed to save memory; what comes back out is equal to what went in,
    whatever mix of kinds, steps and blocks, from wherever a viewer joins, and for a viewer
    that reads along (now and then: each step's last flag) while the events under its
    cursor are packed, whatever a pack may hold (``most``: small, so packs fill up), and
    however far behind a viewer holds the packing up (``behind``).
    The first so many tokens of each kind read back as text (``RunLog.text``), as the viewer
    reads along, are their deltas joined.
    ``runs``: events of one kind, step and block, so many times in a row."""
    script = [
        (kind, step_, block, reads)
        for kind, step_, block, reads, times in runs
        for _ in range(times)
    ]
    appended = [
        step(seq) if kind == "step" else token(seq, kind, step_, block)
        for seq, (kind, step_, block, _) in enumerate(script, start=base + 1)
    ]

    async def replayed() -> tuple[list[Event], list[Event], list[Event]]:
        log = RunLog()
        log.open("r", after=base)
        along = log.subscribe("r", after=after)
        read_along: list[Event] = []
        for event, (*_, reads_now) in zip(appended, script, strict=True):
            log.append(event)
            if reads_now:
                check_texts(log, appended[: event.seq - base], max(after, base))
                if event.seq > after:
                    read_along += await along.next_batch()
        log.close("r")
        read_along += await along.next_batch()
        check_texts(log, appended, max(after, base))
        joined = log.subscribe("r", after=after)
        return read_along, await joined.next_batch(), await joined.next_batch()

    expected = [e for e in appended if e.seq > after]
    with patch.object(_Deltas, "MOST", most), patch.object(_Stream, "BEHIND", behind):
        assert asyncio.run(replayed()) == (expected, expected, [])


def check_texts(log: RunLog, appended: list[Event], after: int) -> None:
    """``RunLog.text`` reads back the first so many text or reasoning tokens after
    ``after``, all of them or half: their deltas joined."""
    for kind in (TextDelta, ReasoningDelta):
        deltas = [e.delta for e in appended if type(e) is kind and e.seq > after]
        for count in (len(deltas), len(deltas) // 2):
            assert log.text("r", kind, after=after, count=count) == "".join(deltas[:count])


async def test_a_viewer_that_keeps_up_reads_a_burst_as_it_was_appended() -> None:
    """An unpaced model appends tokens in bursts between two turns of the viewer: the viewer
    gets the very events, not ones made again from packs (each packed, then made again, cost
    a tenth of a stream's CPU); only what it has read is packed."""
    log = RunLog()
    log.open("r")
    viewer = log.subscribe("r")
    for first in (1, 41, 81):
        burst = [token(seq, "text", 1, None) for seq in range(first, first + 40)]
        for event in burst:
            log.append(event)
        read = await viewer.next_batch()
        assert len(read) == len(burst)
        assert all(got is sent for got, sent in zip(read, burst, strict=True))
    assert [e.seq for e in await log.subscribe("r").next_batch()] == list(range(1, 121))


@pytest.mark.parametrize(
    ("kind", "odd_one"),
    [
        ("text", ("first", 1, None)),
        ("text", ("reasoning", 1, None)),
        ("text", ("text", 2, None)),
        ("text", ("text", 1, "b")),
        ("reasoning", ("text", 1, None)),
    ],
    ids=["a separator", "another kind", "another step", "another block", "amid reasoning"],
)
async def test_tokens_read_together_join_the_pack_before_them_only_where_each_goes_on_with_it(
    kind: str, odd_one: tuple[str, int, str | None]
) -> None:
    """Read by a viewer that keeps up, a stream's tokens are packed eight at a time, onto
    the pack before them where they all go on with it; where one of them does not (the odd
    one, amid the second eight), each goes where it belongs: what comes back out is what
    went in."""
    log = RunLog()
    log.open("r")
    viewer = log.subscribe("r")
    same = (kind, 1, None)
    script = [same] * (_Stream.RECENT + 3) + [odd_one] + [same] * (_Stream.RECENT + 4)
    appended = [token(seq, *made) for seq, made in enumerate(script, start=1)]
    for event in appended:
        log.append(event)
        await viewer.next_batch()
    (stream,) = log._streams.values()
    assert [type(entry) for entry in stream.packed] == [_Deltas, type(appended[11]), _Deltas]
    assert await log.subscribe("r").next_batch() == appended


async def test_a_viewer_that_leaves_lets_the_log_pack_what_it_held_unread() -> None:
    """Kept for late viewers after the run ends, a stream does not keep as they are the
    events a slow viewer held unpacked while it read."""
    log = RunLog()
    log.open("r")
    viewer = log.subscribe("r")
    for seq in range(1, 201):
        log.append(token(seq, "text", 1, None))
    log.close("r")
    assert len(await viewer.next_batch()) == 200
    viewer.close()
    (stream,) = log._streams.values()
    assert stream.recent == []
    assert [e.seq for e in await log.subscribe("r").next_batch()] == list(range(1, 201))


@pytest.mark.parametrize("viewer", [False, True], ids=["unwatched", "a viewer that reads nothing"])
async def test_a_live_run_keeps_its_tokens_in_a_tenth_of_the_memory_of_their_events(
    viewer: bool,
) -> None:
    log = RunLog()
    log.open("r")
    stalled = log.subscribe("r") if viewer else None
    tokens = [token(seq, "text", 1, None) for seq in range(1, 10_001)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for event in tokens:
            log.append(event)
        del event
        tokens.clear()  # the log's references are the only ones left
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 8 bytes its time, 1 its length (4 when a pack holds a longer token), 6 its text
    assert kept < 10_000 * 17, f"{kept / 10_000:.1f} bytes a token"
    if stalled is not None:
        assert [e.seq for e in await stalled.next_batch()] == list(range(1, 10_001))
    assert [e.seq for e in await log.subscribe("r", after=9_990).next_batch()] == list(
        range(9_991, 10_001)
    )


class _Kept:
    """A run's store that keeps what it is given."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def append_events(self, *events: Event) -> None:
        self.events.extend(events)


async def _answer(
    model: object, store: _Kept, log: RunLog | None = None, *, sink: bool = False
) -> str:
    """The answer of a run of one agent on ``model``, live in ``log`` (one of its own, which
    nobody reads, if none is given); with ``sink``, the run's events go to ``store`` whole
    instead, as an agent block's go to its workflow."""
    if log is None:
        log = RunLog()
        log.open("r")
    agent = AgentSpec(id="a")
    if sink:
        ctx = RunContext("r", sink=lambda events: store.append_events(*events))  # type: ignore[arg-type]
    else:
        ctx = RunContext("r", log=log, store=store)  # type: ignore[arg-type]
    state = AgentState.begin(agent, [], "go")
    answer = await run_agent(ctx, agent, model, [], state=state, reasoning=True)  # type: ignore[arg-type]
    return answer.content


async def test_a_live_agent_run_keeps_its_tokens_once_in_the_log() -> None:
    """The turn's text is read back from the log at the turn's end: the agent loop keeps no
    copy of its own (as the pieces themselves, it kept about 70 bytes more a token; as
    UTF-8, about 8 more, 29 in all). What is left is the log's pack: a token's time, its
    length and its text (18 bytes)."""
    tokens = 10_000
    kept: list[int] = []

    class Talker:
        name = "talker"

        async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(tokens):
                yield TextPart(f" w{i:05}")  # a new string each time, as from a provider
            kept.append(tracemalloc.get_traced_memory()[0] - before)
            yield TurnEndPart("end_turn")

    tracemalloc.start()
    try:
        answer = await _answer(Talker(), _Kept())
    finally:
        tracemalloc.stop()
    assert answer == "".join(f" w{i:05}" for i in range(tokens))
    assert kept[0] < tokens * 19.5, f"{kept[0] / tokens:.1f} bytes a token"


@pytest.mark.parametrize(
    ("viewer", "most"),
    [("none", _Stream.RECENT), ("reading along", _Stream.RECENT), ("reading nothing", 250)],
)
async def test_a_live_agent_run_keeps_as_strings_only_the_tokens_its_viewers_have_not_read(
    viewer: str, most: int
) -> None:
    """Each token's string costs about 60 bytes: once the log has packed its copy, neither
    the log nor the agent loop keeps it (the loop kept up to 64 of them, the log 8 to 15).
    What a viewer has not read yet stays as it was appended, for it to read."""
    alive: list[weakref.ref[str]] = []
    log = RunLog()
    log.open("r")
    subscription = log.subscribe("r") if viewer != "none" else None

    class Piece(str):
        """A string that can be watched for its end."""

    class Talker:
        name = "talker"

        async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]:
            for i in range(250):
                piece = Piece(f" w{i:05}")
                alive.append(weakref.ref(piece))
                yield TextPart(piece)
                if subscription is not None and viewer == "reading along":
                    last = (await subscription.next_batch())[-1]
                    assert isinstance(last, TextDelta)
                    assert last.delta is piece
            gc.collect()
            kept = [i for i, piece in enumerate(alive) if piece() is not None]
            assert len(kept) <= most, kept
            yield TurnEndPart("end_turn")

    answer = await _answer(Talker(), _Kept(), log)
    assert answer == "".join(f" w{i:05}" for i in range(250))


@pytest.mark.parametrize("sink", [False, True], ids=["read back from the log", "kept by the turn"])
@given(
    st.lists(st.tuples(st.booleans(), st.text(st.characters(exclude_categories=()))), max_size=12)
)
async def test_a_turns_text_and_reasoning_are_their_pieces_joined_whatever_they_hold(
    sink: bool, pieces: list[tuple[bool, str]]
) -> None:
    """Any string (a lone surrogate, or half of a pair in one piece and the other half in
    the next) comes back as it went in, whether the turn's text is read back from the run's
    log or kept by the turn (as UTF-8) where the events go to another sink. The reasoning is
    settled at the first text after it: what came until then, not the reasoning after."""

    class Pieces:
        name = "pieces"

        async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]:
            for reasoning, piece in pieces:
                yield ReasoningPart(piece) if reasoning else TextPart(piece)
            yield TurnEndPart("end_turn")

    store = _Kept()
    answer = await _answer(Pieces(), store, sink=sink)
    assert answer == "".join(piece for reasoning, piece in pieces if not reasoning)
    thinking = [reasoning for reasoning, _ in pieces]
    first = thinking.index(True) if True in thinking else len(pieces)
    settled = next((i for i in range(first, len(pieces)) if not thinking[i]), len(pieces))
    thought = "".join(piece for reasoning, piece in pieces[:settled] if reasoning)
    expected = [thought] if True in thinking else []
    assert [event.text for event in store.events if type(event) is Reasoning] == expected


async def test_a_token_is_emitted_at_once_unless_an_event_ahead_of_it_is_still_on_its_way() -> None:
    """A token of the run's own goes into the log at once, with nothing to await; while a
    persisted event is still being written, the token waits for it and comes after it, its
    fields as given; once it is written, tokens go at once again."""
    written = asyncio.Event()

    class Slow(_Kept):
        async def append_events(self, *events: Event) -> None:
            await written.wait()
            await super().append_events(*events)

    log = RunLog()
    log.open("r")
    subscription = log.subscribe("r")
    ctx = RunContext("r", log=log, store=Slow())  # type: ignore[arg-type]
    assert ctx.emit_token(TextDelta, 1, "at once") is None
    assert [(e.seq, e.delta) for e in await subscription.next_batch()] == [(1, "at once")]  # type: ignore[union-attr]

    stepping = asyncio.create_task(ctx.emit(StepStarted, step=2))
    await asyncio.sleep(0)  # its write is under way
    waiting = ctx.emit_token(TextDelta, 2, "after", STEP_SEPARATOR)
    assert waiting is not None
    thinking = ctx.emit_token(ReasoningDelta, 2, "hmm")
    assert thinking is not None
    written.set()
    await asyncio.gather(stepping, waiting, thinking)
    assert await subscription.next_batch() == [
        StepStarted(run_id="r", seq=2, ts=ANY, step=2),
        TextDelta(run_id="r", seq=3, ts=ANY, step=2, delta="after", separator=STEP_SEPARATOR),
        ReasoningDelta(run_id="r", seq=4, ts=ANY, step=2, delta="hmm"),
    ]
    assert ctx.emit_token(TextDelta, 2, "at once again") is None  # nothing is on its way
