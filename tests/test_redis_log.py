"""The Redis mirror of the live log, against a real Redis: another process reads a run's
events from any seq, learns where the stream starts when older entries were trimmed, stops
at a gap rather than skip it, and gets what was written while Redis was away."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest
from redis.asyncio import BlockingConnectionPool, Redis

from agentstream.cluster import redis_log
from agentstream.cluster.notices import Notices
from agentstream.cluster.redis_log import Entry, RedisLog
from agentstream.cluster.wire import Pack, packed_events, packs_json
from agentstream.events import (
    Event,
    ReasoningDelta,
    RunCompleted,
    RunFailed,
    StepCompleted,
    StepStarted,
    Text,
    TextDelta,
    ToolCall,
)
from conftest import eventually, free_port
from processes import start_redis

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


def step(seq: int) -> StepStarted:
    return StepStarted(run_id="run_x", seq=seq, ts=0.0, step=seq)


def log_of(redis: Redis, prefix: str, **options: int) -> RedisLog:
    return RedisLog(redis, prefix=prefix, retention=60, max_events=options.get("max_events", 100))


async def until_seq(log: RedisLog, seq: int) -> bool:
    return await log.last_seq("run_x") >= seq


async def seqs(events: list[Event]) -> list[int]:
    return [event.seq for event in events]


async def read_back(redis: Redis, written: list[Event]) -> dict[str, list[Event]]:
    """``written`` appended in order (each run's stream opened before, ended after) and
    sent; then each run's events as another process reads them, to the stream's end."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    runs = list(dict.fromkeys(event.run_id for event in written))
    for run_id in runs:
        writer.open(run_id, after=0)
    for event in written:
        writer.append(event)
    for run_id in runs:
        writer.close(run_id, after=0, last=max(e.seq for e in written if e.run_id == run_id))
    await writer.flush()
    read: dict[str, list[Event]] = {}
    for run_id in runs:
        following = await reader.subscribe(run_id, after=0)
        assert following is not None
        read[run_id] = await following.next_batch()
        assert await following.next_batch() == []
        assert following.ended
    return read


async def read_from(reader: RedisLog, run_id: str, after: int) -> list[Event]:
    """What a viewer in another process reads first of the run's stream after seq
    ``after``."""
    following = await reader.subscribe(run_id, after=after)
    assert following is not None
    return await following.next_batch()


async def test_another_process_reads_a_run_from_any_seq_to_its_end(redis: Redis) -> None:
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    writer.open("run_x", after=0)
    for seq in range(1, 6):
        writer.append(step(seq))
    await writer.flush()
    following = await reader.subscribe("run_x", after=2)
    assert following is not None
    assert (following.starts_after, following.ended) == (0, False)
    assert await seqs(await following.next_batch()) == [3, 4, 5]
    writer.append(step(6))
    writer.close("run_x", after=0, last=6)
    await writer.flush()
    assert await seqs(await following.next_batch()) == [6]
    assert await following.next_batch() == []
    assert following.ended
    assert await reader.last_seq("run_x") == 6
    assert await reader.subscribe("run_y", after=0) is None, "no stream: the store has it"


def token(seq: int, run_id: str = "run_x", *, block_id: str | None = None) -> TextDelta:
    """A token whose time takes every bit of a float."""
    return TextDelta(
        run_id=run_id,
        seq=seq,
        ts=1_796_000_000 + seq / 7,
        block_id=block_id,
        step=1,
        delta=f" w{seq}",
    )


async def test_a_runs_tokens_in_a_batch_are_one_entry_read_back_from_any_seq(
    redis: Redis,
) -> None:
    """A run's consecutive tokens in one batch go as one entry (Redis adds one entry, not
    one a token), keyed by the last one's seq: a viewer that resumes within it gets the
    tokens after its seq, each equal to the one written (its time to the last bit)."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    written = {
        run_id: [token(seq, run_id) for seq in range(1, 51)] for run_id in ("run_x", "run_y")
    }
    for run_id in written:
        writer.open(run_id, after=0)
    for pair in zip(*written.values(), strict=True):  # interleaved, as live runs write
        for event in pair:
            writer.append(event)
    await writer.flush()
    assert await redis.xlen(writer.key("run_x")) == 2, "the open marker and one pack"
    for after in (0, 1, 17, 49):
        assert await read_from(reader, "run_x", after) == written["run_x"][after:]
    writer.append(token(51))
    writer.close("run_x", after=0, last=51)
    await writer.flush()
    following = await reader.subscribe("run_x", after=50)
    assert following is not None
    assert await following.next_batch() == [token(51)]
    assert await following.next_batch() == []
    assert following.ended


async def test_each_runs_tokens_go_packed_however_many_runs_write_at_once(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch takes what each run queued whole (``BATCH`` operations, here 8: four runs'
    start and pack), so a run's tokens go as one entry even when many runs' interleave,
    where a batch of the oldest writes of all runs held one token a run; a lone token goes
    as an event."""
    monkeypatch.setattr(redis_log, "BATCH", 8)
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    written = {f"run_{n}": [token(seq, f"run_{n}") for seq in range(1, 7)] for n in range(30)}
    written["run_lone"] = [token(1, "run_lone")]
    for run_id in written:
        writer.open(run_id, after=0)
    for seq in range(1, 7):  # interleaved, as live runs write
        for tokens in written.values():
            if seq <= len(tokens):
                writer.append(tokens[seq - 1])
    await writer.flush()
    for run_id, tokens in written.items():
        assert await redis.xlen(writer.key(run_id)) == 2, "the open marker and one entry"
        assert await read_from(reader, run_id, 0) == tokens


def framed(events: list[Event]) -> list[bytes]:
    """``events`` as a batch framed for the script, by a writer of their own."""
    writer = log_of(Redis(), "unused")
    for event in events:
        writer.append(event)
    _, batch = writer._take()
    return batch


@pytest.mark.parametrize("first", [1, 5], ids=["one", "packed"])
async def test_a_batch_sent_again_with_newer_tokens_is_read_once(redis: Redis, first: int) -> None:
    """A batch whose reply was lost goes again with what came meanwhile: the run's pack
    then overlaps what the first one wrote, and a viewer reads each token once, from any
    seq."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    writer.open("run_x", after=0)
    await writer.flush()
    await writer._send(framed([token(seq) for seq in range(1, first + 1)]))
    await writer._send(framed([token(seq) for seq in range(1, 10)]))  # sent again, with more
    for after in (0, first):
        assert await read_from(reader, "run_x", after) == [
            token(seq) for seq in range(after + 1, 10)
        ]


def text(seq: int, step: int, delta: str, *, separator: str = "", block_id: str = "a") -> TextDelta:
    """A text token of run_x, of block ``a`` unless said."""
    return TextDelta(
        run_id="run_x",
        seq=seq,
        ts=2 + seq / 8,
        block_id=block_id,
        step=step,
        delta=delta,
        separator=separator,
    )


async def test_tokens_of_parallel_blocks_of_steps_and_around_a_hole_come_back_in_order(
    redis: Redis,
) -> None:
    """Only tokens of one block and step, with no seq between them missing and none
    with a separator, are packed together: a workflow's blocks streaming at once, a new
    step's first token and a hole all come back as they were written, in order."""
    written: list[Event] = [
        *(token(seq, block_id="a" if seq % 3 else "b") for seq in range(1, 10)),
        token(10, block_id="a"),
        token(11, block_id="a"),
        token(13, block_id="a"),  # 12 could not be stored: a hole
        token(14, block_id="a"),
        text(15, 2, "x", separator="\n\n"),
        text(16, 2, "y", separator="\n\n"),
        text(17, 2, "z"),
        text(18, 3, "z"),
        ReasoningDelta(run_id="run_x", seq=19, ts=2.5, block_id="a", step=3, delta="r"),
        ReasoningDelta(run_id="run_x", seq=20, ts=2.5, block_id="a", step=3, delta="s"),
        text(21, 3, "t"),
        text(23, 3, "u"),  # 22 could not be stored: a hole
        text(24, 3, "v"),
        text(25, 3, "w", separator="\n\n"),
        text(26, 3, "x"),
        text(27, 3, "y"),
        text(28, 4, "z"),
        text(29, 4, "z", block_id="b"),
    ]
    assert await read_back(redis, written) == {"run_x": written}


@pytest.mark.parametrize(
    ("first", "batches"),
    [
        (step(1), [[step(seq)] for seq in range(2, 400)]),
        (token(1), [[token(seq) for seq in range(n, n + 7)] for n in range(2, 996, 7)]),
    ],
    ids=["an entry each", "packs of 7"],
)
async def test_a_trimmed_stream_says_where_it_starts_and_a_lagging_viewer_stops_at_a_gap(
    redis: Redis, first: Event, batches: list[list[Event]]
) -> None:
    """Trimming keeps about the last ``max_events`` seqs, packed or not: a late viewer
    starts at the stream's first entry (a pack's first token), and a viewer lagging behind
    it stops at the gap rather than skip it."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix, max_events=10), log_of(redis, prefix)
    writer.open("run_x", after=0)
    writer.append(first)
    await writer.flush()
    lagging = await reader.subscribe("run_x", after=0)
    assert lagging is not None
    assert await lagging.next_batch() == [first]
    for batch in batches:
        for event in batch:
            writer.append(event)
        await writer.flush()  # an entry or a pack at a time: each one trims
    late = await reader.subscribe("run_x", after=0)
    assert late is not None
    assert late.starts_after > 1, "the store has the events before the stream's first"
    assert late.starts_after + 1 in {batch[0].seq for batch in batches}
    last = batches[-1][-1].seq
    assert await seqs(await late.next_batch()) == list(range(late.starts_after + 1, last + 1))
    assert await lagging.next_batch() == [], "a gap ends the viewer (it resumes elsewhere)"
    assert not lagging.ended, "the run goes on"


async def test_a_stream_keeps_about_its_last_max_events_seqs_however_packed(
    redis: Redis,
) -> None:
    """``max_events`` counts seqs, not entries: a stream of packs is trimmed too, where
    counting entries would keep seven times as many tokens; and never below it."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix, max_events=1000), log_of(redis, prefix)
    writer.open("run_x", after=0)
    for first in range(1, 2100, 7):  # 300 packs of 7 tokens: seqs 1 to 2100
        for seq in range(first, first + 7):
            writer.append(token(seq))
        await writer.flush()
    late = await reader.subscribe("run_x", after=0)
    assert late is not None
    assert 0 < late.starts_after <= 2100 - 1000, "trimmed, to no fewer than 1,000 seqs"
    assert await seqs(await late.next_batch()) == list(range(late.starts_after + 1, 2101))


async def test_writes_made_while_redis_is_away_arrive_once_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(redis_log, "MAX_QUEUED", 100)  # past it, the newest are kept
    port = free_port()
    server = start_redis(port)
    client = Redis(port=port)
    writer = log_of(client, "test")
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(writer.run)
            writer.open("run_x", after=0)
            writer.append(step(1))
            await writer.sync("run_x")
            server.terminate()  # and it forgets everything
            server.wait(10)
            for seq in range(2, 202):
                writer.append(step(seq))
                await anyio.lowlevel.checkpoint()
            server = start_redis(port)
            await eventually(lambda: until_seq(writer, 201))
            tasks.cancel_scope.cancel()
        entries: list[Entry] = await client.xrange("test:log:run_x")  # type: ignore[assignment]
        kept = [int(entry_id.split(b"-")[0]) for entry_id, _ in entries]
    finally:
        server.terminate()
        server.wait(10)
        await client.aclose()
    assert kept == sorted(set(kept)), "in order, each once"
    assert kept[-90:] == list(range(112, 202)), "the newest, every one"
    assert len(kept) <= 102, "the oldest were dropped (the store has the persisted ones)"


async def test_a_seq_never_written_is_a_hole_a_viewer_reads_past(redis: Redis) -> None:
    """An event the run could not store is not published; its seq is missing for good."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    writer.open("run_x", after=0)
    for seq in (1, 2, 4, 5):
        writer.append(step(seq))
    writer.close("run_x", after=0, last=5)
    await writer.flush()
    following = await reader.subscribe("run_x", after=0)
    assert following is not None
    assert await seqs(await following.next_batch()) == [1, 2, 4, 5]
    assert await following.next_batch() == []
    assert following.ended


async def test_a_batch_carries_any_run_id_and_any_text_whole(redis: Redis) -> None:
    """A batch goes to Redis as one argument, each operation framed by lengths: run ids a
    client chose and texts with newlines, spaces, digits and any characters come back as
    they were, each in its own stream."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    run_ids = ["run 1 2\n3", "ünï ☃ 12 34\n", "x" * 300]
    texts = ["e 1 2 3\nend", "", "\n\n", 'naïve ☃ \U0001f600 \\ "', "7" * 5000]
    for run_id in run_ids:
        writer.open(run_id, after=0)
    for seq, text in enumerate(texts, 1):
        for run_id in run_ids:
            writer.append(TextDelta(run_id=run_id, seq=seq, ts=seq / 3, step=1, delta=text))
    for run_id in run_ids:
        writer.close(run_id, after=0, last=len(texts))
    await writer.flush()
    for run_id in run_ids:
        following = await reader.subscribe(run_id, after=0)
        assert following is not None
        events = await following.next_batch()
        assert [(e.run_id, e.seq, e.ts, e.delta) for e in events if isinstance(e, TextDelta)] == [
            (run_id, seq, seq / 3, text) for seq, text in enumerate(texts, 1)
        ]
        assert await following.next_batch() == []
        assert following.ended


async def test_a_late_end_of_a_part_does_not_end_the_part_another_process_opened(
    redis: Redis,
) -> None:
    """A run paused in one process and went on in another at once: the first process's end
    of the paused part (sent with its quiet batches) may reach Redis after the second
    opened the stream again. It is skipped: a viewer reads the part that goes on. The end
    of a part with no event, written by its own process, is not."""
    prefix = f"test-{uuid.uuid4().hex}"
    first, second, reader = log_of(redis, prefix), log_of(redis, prefix), log_of(redis, prefix)
    first.open("run_x", after=0)
    first.append(step(1))
    first.append(step(2))
    await first.flush()
    first.close("run_x", after=0, last=2)  # paused; its end is late
    second.open("run_x", after=2)
    await second.flush()
    await first.flush()
    second.append(step(3))
    await second.flush()
    following = await reader.subscribe("run_x", after=2)
    assert following is not None
    assert not following.ended
    assert await seqs(await following.next_batch()) == [3]
    second.close("run_x", after=2, last=3)
    second.open("run_y", after=4)
    second.close("run_y", after=4, last=4)
    await second.flush()
    with anyio.fail_after(10):  # a skipped end: it would wait for ever
        assert await following.next_batch() == []
    assert following.ended
    empty = await reader.subscribe("run_y", after=4)
    assert empty is not None
    assert empty.ended
    assert await empty.next_batch() == []


async def test_an_end_on_a_key_of_another_type_is_refused_and_the_batch_goes_on(
    redis: Redis,
) -> None:
    """The script reads a stream's head to place an end: on a key that is no stream (put
    there by something else), that is a refusal like the writes', not an error of the
    whole batch, which the writer would send again for ever."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer = log_of(redis, prefix)
    await redis.set(writer.key("run_w"), "not a stream")
    batch = (
        redis_log._framed(b"end", "run_w", 3, b"0")
        + redis_log._framed(b"open", "run_x", 0, b"0")
        + redis_log._framed(b"end", "run_x", 0, b"0")
    )
    refused = await writer._apply(args=[100, 3600, 60, writer.key(""), batch])
    assert refused
    assert all(r.startswith(b"WRONGTYPE") for r in refused)
    entries: list[Entry] = await redis.xrange(writer.key("run_x"))  # type: ignore[assignment]
    assert [entry_id for entry_id, _ in entries] == [b"0-1", b"0-2"]


async def test_lone_surrogates_go_through_and_the_writer_goes_on(redis: Redis) -> None:
    """A provider's JSON may carry half a surrogate pair, which pydantic neither writes
    nor reads as JSON: a token or a step's text with one comes back as it was, and the
    writes of the batch beside it and of the batches after it arrive (the writer did not
    stop at it). One in a key of a workflow's result too. An event that no JSON library
    writes (an object in a result that JSON has no form for) is left out: a hole, which the
    viewer reads past."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    written: list[Event] = [
        TextDelta(run_id="run_x", seq=1, ts=1.5, step=1, delta="plain"),
        TextDelta(run_id="run_x", seq=2, ts=1.5, step=1, delta="a\ud800b", separator="\udfff"),
        ReasoningDelta(run_id="run_x", seq=3, ts=1.5, step=1, delta="\ud83d"),
        Text(run_id="run_x", seq=4, ts=1.5, step=1, text="plaina\ud800b"),
        TextDelta(run_id="run_x", seq=5, ts=1.5, step=2, delta="\U0001f600 whole"),
        RunCompleted(run_id="run_x", seq=6, ts=1.5, result={"\ud800": 1}),
        RunCompleted(run_id="run_x", seq=7, ts=1.5, result=object()),
        RunCompleted(run_id="run_x", seq=8, ts=1.5, result={"ok": ["\udfff"]}),
    ]
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        writer.open("run_x", after=0)
        for event in written[:4]:
            writer.append(event)
        await writer.sync("run_x")
        for event in written[4:]:
            writer.append(event)
        writer.close("run_x", after=0, last=8)
        await writer.sync("run_x")
        group.cancel_scope.cancel()
    following = await reader.subscribe("run_x", after=0)
    assert following is not None
    assert await following.next_batch() == written[:6] + written[7:]
    assert await following.next_batch() == []


async def test_events_of_every_kind_and_run_interleaved_come_back_as_they_were(
    redis: Redis,
) -> None:
    """A batch is written a kind at a time (each kind's events framed together): runs
    and kinds interleaved in it still come back equal, each run's in its order."""
    written: dict[str, list[Event]] = {"run_a": [], "run_b": []}
    interleaved: list[Event] = []

    def made(seq: int, run_id: str) -> Event:
        match seq % 5:
            case 1:
                return StepStarted(run_id=run_id, seq=seq, ts=seq / 7, step=1)
            case 2:
                return ReasoningDelta(run_id=run_id, seq=seq, ts=seq / 7, step=1, delta=f"t {seq}")
            case 3:
                return TextDelta(
                    run_id=run_id, seq=seq, ts=seq / 7, step=1, delta=f"w {seq}", separator="\n\n"
                )
            case 4:
                return TextDelta(run_id=run_id, seq=seq, ts=seq / 7, step=1, delta=f" w {seq}")
            case _:
                return StepCompleted(run_id=run_id, seq=seq, ts=seq / 7, step=1)

    for seq in range(1, 23):
        for run_id in ("run_a", "run_a", "run_b") if seq % 3 else ("run_b", "run_a"):
            event = made(len(written[run_id]) + 1, run_id)
            written[run_id].append(event)
            interleaved.append(event)
    assert await read_back(redis, interleaved) == written


async def test_an_operation_the_script_cannot_read_is_refused_not_sent_again(
    redis: Redis,
) -> None:
    """What comes before it is applied, the rest is skipped and said (the writer logs it):
    a batch that failed as a whole would be sent again and again."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer = log_of(redis, prefix)
    opened = redis_log._framed(b"open", "run_x", 0)
    unknown = redis_log._framed(b"zap", "run_x", 1)
    ended = redis_log._framed(b"end", "run_x", 0)
    for bad in (b"e -1 1 0\nz", b"e 1 5 99\nrun_x{}"):  # no header; a payload cut short
        batch = opened + unknown + bad + ended
        refused = await writer._apply(args=[100, 3600, 60, writer.key(""), batch])
        assert [r.decode() for r in refused] == [
            f"an unknown operation zap at byte {len(opened) + 1}",
            f"a malformed operation at byte {len(opened + unknown) + 1}: the rest was skipped",
        ]
        entries: list[Entry] = await redis.xrange(writer.key("run_x"))  # type: ignore[assignment]
        assert [entry_id for entry_id, _ in entries] == [b"0-1"], "opened, not ended"


async def test_viewers_that_arrive_at_once_wait_for_a_followers_connection_not_for_a_refusal(
    redis_url: str,
) -> None:
    """Each viewer tells of its follow and finds the stream on the followers' client, which
    queues for a connection: on the writes' client (redis-py pools 100, and refuses the
    next), more viewers arriving at once than it pools were refused, and followed the run
    from the store alone."""
    prefix = f"test-{uuid.uuid4().hex}"
    writes = Redis.from_url(redis_url, max_connections=1)
    followers = Redis.from_pool(BlockingConnectionPool.from_url(redis_url, max_connections=2))
    log = RedisLog(writes, prefix=prefix, retention=60, max_events=100, followers=followers)
    notices = Notices(writes, prefix=prefix, followers=followers)

    async def a_viewer() -> None:  # as ``Cluster.subscribe``: the follow, then the stream
        await notices.follow("run_x")
        await log.subscribe("run_x", after=0)

    try:
        log.open("run_x", after=0)
        log.append(step(1))
        await log.flush()
        # The writes' one connection, taken: a viewer that needs one of them is refused.
        taken = await writes.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            with anyio.fail_after(10):
                async with anyio.create_task_group() as viewers:
                    for _ in range(20):
                        viewers.start_soon(a_viewer)
        finally:
            await writes.connection_pool.release(taken)
    finally:
        await followers.aclose()
        await writes.aclose()


def timed_batches(writer: RedisLog) -> list[float]:
    """When each of the writer's batches starts, from now on."""
    starts: list[float] = []
    send = writer._send

    async def timed(framed: list[bytes]) -> None:
        starts.append(anyio.current_time())
        await send(framed)

    writer._send = timed  # type: ignore[method-assign]
    return starts


async def a_burst(writer: RedisLog, starts: list[float], first: int) -> tuple[int, float]:
    """200 tokens of run_x, 0.1 ms or more apart, from seq ``first``: how many batches
    started meanwhile, and how long it took."""
    starts.clear()
    began = anyio.current_time()
    for seq in range(first, first + 200):
        writer.append(TextDelta(run_id="run_x", seq=seq, ts=0.0, step=1, delta="x"))
        await anyio.sleep(0.0001)
    return len(starts), anyio.current_time() - began


async def test_under_load_a_round_trip_carries_a_few_milliseconds_of_tokens(redis: Redis) -> None:
    """A run's tokens come while the batch before is on its way: the next batch starts
    ``GATHER`` after the one before at the earliest (unless a ``sync`` waits for it) while
    another process follows the run, ``QUIET_GATHER`` while none does, so round trips do
    not follow the tokens' pace (each costs more CPU than the tokens in it); a follow
    hurries what is queued. Nothing is lost or reordered."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix, max_events=10_000), log_of(redis, prefix)
    starts = timed_batches(writer)
    writer.open("run_x", after=0)
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        await writer.sync("run_x")  # the stream is open in Redis
        quiet, quiet_for = await a_burst(writer, starts, 1)
        writer.followed("run_x")
        hurried, hurried_for = await a_burst(writer, starts, 201)
        await writer.sync("run_x")  # the rest at once
        group.cancel_scope.cancel()
    # Counted over the whole burst, not gap by gap: a batch that the machine held up
    # leaves a shorter gap to the next one.
    assert quiet <= 1 + quiet_for / redis_log.QUIET_GATHER, (quiet, quiet_for)
    assert hurried <= 1 + hurried_for / redis_log.GATHER, (hurried, hurried_for)
    assert hurried > 2
    assert hurried > quiet
    following = await reader.subscribe("run_x", after=0)
    assert following is not None
    assert await seqs(await following.next_batch()) == list(range(1, 401))


async def test_a_follow_that_comes_while_a_runs_end_waits_hurries_it(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that ended here with nobody following it elsewhere has its end sent with the
    quiet batches; a viewer elsewhere that comes meanwhile gets it at once, not up to
    ``QUIET_GATHER`` later. The run is not followed from then on: it has ended."""
    monkeypatch.setattr(redis_log, "QUIET_GATHER", 60.0)
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    writer.open("run_x", after=0)
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        await writer.sync("run_x")
        writer.append(step(1))
        writer.close("run_x", after=0, last=1)
        await anyio.sleep(0.05)
        assert await reader.last_seq("run_x") == 0, "quiet: it gathers for QUIET_GATHER"
        writer.followed("run_x")
        await eventually(lambda: until_seq(reader, 1))  # not QUIET_GATHER (60 s)
        group.cancel_scope.cancel()
    subscription = await reader.subscribe("run_x", after=0)
    assert subscription is not None
    assert subscription.ended, "its end marker is in the stream"
    assert writer._followed == set()


async def test_a_follow_from_another_process_hurries_the_runs_writes(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A viewer elsewhere tells the run's process (``Notices.follow``) before it reads the
    run's stream: what the run wrote goes at once, not after ``QUIET_GATHER``, and so do
    its writes from then on. A follow of a run not open here is ignored."""
    monkeypatch.setattr(redis_log, "QUIET_GATHER", 60.0)
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    notices, elsewhere = Notices(redis, prefix=prefix), Notices(redis, prefix=prefix)
    cancelled: list[tuple[str, str]] = []
    writer.open("run_x", after=0)
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        listening = anyio.Event()
        group.start_soon(
            lambda: notices.listen(
                lambda *cancel: cancelled.append(cancel), writer.followed, ready=listening
            )
        )
        await listening.wait()
        await writer.sync("run_x")
        writer.append(step(1))
        await anyio.sleep(0.05)
        assert await reader.last_seq("run_x") == 0, "quiet: it gathers for QUIET_GATHER"
        await elsewhere.follow("run_y")  # not open here
        await elsewhere.follow("run_x")
        await eventually(lambda: until_seq(reader, 1))  # not QUIET_GATHER (60 s)
        writer.append(step(2))
        await eventually(lambda: until_seq(reader, 2))
        await elsewhere.cancel("run_x", "Stop")

        async def heard() -> bool:
            return bool(cancelled)

        await eventually(heard)
        group.cancel_scope.cancel()
    assert writer._followed == {"run_x"}
    assert cancelled == [("run_x", "Stop")], "a cancel is no follow"


async def test_a_follow_counts_from_the_streams_start_to_its_end(redis: Redis) -> None:
    """A follow that comes before the stream's start is sent (a run continued where no
    ``sync`` waits) is kept; once the stream ends here, it is forgotten."""
    writer = log_of(redis, f"test-{uuid.uuid4().hex}")
    writer.open("run_x", after=0)
    writer.followed("run_x")  # nothing sent yet
    writer.append(step(1))
    assert writer._followed == {"run_x"}
    writer.close("run_x", after=0, last=1)
    assert writer._followed == set()
    writer.followed("run_x")
    assert writer._followed == set(), "no longer open here"


async def test_a_batch_that_a_sync_waits_for_goes_without_gathering(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run just started here can be followed from any process once ``sync`` returns:
    the batch with its start goes at once, however long batches gather."""
    monkeypatch.setattr(redis_log, "GATHER", 60.0)
    monkeypatch.setattr(redis_log, "QUIET_GATHER", 60.0)
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        writer.open("run_x", after=0)
        await writer.sync("run_x")  # the first batch: nothing before it to wait for
        writer.append(step(1))
        await anyio.sleep(0.05)  # the next batch gathers
        with anyio.fail_after(1):  # not SYNC_WAIT (2 s), which gives up waiting
            await writer.sync("run_x")
        group.cancel_scope.cancel()
    assert await reader.last_seq("run_x") == 1


async def test_a_batch_that_fails_on_its_way_is_kept_within_the_bound(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes that came while a batch was on its way, and the batch, which failed: each
    run's are pending again in order, the batch's first, and the newest ``MAX_QUEUED`` of
    them are kept."""
    monkeypatch.setattr(redis_log, "MAX_QUEUED", 110)
    writer = log_of(redis, f"test-{uuid.uuid4().hex}")

    async def failing(framed: list[bytes]) -> None:
        for seq in range(51, 151):  # came meanwhile
            writer.append(step(seq))
        writer.append(StepStarted(run_id="run_y", seq=1, ts=0.0, step=1))
        raise ConnectionError("Redis went away")

    writer._send = failing  # type: ignore[method-assign]
    for seq in range(1, 51):
        writer.append(step(seq))
    writer.append(StepStarted(run_id="run_z", seq=1, ts=0.0, step=1))
    with pytest.raises(ConnectionError):
        await writer.flush()
    pending = {run_id: [op.seq for op in ops] for run_id, ops in writer._pending.items()}
    assert pending == {"run_x": list(range(43, 151)), "run_z": [1], "run_y": [1]}
    assert list(pending) == ["run_x", "run_z", "run_y"], "the batch's runs first"
    assert writer._held == 110, "the oldest writes of the runs pending longest were dropped"


async def test_a_full_batch_goes_without_gathering(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog (what was kept while Redis was away, a burst) goes batch after batch, and
    so does a batch that grows full while the writer gathers: a batch that cannot grow
    does not wait for more."""
    monkeypatch.setattr(redis_log, "GATHER", 60.0)
    monkeypatch.setattr(redis_log, "QUIET_GATHER", 60.0)
    monkeypatch.setattr(redis_log, "FULL", 10)
    writer = log_of(redis, f"test-{uuid.uuid4().hex}")
    writer.open("run_x", after=0)
    for seq in range(1, 40):
        writer.append(step(seq))
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        await eventually(lambda: until_seq(writer, 39))  # not GATHER (60 s) a batch
        writer.append(step(40))  # the writer gathers, for QUIET_GATHER (60 s)
        await anyio.sleep(0.05)
        for seq in range(41, 50):
            writer.append(step(seq))
        await eventually(lambda: until_seq(writer, 49))
        group.cancel_scope.cancel()


async def test_a_runs_backlog_goes_in_packs_of_at_most_full_writes(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch takes ``FULL`` writes at most (here 10), a run's last in part, whatever room
    is left for entries (``BATCH``, here 4): a backlog (kept while Redis was away) goes as
    packs of that many tokens, each read once, in order, from any seq."""
    monkeypatch.setattr(redis_log, "FULL", 10)
    monkeypatch.setattr(redis_log, "BATCH", 4)
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    writer.open("run_x", after=0)
    written = [token(seq) for seq in range(1, 26)]
    for event in written:
        writer.append(event)
    await writer.flush()
    assert await redis.xlen(writer.key("run_x")) == 4, "the open marker and packs of 9, 10, 6"
    for after in (0, 9, 10, 24):
        assert await read_from(reader, "run_x", after) == written[after:]


async def test_a_sync_waits_for_its_runs_writes_alone_which_go_first(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``sync`` returns once the writes its run queued before it are in Redis, batch
    after batch (``BATCH`` operations each, here 4) without gathering, however long
    batches gather. They go first: the writes other runs queued before them do not hold
    them up (a start waits for its own stream only), and go with the batches later."""
    monkeypatch.setattr(redis_log, "GATHER", 60.0)
    monkeypatch.setattr(redis_log, "QUIET_GATHER", 60.0)
    monkeypatch.setattr(redis_log, "BATCH", 4)
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    runs = [f"run_{n}" for n in range(10)]
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        for run_id in runs:
            writer.open(run_id, after=0)
        await anyio.sleep(0.05)  # the first batch went, the next gathers
        for seq in range(1, 7):
            writer.append(StepStarted(run_id="run_9", seq=seq, ts=0.0, step=seq))
        with anyio.fail_after(1):  # not SYNC_WAIT (2 s), which gives up waiting
            await writer.sync("run_9")
        writer.append(StepStarted(run_id="run_9", seq=7, ts=0.0, step=7))
        await anyio.sleep(0.05)
        group.cancel_scope.cancel()
    assert await reader.last_seq("run_9") == 6, "queued after the sync: it gathers"
    opened = [bool(await redis.exists(writer.key(run_id))) for run_id in runs[:9]]
    assert opened == [True] * 5 + [False] * 4, "the first batch's four, one beside run_9's"


async def test_a_sync_that_gives_up_or_is_cancelled_leaves_no_run_hurried(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``sync`` that gave up waiting (``SYNC_WAIT``: Redis is slow or away), or whose
    caller was cancelled, leaves its run no longer put first: the batches gather again."""
    monkeypatch.setattr(redis_log, "SYNC_WAIT", 0.05)
    writer = log_of(redis, f"test-{uuid.uuid4().hex}")
    send, arrives = writer._send, anyio.Event()

    async def slow(framed: list[bytes]) -> None:
        await arrives.wait()
        await send(framed)

    writer._send = slow  # type: ignore[method-assign]
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        writer.open("run_x", after=0)
        with anyio.fail_after(1):
            await writer.sync("run_x")  # gives up: the batch is still on its way
        assert not writer._hurried
        writer.open("run_y", after=0)
        with anyio.move_on_after(0.01) as waiting:
            await writer.sync("run_y")
        assert waiting.cancelled_caught
        assert not writer._hurried
        arrives.set()
        group.cancel_scope.cancel()


async def test_a_sync_waits_for_the_batch_on_its_way(redis: Redis) -> None:
    """A batch taken and not yet in Redis is no longer pending, but a ``sync`` still waits
    for it: a run just started can be followed from any process once ``sync`` returns."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    send, on_its_way, arrives = writer._send, anyio.Event(), anyio.Event()

    async def slow(framed: list[bytes]) -> None:
        on_its_way.set()
        await arrives.wait()
        await send(framed)

    writer._send = slow  # type: ignore[method-assign]
    synced = anyio.Event()

    async def sync() -> None:
        await writer.sync("run_x")
        synced.set()

    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        writer.open("run_x", after=0)
        writer.append(step(1))
        await on_its_way.wait()
        group.start_soon(sync)
        await anyio.sleep(0.05)
        assert not synced.is_set(), "the batch is on its way"
        arrives.set()
        with anyio.fail_after(1):  # not SYNC_WAIT (2 s), which gives up waiting
            await synced.wait()
        group.cancel_scope.cancel()
    assert await reader.last_seq("run_x") == 1


async def test_a_runs_pack_is_split_where_a_drop_or_a_batch_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run's pending tokens are one pack; past ``MAX_QUEUED`` (here 20) its oldest
    tokens are dropped from it, and a batch of ``FULL`` writes (here 5) takes its first
    ones: what is left goes on from the next seq, every token once."""
    monkeypatch.setattr(redis_log, "MAX_QUEUED", 20)
    monkeypatch.setattr(redis_log, "FULL", 5)
    writer = log_of(Redis(), "unused")  # nothing is sent
    written = [token(seq) for seq in range(1, 31)]
    for event in written:
        writer.append(event)
    [pack] = writer._pending["run_x"]
    assert isinstance(pack, Pack)
    kept = len(pack.ts)
    assert writer._held == writer._pending["run_x"].writes == kept <= 20
    assert packed_events(packs_json([pack])[0]) == written[-kept:], "the newest, in order"
    taken, batch = writer._take()
    [(_, [head])] = taken
    assert isinstance(head, Pack)
    assert packed_events(packs_json([head])[0]) == written[-kept : -kept + 5]
    assert len(batch) == 1
    assert packed_events(packs_json([pack])[0]) == written[-kept + 5 :]
    assert writer._held == kept - 5


async def test_a_batch_is_filled_with_the_first_writes_of_a_run_that_does_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch takes each run's writes whole while they fit, and fills what is left of it
    (``FULL`` writes, here 10) with the first writes of the next run: a run with a backlog
    shrinks batch after batch, even while a run that a ``sync`` waits for, with a token
    more each time, goes first in every batch (under heavy load, where starts sync all
    the time, it was passed over, and its writes piled up until the oldest were dropped)."""
    monkeypatch.setattr(redis_log, "FULL", 10)
    writer = log_of(Redis(), "unused")  # nothing is sent
    backlog = [token(seq, "run_b") for seq in range(1, 26)]
    for event in backlog:
        writer.append(event)
    writer._hurried["run_a"] += 1
    batches: list[list[tuple[str, int]]] = []
    sent: list[Event] = []
    for seq in range(1, 5):
        writer.append(token(seq, "run_a"))
        taken, _ = writer._take()
        batches.append([(run_id, pending.writes) for run_id, pending in taken])
        for run_id, pending in taken:
            if run_id == "run_b":
                [pack] = pending
                assert isinstance(pack, Pack)
                sent += packed_events(packs_json([pack])[0])
    assert batches == [
        [("run_a", 1), ("run_b", 9)],
        [("run_a", 1), ("run_b", 9)],
        [("run_a", 1), ("run_b", 7)],
        [("run_a", 1)],
    ]
    assert sent == backlog, "every token of the backlog once, in order"
    assert "run_b" not in writer._pending


async def test_a_batch_whose_last_entry_went_to_a_renewal_takes_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that fills a batch's last entries (``BATCH``, here 4) and whose stream's
    expiry is due for renewal takes one entry more; the next run waits for the next batch,
    none of its writes squeezed in (a batch is one script that Redis runs while every other
    process waits)."""
    monkeypatch.setattr(redis_log, "BATCH", 4)
    writer = log_of(Redis(), "unused")  # nothing is sent
    for seq in range(1, 5):
        writer.append(StepStarted(run_id="run_a", seq=seq, ts=0.0, step=seq))
    writer._touched["run_a"] = time.monotonic() - redis_log.REFRESH_EXPIRY - 1
    for seq in range(1, 11):
        writer.append(StepStarted(run_id="run_b", seq=seq, ts=0.0, step=seq))
    taken, framed = writer._take()
    assert [(run_id, pending.writes) for run_id, pending in taken] == [("run_a", 4)]
    assert len(framed) == 5, "its four events and the renewal"
    assert writer._pending["run_b"].writes == 10


async def test_a_dead_processs_run_is_sealed_with_the_events_its_stream_lacks(
    redis: Redis,
) -> None:
    """A run whose process died before its last writes reached Redis: the process that
    ends it writes the persisted events the stream lacks, then the terminal event, then the
    end, so a viewer elsewhere who reads the stream later misses none of them (an event no
    JSON library writes is left out, a hole; one the dead process's last batch wrote
    meanwhile is refused, and the rest goes in)."""
    prefix = f"test-{uuid.uuid4().hex}"
    writer, sealer, reader = log_of(redis, prefix), log_of(redis, prefix), log_of(redis, prefix)
    writer.open("run_x", after=0)
    for seq in (1, 2):
        writer.append(step(seq))
    await writer.flush()  # steps 3 and 4 never reached Redis: the process died
    unwritable = ToolCall(
        run_id="run_x",
        seq=4,
        ts=0.0,
        step=1,
        call_id="call_1",
        tool_name="search",
        arguments={"query": object()},
    )
    failed = RunFailed(run_id="run_x", seq=1004, ts=0.0, status="interrupted", message="gone")
    assert await sealer.last_seq("run_x") == 2
    await sealer.seal([step(2), step(3), unwritable, failed])  # 2: it landed meanwhile
    following = await reader.subscribe("run_x", after=0)
    assert following is not None
    assert await following.next_batch() == [step(1), step(2), step(3), failed]
    assert await following.next_batch() == []
    assert following.ended


async def test_past_the_bound_the_oldest_events_go_and_every_start_and_end_stays(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes kept while Redis is away, past ``MAX_QUEUED`` (here 20): the oldest events go,
    never a stream's start or end, so once Redis is back a viewer elsewhere finds each part
    opened and ended (a part with no event too), and reads the newest events, past the gap."""
    monkeypatch.setattr(redis_log, "MAX_QUEUED", 20)
    prefix = f"test-{uuid.uuid4().hex}"
    writer, reader = log_of(redis, prefix), log_of(redis, prefix)
    writer.open("run_w", after=0)  # the oldest writes: a part with no event
    writer.close("run_w", after=0, last=0)
    writer.open("run_x", after=0)
    for seq in range(1, 41):
        writer.append(step(seq))
    writer.close("run_x", after=0, last=40)
    assert writer._held <= 20
    await writer.flush()
    empty = await reader.subscribe("run_w", after=0)
    assert empty is not None, "its start stayed"
    assert empty.ended, "its end stayed"
    following = await reader.subscribe("run_x", after=0)
    assert following is not None
    kept = await seqs(await following.next_batch())
    assert kept == list(range(41 - len(kept), 41)), "the newest, in order"
    assert len(kept) < 40, "the oldest went"
    assert await following.next_batch() == []
    assert following.ended
