"""The live log shared by the processes of a cluster: one Redis stream per run.

The process that executes a run keeps its in-process log (its own viewers read that, at no
cost) and mirrors it here, so any other process can follow the run with ``XREAD BLOCK``.
Entries are keyed by seq (``<seq>-0``), so a viewer resumes from any seq: an event (``e``),
or a run's consecutive tokens packed (``p``, keyed by the last one's seq). Two markers frame
a part of a run: ``<base>-1`` opens it (``open``: the seq it follows) and ``<last>-2``
closes it (``end``).

Writes are queued without waiting, each run's apart, and sent in batches by one task per
process, each batch one call of a script that applies it inside Redis: while a batch is on
its way the next one gathers, for ``GATHER`` seconds from the start of the one before at
least while it holds a write of a run another process follows (``followed``),
``QUIET_GATHER`` while it holds none. A run's consecutive tokens are kept packed as they
come (``Pack``) and a batch takes what each run queued whole (the last run's in part, where
it fills the batch), so they go as one entry however many runs write at once, and a token
costs its place in a pack and its share of the pack's JSON and of one command. (The script
names its keys in its arguments: one Redis server, with replicas or not, not a Redis
Cluster.) A stream is trimmed to its last ``max_events`` seqs (about), kept for
``IDLE_EXPIRY`` seconds after its expiry was last renewed (every ``REFRESH_EXPIRY`` seconds
while the run writes), and ``retention`` seconds after it ends. Whatever the stream no
longer holds, a viewer reads from the store (``Subscription.starts_after``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, filterfalse, groupby, repeat
from operator import attrgetter
from typing import Any, NamedTuple, cast

import anyio
from redis.asyncio import Redis
from redis.exceptions import RedisError

from agentstream import telemetry
from agentstream.cluster.wire import (
    Pack,
    event_of,
    events_json,
    packed_events,
    packed_first_seq,
    packs_json,
)
from agentstream.events import TOKEN_TYPES, Event, TextDelta, Token
from agentstream.runlog import Take

__all__ = ["Entry", "RedisLog", "RedisSubscription"]

logger = logging.getLogger(__name__)

IDLE_EXPIRY = 3600
"""Seconds a running run's stream is kept after its last write (a process that died
without anyone ending its runs leaves nothing behind for longer)."""

BATCH = 512
"""Most operations sent in one round trip (a stream entry: an event, a pack or a marker; or
a renewal of a stream's expiry, now and then): Redis runs a batch's script while every other
process's reads and writes wait (512 single events, 1.8 ms)."""

FULL = 16_384
"""Writes queued (tokens, mostly) at which a batch goes without gathering, and most writes
a batch takes: under heavy load batches go about this many tokens apart, several of each
run's packed. A process at a whole core gets a round trip every few tens of milliseconds:
at 4,096 a round trip, one with 2,000 streams (60,000 tokens a second) fell behind, and
its oldest writes were dropped (``MAX_QUEUED``)."""

MAX_QUEUED = 200_000
"""Writes kept while Redis is away (or slower than the writes); past this, the oldest events
go, those of the runs queued longest, but for a stream's start and end (a viewer in another
process then finds a gap: it reads past it, as past a hole; where a restarted Redis lost the
stream's start, it resumes from the store)."""

GATHER = 0.002
"""Seconds from one batch's start to the next's at least, while a write queued is of a run
another process follows (``followed``), or opens a stream: a round trip then carries that
long's tokens of every stream, where it carried the few that came while the one before
was on its way (a round trip costs this process more CPU than the tokens in it). A viewer
in another process sees a token up to that much later (the cluster's target: p99 under 5
ms added); a batch that comes later than this after the one before, that is full already
(``FULL``), or that a ``sync`` waits for, goes at once."""

QUIET_GATHER = 1.0
"""``GATHER`` while no write queued is of a run another process follows: most runs are
watched only where they execute, and their tokens need reach Redis only for a viewer that
comes later (who reads them from the stream; a follower tells the run's process first,
``followed``, which then hurries). What a batch costs a run (its list and pack, their JSON,
a share of the round trip) is spread over the tokens it carries: under light load, at a
second a token cost a cluster process about 6% more than the embedded one, at a quarter of
a second about 15% (docs/benchmarks.md). Under heavy load a batch fills (``FULL``) and goes
sooner. A process that dies leaves this much of its runs' writes out of the shared log (and
a batch on its way): the process that ends its runs writes their persisted events there
(``Leases``), not their tokens."""

SYNC_WAIT = 2.0
"""How long ``sync`` waits for Redis before letting the caller go on regardless."""

BLOCK_MS = 2_000
"""How long one ``XREAD`` waits before checking that the stream still exists (under
redis-py's socket timeout, 5 s by default)."""

_OPEN, _EVENT, _PACK, _END, _REFRESH = b"open", b"e", b"p", b"end", b"x"

REFRESH_EXPIRY = 60.0
"""Seconds between two renewals of a running stream's expiry (``IDLE_EXPIRY``)."""

_APPLY = """
-- ARGV: maxlen, idle expiry, retention, the keys' prefix, then the batch: per operation a
-- line "<kind> <seq> <run id's length> <payload's length>", then the run id and the payload
-- (an event's JSON, or a pack's, keyed by its last seq; for an open or an end, the seq its
-- part opened after). A stream keeps about the last maxlen seqs.
-- An XADD whose id is not past the stream's last is a write sent again after a
-- connection broke mid-batch: skipped (a pack sent again with newer tokens goes in,
-- overlapping the one before: viewers skip what they have read). Other refusals are
-- returned. An end of a part other than the one the stream holds came late (a paused run
-- went on in another process, which opened the stream again): skipped.
local maxlen, idle, retention, prefix, batch = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local refused = {}
local function check(reply)
  if type(reply) == 'table' and reply.err and not string.find(reply.err, 'equal or smaller') then
    table.insert(refused, reply.err)
  end
end
local at = 1
while at <= #batch do
  local start = at
  local kind, seq, named, length, id = string.match(batch, '^(%a+) (%d+) (%d+) (%d+)\\n()', at)
  if not id or id + named + length - 1 > #batch then
    table.insert(refused, 'a malformed operation at byte ' .. start .. ': the rest was skipped')
    break
  end
  local key = prefix .. string.sub(batch, id, id + named - 1)
  local payload = string.sub(batch, id + named, id + named + length - 1)
  at = id + named + length
  if kind == 'e' or kind == 'p' then
    local oldest = math.max(seq - maxlen, 0)
    check(redis.pcall('XADD', key, 'MINID', '~', oldest, seq .. '-0', kind, payload))
  elseif kind == 'open' then
    redis.call('DEL', key)
    check(redis.pcall('XADD', key, seq .. '-1', 'open', seq))
    redis.call('EXPIRE', key, idle)
  elseif kind == 'end' then
    local head = redis.pcall('XRANGE', key, '-', '+', 'COUNT', 1)
    check(head)
    local first = not head.err and head[1]
    if not (first and first[2][1] == 'open' and first[2][2] ~= payload) then
      check(redis.pcall('XADD', key, seq .. '-2', 'end', 1))
      redis.call('EXPIRE', key, retention)
    end
  elseif kind == 'x' then
    redis.call('EXPIRE', key, idle)
  else
    table.insert(refused, 'an unknown operation ' .. kind .. ' at byte ' .. start)
  end
end
return refused
"""

Entry = tuple[bytes, dict[bytes, bytes]]
"""A stream entry as redis-py returns it (no decoding): its id and fields."""


class _Marker(NamedTuple):
    """A stream's ``open`` (after a seq) or ``end`` (at its last seq), queued between its
    events."""

    kind: bytes
    run_id: str
    seq: int
    after: int
    """The seq the stream opened after (an end says which part it ends)."""


_Queued = Event | _Marker
"""One change of a stream, queued to be sent."""


class _Pending(list[Event | _Marker | Pack]):
    """A run's changes not sent yet, in order (its consecutive tokens in packs, a lone one
    as an event), with how many writes they are and the number of the first or a smaller
    one (writes are numbered over every run's, as queued: a run's next after ``k`` of its
    own has at least ``first + k``): a ``sync`` waits until none of its run's queued
    before it is pending."""

    __slots__ = ("first", "writes")

    def __init__(self, first: int) -> None:
        super().__init__()
        self.first = first
        self.writes = 0

    def split_off(self, parts: int, writes: int) -> _Pending:
        """Its first ``parts`` parts at most and ``writes`` writes at most (a pack split if
        need be), taken out."""
        head = _Pending(self.first)
        whole = 0
        for part in self[:parts]:
            size = len(part.ts) if type(part) is Pack else 1
            if head.writes + size > writes:
                break
            head.writes += size
            whole += 1
        head += self[:whole]
        del self[:whole]
        if whole < parts and self and head.writes < writes:  # a pack, split
            split = cast(Pack, self[0]).split_off(writes - head.writes)
            head.append(split)
            head.writes += len(split.ts)
        self.first += head.writes
        self.writes -= head.writes
        return head


class RedisLog:
    """Mirrors this process's run streams into Redis and reads any process's back."""

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        retention: float,
        max_events: int,
        followers: Redis | None = None,
    ) -> None:
        """``followers``: the client whose connections viewers use (to find a stream, then
        to block on ``XREAD``), so that many of them never take the connections writes
        need, nor are refused one when more arrive at once than ``redis`` pools; default
        ``redis``."""
        self._redis = redis
        self._followers = followers or redis
        self._prefix = prefix
        self._retention = max(1, round(retention))
        self._max_events = max_events
        self._pending: dict[str, _Pending] = {}
        """Each run's changes not sent yet; the runs in the order their oldest was queued
        (but for a run a full batch took part of, which stays where it was)."""
        self._in_flight: list[tuple[str, _Pending]] = []
        """The batch on its way: until it is in Redis, a ``sync`` of a run in it waits for it
        too."""
        self._queued = anyio.Event()
        self._pushed = self._gone = 0
        """Writes queued since the start (the next one's number), and those of them taken
        by a batch or dropped."""
        self._full_at = 0
        """``_pushed`` at which the pending writes are a full batch, or too many
        (``_count_gone``)."""
        self._count_gone(0)
        self._progress = anyio.Event()
        self._hurried: Counter[str] = Counter()
        """The runs a ``sync`` waits for (by how many): their writes go first in the next
        batch, which goes without gathering."""
        self._gathering: asyncio.Future[None] | None = None
        """What the writer waits on while a batch gathers: done by a timer, a ``sync``, a
        follow, a write that hurries it, or a batch grown full."""
        self._followed: set[str] = set()
        """The streams open here that a process elsewhere follows."""
        self._urgent = False
        """The next batch goes ``GATHER``, not ``QUIET_GATHER``, after the one before: it
        holds a write of a followed run or a stream's start, a follow came, or a batch
        failed (late already). Until a batch takes all that is queued."""
        self._running = False
        """``run`` writes: ``flush`` must not beside it."""
        self._touched: dict[str, float] = {}
        """The streams opened here and not closed yet (as queued, not as sent), each with
        when its expiry was last renewed (monotonic)."""
        self._apply = redis.register_script(_APPLY)

    def key(self, run_id: str) -> str:
        return f"{self._prefix}:log:{run_id}"

    # Mirror: called by the in-process log, in order, never waiting.

    def open(self, stream_id: str, *, after: int) -> None:
        self._touched[stream_id] = time.monotonic()
        self.append(_Marker(_OPEN, stream_id, after, after))
        self._hurry()  # a stream's start goes without the quiet wait

    def append(self, change: _Queued) -> None:
        """Queue an event (or a marker) behind its run's, a token onto the run's token or
        pack before it where it goes on (``Pack``); the writer is told only when nothing
        was pending: until it has sent all, it goes on by itself."""
        pending = self._pending.get(change.run_id)
        if pending is None:
            self._pending[change.run_id] = pending = _Pending(self._pushed)
            pending.append(change)
            if len(self._pending) == 1:
                self._queued.set()
            if not self._urgent and change.run_id in self._followed:
                self._hurry()  # until nothing is pending: a run's first write is enough
        else:
            last: Any = pending[-1]  # a run's list pending is never empty
            token: Any = change  # read as a token only where it is one
            if (
                type(last) is Pack
                and last.type is TOKEN_TYPES.get(type(token))
                and last.seq + len(last.ts) == token.seq  # no hole: an event not written
                and last.block_id == token.block_id
                and last.step == token.step
                and not (type(token) is TextDelta and token.separator)
            ):
                last.ts.append(token.ts)
                last.deltas.append(token.delta)
            elif type(token) is type(last) and type(token) in TOKEN_TYPES and _go_on(last, token):
                pending[-1] = last = Pack.of(last)
                last.ts.append(token.ts)
                last.deltas.append(token.delta)
            else:
                pending.append(change)
        pending.writes += 1
        self._pushed += 1
        if self._pushed >= self._full_at:
            if self._held > MAX_QUEUED:
                self._drop_oldest()
            elif self._gathering is not None:
                _release(self._gathering)  # full: it goes without gathering

    def close(self, stream_id: str, *, after: int, last: int) -> None:
        """The stream's end goes at once if another process follows it, else with the
        quiet batches (a viewer elsewhere that comes meanwhile hurries it: ``followed``)."""
        self.append(_Marker(_END, stream_id, last, after))
        self._touched.pop(stream_id, None)
        self._followed.discard(stream_id)

    def followed(self, run_id: str) -> None:
        """A process elsewhere follows the run (``Notices``): if its stream is open here,
        its writes go every ``GATHER`` from now on, and what is queued goes now; if it
        ended here and its end waits in a quiet batch, that batch goes now."""
        if run_id in self._touched:
            self._followed.add(run_id)
            self._hurry()
        elif run_id in self._pending:
            self._hurry()

    def _hurry(self) -> None:
        self._urgent = True
        if self._gathering is not None:  # maybe for QUIET_GATHER: ``run`` looks again
            _release(self._gathering)

    def _drop_oldest(self) -> None:
        """Redis has been away for long (or is slower than the writes): keep ``MAX_QUEUED``
        writes at most, dropping the oldest events of the runs queued longest. A stream's
        start and end stay: without them a continued run's part would land after the one
        before, and a viewer elsewhere wait for an end that never comes."""
        dropped = left = max(self._held - MAX_QUEUED, MAX_QUEUED // 10)
        for run_id, pending in list(self._pending.items()):
            head = pending.split_off(len(pending), left)
            markers = [part for part in head if type(part) is _Marker]
            pending[:0] = markers
            pending.writes += len(markers)
            pending.first = head.first
            left -= head.writes - len(markers)
            if not pending:
                del self._pending[run_id]
            if not left:
                break
        self._count_gone(dropped - left)
        logger.error(
            "%d live log writes dropped: more than %d waited for Redis (away, or slower than"
            " this process's writes)",
            dropped - left,
            MAX_QUEUED,
        )

    @property
    def _held(self) -> int:
        """Writes pending."""
        return self._pushed - self._gone

    def _count_gone(self, writes: int) -> None:
        """``writes`` more were taken by a batch or dropped (fewer, if negative: a batch
        that failed is pending again)."""
        self._gone += writes
        self._full_at = self._gone + min(FULL, MAX_QUEUED + 1)

    def _unsent(self, run_id: str, before: int) -> bool:
        """Whether a write of the run numbered below ``before`` is pending or on its way."""
        pending = self._pending.get(run_id)
        return (pending is not None and pending.first < before) or any(
            taken == run_id and pending.first < before for taken, pending in self._in_flight
        )

    async def sync(self, run_id: str) -> None:
        """Wait until the run's writes queued now are in Redis (up to ``SYNC_WAIT``
        seconds), so that a run just started or continued here can be followed from any
        process at once. They go first in the next batch, which goes at once: a start does
        not wait for the tokens every other run queued before it."""
        before = self._pushed
        if not self._unsent(run_id, before):
            return
        try:
            self._hurried[run_id] += 1
            if self._gathering is not None:
                _release(self._gathering)
            with anyio.move_on_after(SYNC_WAIT):
                while self._unsent(run_id, before):
                    await self._progress.wait()
        finally:
            self._hurried -= Counter((run_id,))

    async def run(self) -> None:
        """Send what is queued, batch after batch, until cancelled; while Redis cannot be
        reached, keep it and try again (in-process viewers carry on meanwhile)."""
        pause = 0.05
        loop = asyncio.get_running_loop()
        started = -QUIET_GATHER
        self._running = True
        try:
            while True:
                await self._queued.wait()
                await self._gathered(loop, started)
                started = loop.time()
                try:
                    await self._send_next()
                    pause = 0.05
                except (RedisError, OSError) as exc:
                    logger.warning("Redis is unreachable (%s); the live log waits", exc)
                    await anyio.sleep(pause)
                    pause = min(pause * 2, 2.0)
        finally:
            self._running = False

    async def _gathered(self, loop: asyncio.AbstractEventLoop, started: float) -> None:
        """Wait until the next batch may start: ``GATHER`` or ``QUIET_GATHER`` after the one
        before (which started at ``started``), unless it is full or a ``sync`` waits for it.
        On a bare future and a timer, not in a cancel scope, whose timeout costs a batch
        more than it saves."""
        while (
            (gathering := started + (GATHER if self._urgent else QUIET_GATHER) - loop.time()) > 0
            and self._held < FULL
            # A run a sync waits for has writes pending (maybe only newer ones: the sync
            # ends, and takes it out of ``_hurried``, in the turn its batch is in).
            and not any(run_id in self._pending for run_id in self._hurried)
        ):
            self._gathering = loop.create_future()
            timer = loop.call_later(gathering, _release, self._gathering)
            try:
                await self._gathering
            finally:
                timer.cancel()
                self._gathering = None

    async def flush(self) -> None:
        """Send everything queued so far (in batches); on failure the unsent part stays
        queued, in order. Not beside ``run``: two batches on their way at once could
        arrive out of order, and the later one's writes be refused as already there (and
        the writer could be left waiting for a wake-up that a write to an empty queue
        gives only once)."""
        if self._running:
            raise RuntimeError("flush() while run() writes")
        while self._pending:
            await self._send_next()

    async def _send_next(self) -> None:
        """Send a batch of the runs' pending writes (``_take``), if any (on failure they stay
        pending, in order); once none is left, ``run`` waits for more."""
        taken, framed = self._take()  # in flight: out of reach of the dropping in append
        if not self._pending:
            self._urgent = False  # until a write that hurries comes
        if taken:
            self._in_flight = taken
            try:
                with telemetry.timed("write"):
                    await self._send(framed)
            except BaseException:
                self._put_back(taken)
                self._urgent = True  # late already: it goes without the quiet wait
                if self._held > MAX_QUEUED:
                    self._drop_oldest()
                raise
            finally:
                self._in_flight = []
            self._progress.set()
            self._progress = anyio.Event()
        if not self._pending:
            self._queued = anyio.Event()

    def _take(self) -> tuple[list[tuple[str, _Pending]], list[bytes]]:
        """The next batch: the pending writes of the runs a ``sync`` waits for, then of
        those pending longest, up to ``BATCH`` entries (a pack, an event or a marker each)
        and ``FULL`` writes, each run's whole but the last one's, taken in part if that
        fills the batch (a run with many writes is not passed over, nor a batch sent short
        of a backlog); and the batch framed (``_framed``), with a renewal of the expiry of
        each run's stream that needs one."""
        taken: list[tuple[str, _Pending]] = []
        parts: list[Event | _Marker | Pack] = []
        refreshes: list[bytes] = []
        writes = 0
        now = time.monotonic()
        runs: Iterable[str] = list(self._pending)
        if self._hurried:  # lazily (the loop stops where the batch is full), in C
            first = [run_id for run_id in self._hurried if run_id in self._pending]
            runs = chain(first, filterfalse(self._hurried.__contains__, runs))
        for run_id in runs:
            room = BATCH - len(parts) - len(refreshes)
            if room <= 0:  # full (a renewal may take one entry past it)
                break
            pending = self._pending[run_id]
            if len(pending) <= room and pending.writes <= FULL - writes:
                del self._pending[run_id]
            else:  # its first writes fill the batch; the rest stays pending
                pending = pending.split_off(room, FULL - writes)
                if not pending:
                    break
            taken.append((run_id, pending))
            parts += pending
            writes += pending.writes
            if now - self._touched.get(run_id, now) > REFRESH_EXPIRY:
                self._touched[run_id] = now
                refreshes.append(_framed(_REFRESH, run_id, 0))
        self._count_gone(writes)
        return taken, _parts_framed(parts) + refreshes

    def _put_back(self, taken: list[tuple[str, _Pending]]) -> None:
        """A batch that failed is pending again, first, before what came meanwhile."""
        self._count_gone(-sum(earlier.writes for _, earlier in taken))
        later = self._pending
        self._pending = dict(taken)
        for run_id, pending in later.items():
            if (earlier := self._pending.get(run_id)) is not None:
                earlier += pending
                earlier.writes += pending.writes
            else:
                self._pending[run_id] = pending

    async def _send(self, framed: list[bytes]) -> None:
        """One round trip, one command: a script that applies the batch's operations in
        order. The batch goes as one argument (``_framed``), not four a token: redis-py
        spends more CPU on a command's arguments than Redis does on an ``XADD``."""
        args: list[int | str | bytes] = [self._max_events, IDLE_EXPIRY, self._retention]
        for refused in await self._apply(args=[*args, self.key(""), b"".join(framed)]):
            logger.error("The live log refused a write: %s", refused)

    async def subscribe(self, run_id: str, *, after: int) -> RedisSubscription | None:
        """Follow a run from the first event with ``seq > after``; None if Redis has no
        stream of it (it never ran in cluster mode, or ended longer ago than retention)."""
        key = self.key(run_id)
        pipe = self._followers.pipeline(transaction=False)
        pipe.xrange(key, count=1)
        pipe.xrevrange(key, count=1)
        first: list[Entry]
        last: list[Entry]
        first, last = await pipe.execute()
        if not first:
            return None
        first_fields = first[0][1]
        base = (
            int(first_fields[_OPEN]) if _OPEN in first_fields else _first_seq(first[0]) - 1
        )  # an event or a pack first: the ones before it were trimmed
        return RedisSubscription(
            self._followers,
            key,
            after=max(after, base),
            starts_after=base,
            head=_seq(last[0][0]),  # the end marker's is its terminal event's
            ended=_END in last[0][1],
        )

    async def last_seq(self, run_id: str) -> int:
        """The seq of the last entry of the run's stream (0 if there is none)."""
        last = cast(list[Entry], await self._redis.xrevrange(self.key(run_id), count=1))
        return _seq(last[0][0]) if last else 0

    async def seal(self, events: Sequence[Event]) -> None:
        """End the stream of a run whose process died: the persisted events it lacks (past
        its last seq), then the last of ``events``, the run's terminal event (with a seq past
        any of the stream's), then the end marker."""
        last = events[-1]
        key = self.key(last.run_id)
        pipe = self._redis.pipeline(transaction=False)
        for event in events:
            for payload in events_json([event])[1]:  # none for an event no JSON writes
                pipe.xadd(key, {_EVENT: payload}, id=f"{event.seq}-0")
        pipe.xadd(key, {_END: 1}, id=f"{last.seq}-2")
        pipe.expire(key, self._retention)
        for reply in await pipe.execute(raise_on_error=False):
            if isinstance(reply, RedisError) and "equal or smaller" not in str(reply):
                raise reply  # else a write the dead process's last batch made meanwhile


class RedisSubscription:
    """A viewer's cursor into a run's Redis stream (the run executes in another process)."""

    def __init__(
        self, redis: Redis, key: str, *, after: int, starts_after: int, head: int, ended: bool
    ) -> None:
        self._redis = redis
        self._key = key
        self._cursor = f"{after}-0"
        self._expected = after + 1
        """The seq that comes next unless one is missing (trimmed, or never written)."""
        self.starts_after = starts_after
        self.head = head
        self.ended = ended
        self._done = False

    async def next_batch(self, take: Take | None = None) -> list[Event]:
        """Every entry not yet read, waiting up to ``BLOCK_MS`` at a time for one; ``[]``
        once the end marker was read, or the stream is gone, has a gap or cannot be read
        (Redis went away): the viewer reconnects and gets the rest from the store or from
        the stream once it is back. Nothing is offered to ``take``: the viewer's own task
        reads Redis."""
        while not self._done:
            try:
                reply: Any = await self._redis.xread({self._key: self._cursor}, block=BLOCK_MS)
                if not reply and await self._over():
                    self._done = self.ended = True
            except (RedisError, OSError) as exc:
                logger.warning(
                    "Lost the live log of %s (%s); the viewer may resume", self._key, exc
                )
                self._done = True
                break
            if not reply:
                continue
            entries: list[Entry] = reply[0][1]
            events: list[Event] = []
            for entry_id, fields in entries:
                self._cursor = entry_id.decode()
                if _END in fields:
                    self._done = self.ended = True
                    break
                if _EVENT in fields:
                    read = [event_of(fields[_EVENT])]
                elif _PACK in fields:
                    read = packed_events(fields[_PACK])
                else:
                    continue
                first = read[0].seq
                if first > self._expected and await self._trimmed():
                    self._done = True
                    break
                # A pack it resumed within, or one that overlaps the one before (a batch
                # sent again after its reply was lost, with newer tokens of the run).
                events += read if first >= self._expected else read[self._expected - first :]
                self._expected = _seq(entry_id) + 1
            if events:
                return events
        return []

    async def _over(self) -> bool:
        """After a wait with nothing new: the stream is gone (expired, Redis restarted), or
        it ended behind this viewer's cursor (a run whose process died far ahead of the
        shared log, ended by another process at a seq the viewer had passed)."""
        last = cast(list[Entry], await self._redis.xrevrange(self._key, count=1))
        return not last or _END in last[0][1]

    async def _trimmed(self) -> bool:
        """Whether the next seq this viewer expects was trimmed away while it lagged
        behind (the stream now starts past it), rather than never written (a run's event
        that could not be stored is not published: its seq is a hole)."""
        first = cast(list[Entry], await self._redis.xrange(self._key, count=1))
        if not first or not (_EVENT in first[0][1] or _PACK in first[0][1]):
            return False
        return _first_seq(first[0]) > self._expected

    def close(self) -> None:
        self._done = True


def _release(waiting: asyncio.Future[None]) -> None:
    """End a wait, unless it ended already (timed out, released, or cancelled)."""
    if not waiting.done():
        waiting.set_result(None)


_FRAME = b"%s %d %d %d\n%s%s"
"""One operation of a batch, as ``_APPLY`` reads it: kind, seq, the lengths of the run id
and of the payload, then both."""

_RUN_ID, _SEQ = attrgetter("run_id"), attrgetter("seq")


def _framed(kind: bytes, run_id: str, seq: int, payload: bytes = b"") -> bytes:
    name = run_id.encode()
    return _FRAME % (kind, seq, len(name), len(payload), name, payload)


def _go_on(token: Token, then: Token) -> bool:
    """``then`` (of ``token``'s kind) is the token after ``token`` in one pack."""
    return (
        token.seq + 1 == then.seq
        and token.block_id == then.block_id
        and token.step == then.step
        and not (isinstance(token, TextDelta) and (token.separator or then.separator))  # type: ignore[union-attr]
    )


def _parts_framed(parts: list[Event | _Marker | Pack]) -> list[bytes]:
    """``_framed`` for the changes of some runs (each run's together, in order), a kind at
    a time, so that their JSON and framing are C's loops, not a Python call or two each."""
    framed: list[bytes] = []
    for kind, group in groupby(parts, type):
        if kind is Pack:
            packs = cast(list[Pack], list(group))
            framed += [
                _framed(_PACK, pack.run_id, pack.last_seq, payload)
                for pack, payload in zip(packs, packs_json(packs), strict=True)
            ]
        elif kind is _Marker:
            framed += [
                _framed(m.kind, m.run_id, m.seq, b"%d" % m.after)
                for m in cast(Iterator[_Marker], group)
            ]
        else:
            framed += _events_framed(cast(list[Event], list(group)))
    return framed


def _events_framed(events: list[Event]) -> Iterator[bytes]:
    """``_framed`` for each of ``events`` (of one kind), in C's loops (``map``)."""
    events, payloads = events_json(events)
    names = list(map(str.encode, map(_RUN_ID, events)))
    return map(
        _FRAME.__mod__,
        zip(
            repeat(_EVENT), map(_SEQ, events), map(len, names), map(len, payloads), names, payloads
        ),
    )


def _seq(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0])


def _first_seq(entry: Entry) -> int:
    """The seq of an entry's first event: its own, or its pack's first token's."""
    entry_id, fields = entry
    return packed_first_seq(fields[_PACK]) if _PACK in fields else _seq(entry_id)
