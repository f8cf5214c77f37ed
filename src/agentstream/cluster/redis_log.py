"""The live log shared by the processes of a cluster: one Redis stream per run.

The process that executes a run keeps its in-process log (its own viewers read that, at no
cost) and mirrors it here, so any other process can follow the run with ``XREAD BLOCK``.
Entries are keyed by seq (``<seq>-0``), so a viewer resumes from any seq: an event (``e``),
or a run's consecutive tokens packed (``p``, keyed by the last one's seq). Two markers frame
a part of a run: ``<base>-1`` opens it (``open``: the seq it follows) and ``<last>-2``
closes it (``end``).

The in-process log tells this mirror that a stream has events it has not taken, once until
it takes them (``runlog.Mirror``), and a batch reads them from the stream as that log keeps
them: its packs of tokens (``runlog.Deltas``) become packs here (``Pack``) from slices of
their arrays and text, and the tokens it keeps as they came are packed too, so a run's
consecutive tokens go as one entry however many runs write at once; a token costs its run
one test, not a call. Batches are sent by one task per process, each one call of a script
that applies it inside Redis: while a batch is on its way the next one gathers, for
``GATHER`` seconds from the start of the one before at least while it holds a change of a
run another process follows (``followed``), ``QUIET_GATHER`` while it holds none. (The
script names its keys in its arguments: one Redis server, with replicas or not, not a Redis
Cluster.) A stream is
trimmed to its last ``max_events`` seqs (about), kept for ``IDLE_EXPIRY`` seconds after its
expiry was last renewed (every ``REFRESH_EXPIRY`` seconds while the run writes), and
``retention`` seconds after it ends. Whatever the stream no longer holds, a viewer reads
from the store (``Subscription.starts_after``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from itertools import groupby, repeat
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
from agentstream.events import Event, Token
from agentstream.runlog import Stream, pack_key

__all__ = ["Entry", "RedisLog", "RedisSubscription"]

logger = logging.getLogger(__name__)

IDLE_EXPIRY = 3600
"""Seconds a running run's stream is kept after its last write (a process that died
without anyone ending its runs leaves nothing behind for longer)."""

BATCH = 512
"""Most operations sent in one round trip (a stream entry: an event, a pack or a marker; or
a renewal of a stream's expiry, now and then): Redis runs a batch's script while every other
process's reads and writes wait (512 single events, 1.8 ms)."""

FULL = 4096
"""Most events a batch takes (tokens, mostly; a stream that alone has more is taken in
part): a batch that leaves some due for want of room is followed by the next at once."""

MAX_QUEUED = 200_000
"""Events kept pending while Redis is away: past this once a batch failed, the oldest go,
those of the streams pending longest (a viewer in another process then finds a gap and
resumes from the store). A live run's in-process log holds them anyway; this bounds what a
long outage keeps of runs that ended, and what is sent once Redis is back."""

GATHER = 0.002
"""Seconds from one batch's start to the next's at least, while a change pending is of a
run another process follows (``followed``), or opens a stream: a round trip then carries that
long's tokens of every stream, where it carried the few that came while the one before
was on its way (a round trip costs this process more CPU than the tokens in it). A viewer
in another process sees a token up to that much later (the cluster's target: p99 under 5
ms added); a batch that comes later than this after the one before, that the one before
left due (``FULL``), or that a ``sync`` waits for, goes at once."""

QUIET_GATHER = 1.0
"""``GATHER`` while no change pending is of a run another process follows: most runs are
watched only where they execute, and their tokens need reach Redis only for a viewer that
comes later (who reads them from the stream; a follower tells the run's process first,
``followed``, which then hurries). What a batch costs a stream (taking its events, a pack's
JSON, a share of the round trip) is spread over the tokens it carries: under light load,
a second's a token cost a cluster process about 5% more than the embedded one, a quarter
of a second's about 20% (docs/benchmarks.md). A process that dies loses this much of its
runs' tokens from the shared log at most (the store has the rest)."""

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
    """A stream's ``open`` (after a seq) or ``end`` (at its last seq), framed between its
    events."""

    kind: bytes
    run_id: str
    seq: int
    after: int
    """The seq the stream opened after (an end says which part it ends)."""


_Part = Event | _Marker | Pack
"""One entry of a batch."""


_Taken = tuple[Stream, int, int, bool, bool]
"""What a batch took of a stream, to put back if it fails: the stream, the number of its
first change told since it was last taken whole, how many of its events the mirror had
taken before, and whether the batch took its start and its end (a tuple: made once a
stream a batch, where a named one's constructor is a Python call)."""


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
        self._pending: dict[Stream, int] = {}
        """The streams with changes not sent yet, in the order their oldest was told (but
        for a stream a full batch took part of, which stays first), each with the number of
        its first change told since it was last taken whole (changes are numbered over
        every stream's, as told): a ``sync`` waits until none told before it is pending."""
        self._opening: set[Stream] = set()
        self._ending: set[Stream] = set()
        """The streams whose start, or end, is pending."""
        self._in_flight: list[_Taken] = []
        """The batch on its way: until it is in Redis, a ``sync`` waits for it too."""
        self._queued = anyio.Event()
        self._told = 0
        """Changes told since the start (the next one's number)."""
        self._backlog = False
        """The last batch left changes that were due (it was full): the next goes at once."""
        self._progress = anyio.Event()
        self._hurry_until = 0
        """Batches go without gathering until every change numbered below this is sent:
        those a ``sync`` waits for."""
        self._gathering: asyncio.Future[None] | None = None
        """What the writer waits on while a batch gathers: done by a timer, a ``sync``, a
        follow, or a change that hurries it."""
        self._followed: set[str] = set()
        """The streams open here that a process elsewhere follows."""
        self._urgent = False
        """The next batch goes ``GATHER``, not ``QUIET_GATHER``, after the one before: it
        holds a change of a followed run or a stream's start, a follow came, or a batch
        failed (late already). Until a batch takes all that is pending."""
        self._running = False
        """``run`` writes: ``flush`` must not beside it."""
        self._touched: dict[str, float] = {}
        """The streams opened here and not closed yet (as told, not as sent), each with
        when its expiry was last renewed (monotonic)."""
        self._apply = redis.register_script(_APPLY)

    def key(self, run_id: str) -> str:
        return f"{self._prefix}:log:{run_id}"

    # Mirror: called by the in-process log, never waiting (``runlog.Mirror``).

    def open(self, stream: Stream) -> None:
        self._touched[stream.run_id] = time.monotonic()
        self._change(stream)
        self._opening.add(stream)
        self._hurry()  # a stream's start goes without the quiet wait

    def changed(self, stream: Stream) -> None:
        """The stream has an event not taken yet (a batch takes all it has by then)."""
        self._change(stream)

    def close(self, stream: Stream) -> None:
        """The stream's end goes at once if another process follows it, else with the
        quiet batches (a viewer elsewhere that comes meanwhile hurries it: ``followed``)."""
        self._change(stream)
        self._ending.add(stream)
        self._touched.pop(stream.run_id, None)
        self._followed.discard(stream.run_id)

    def _change(self, stream: Stream) -> None:
        """The stream is pending from now if it was not; the writer is told only when
        nothing was pending (until it has sent all, it goes on by itself), and hurried by
        a followed run's first change (``_urgent`` stays until nothing is pending)."""
        if stream not in self._pending:
            self._pending[stream] = self._told
            if len(self._pending) == 1:
                self._queued.set()
            if not self._urgent and stream.run_id in self._followed:
                self._hurry()
        self._told += 1

    def followed(self, run_id: str) -> None:
        """A process elsewhere follows the run (``Notices``): if its stream is open here,
        its changes go every ``GATHER`` from now on, and what is pending goes now; if it
        ended here and its end waits in a quiet batch, that batch goes now."""
        if run_id in self._touched:
            self._followed.add(run_id)
            self._hurry()
        elif any(stream.run_id == run_id for stream in self._ending):
            self._hurry()

    def _hurry(self) -> None:
        self._urgent = True
        if self._gathering is not None:  # maybe for QUIET_GATHER: ``run`` looks again
            _release(self._gathering)

    def _held(self) -> int:
        """Events the mirror keeps while they are pending: a live run's not taken yet (its
        log holds the rest anyway), an ended run's all (its log lets go of it after
        retention, the mirror would not)."""
        return sum(
            stream.held + len(stream.recent) if stream.closed else stream.count - stream.mirrored
            for stream in self._pending
        )

    def _drop_oldest(self) -> None:
        """Redis has been away for long: keep ``MAX_QUEUED`` events at most (``_held``),
        dropping those of the streams pending longest: a live run's oldest not taken, an
        ended run's all but its start and end (the stream itself, for a stand-in holding
        no event). Starts and ends stay: a viewer elsewhere reads past the gap to the end."""
        dropped = left = max(self._held() - MAX_QUEUED, MAX_QUEUED // 10)
        kept: dict[Stream, Stream] = {}
        for stream in list(self._pending):
            if stream.closed:
                left -= min(stream.held + len(stream.recent), left)
                kept[stream] = _markers_of(stream)
            else:
                skipped = min(stream.count - stream.mirrored, left)
                stream.mirrored += skipped
                left -= skipped
                if stream.mirrored == stream.count and stream not in self._opening:
                    del self._pending[stream]
            if not left:
                break
        self._pending = {kept.get(stream, stream): first for stream, first in self._pending.items()}
        for marked in (self._opening, self._ending):
            marked.update(kept[stream] for stream in marked & kept.keys())
            marked.difference_update(kept)
        logger.error("Redis is away: %d live log writes dropped", dropped - left)

    def _oldest_pending(self) -> int:
        """The number of the oldest change not in Redis yet, pending or on its way (of the
        next one if there is none)."""
        firsts = [first for _, first, *_ in self._in_flight]
        firsts += self._pending.values()
        return min(firsts, default=self._told)

    async def sync(self) -> None:
        """Wait until what is told now is in Redis (up to ``SYNC_WAIT`` seconds), so that
        a run just started or continued here can be followed from any process at once."""
        target = self._told
        if self._oldest_pending() < target:
            self._hurry_until = max(self._hurry_until, target)
            if self._gathering is not None:
                _release(self._gathering)
        with anyio.move_on_after(SYNC_WAIT):
            while self._oldest_pending() < target:
                progress = self._progress
                await progress.wait()

    async def run(self) -> None:
        """Send what is pending, batch after batch, until cancelled; while Redis cannot be
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
        before (which started at ``started``), unless that one left changes that were due
        or a ``sync`` waits for it. On a bare future and a timer, not in a cancel scope,
        whose timeout costs a batch more than it saves."""
        while (
            (gathering := started + (GATHER if self._urgent else QUIET_GATHER) - loop.time()) > 0
            and not self._backlog
            and not (self._hurry_until and self._hurrying())
        ):
            self._gathering = loop.create_future()
            timer = loop.call_later(gathering, _release, self._gathering)
            try:
                await self._gathering
            finally:
                timer.cancel()
                self._gathering = None

    def _hurrying(self) -> bool:
        """A ``sync`` waits for a change pending (else none does any more)."""
        if self._oldest_pending() < self._hurry_until:
            return True
        self._hurry_until = 0
        return False

    async def flush(self) -> None:
        """Send everything pending so far (in batches); on failure the unsent part stays
        pending, in order. Not beside ``run``: two batches on their way at once could
        arrive out of order, and the later one's writes be refused as already there (and
        the writer could be left waiting for a wake-up that a change to an empty queue
        gives only once)."""
        if self._running:
            raise RuntimeError("flush() while run() writes")
        while self._pending:
            await self._send_next()

    async def _send_next(self) -> None:
        """Send the changes of the streams pending longest, a batch of them, if any (on
        failure they stay pending, in order); once none is left, ``run`` waits for more."""
        taken, framed = self._take()  # in flight: out of reach of a drop
        if not self._pending:
            self._urgent = False  # until a change that hurries comes
        if framed:  # else nothing it took can be written (an event no JSON writes)
            self._in_flight = taken
            try:
                with telemetry.timed("write"):
                    await self._send(framed)
            except BaseException:
                self._put_back(taken)
                self._urgent = True  # late already: it goes without the quiet wait
                if self._held() > MAX_QUEUED:
                    self._drop_oldest()
                raise
            finally:
                self._in_flight = []
        if taken:
            self._progress.set()
            self._progress = anyio.Event()
        if not self._pending:
            self._queued = anyio.Event()

    def _take(self) -> tuple[list[_Taken], list[bytes]]:
        """The next batch: the changes of the streams pending longest, each stream's whole,
        up to ``BATCH`` entries (an event, a pack or a marker each) and ``FULL`` events (a
        stream that alone has more is taken in part); and the batch framed (``_framed``),
        with a renewal of the expiry of each run's stream that needs one."""
        taken: list[_Taken] = []
        parts: list[_Part] = []
        refreshes: list[bytes] = []
        events = 0
        now = time.monotonic()
        self._backlog = False
        for stream, first in list(self._pending.items()):
            room = BATCH - len(parts) - len(refreshes)
            start = stream.mirrored
            if taken and stream.count - start > FULL - events:  # it waits: no room for all
                self._backlog = True
                break
            end = min(stream.count, start + FULL - events)
            opens = stream in self._opening
            ends = end == stream.count and stream in self._ending
            own = _parts(stream, start, end, opens=opens, ends=ends)
            if len(own) > room or end < stream.count:
                if taken:
                    self._backlog = True
                    break
                if len(own) > room:  # it alone fills the batch; the rest stays first
                    own, ends = own[:room], False
                    end = start + sum(map(_events_in, own))
            taken.append((stream, first, start, opens, ends))
            stream.mirrored = end
            if opens:
                self._opening.discard(stream)
            if ends:
                self._ending.discard(stream)
            parts += own
            events += end - start
            if now - self._touched.get(stream.run_id, now) > REFRESH_EXPIRY:
                self._touched[stream.run_id] = now
                refreshes.append(_framed(_REFRESH, stream.run_id, 0))
            if end < stream.count or stream in self._ending:
                self._backlog = True
                break
            del self._pending[stream]
        return taken, _parts_framed(parts) + refreshes

    def _put_back(self, taken: list[_Taken]) -> None:
        """A batch that failed is pending again, first, before what came meanwhile."""
        later = self._pending
        self._pending = {}
        for stream, first, mirrored, opened, ended in taken:
            stream.mirrored = mirrored
            later.pop(stream, None)
            self._pending[stream] = first
            if opened:
                self._opening.add(stream)
            if ended:
                self._ending.add(stream)
        self._pending.update(later)

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

    async def seal(self, last: Event) -> None:
        """End the stream of a run whose process died: ``last``, its terminal event (with a
        seq past any of the stream's), then the end marker."""
        key = self.key(last.run_id)
        pipe = self._redis.pipeline(transaction=False)
        _, [payload] = events_json([last])
        pipe.xadd(key, {_EVENT: payload}, id=f"{last.seq}-0")
        pipe.xadd(key, {_END: 1}, id=f"{last.seq}-2")
        pipe.expire(key, self._retention)
        await pipe.execute()


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

    async def next_batch(self) -> list[Event]:
        """Every entry not yet read, waiting up to ``BLOCK_MS`` at a time for one; ``[]``
        once the end marker was read, or the stream is gone, has a gap or cannot be read
        (Redis went away): the viewer reconnects and gets the rest from the store or from
        the stream once it is back."""
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


def _parts(stream: Stream, start: int, end: int, *, opens: bool, ends: bool) -> list[_Part]:
    """A stream's changes as a batch's entries: its start; its events from the ``start``-th
    to the ``end``-th as the in-process log keeps them, packed first where its viewers have
    read them (``Stream.pack_read``, which would pack them soon anyway), a pack's tokens
    taken from its arrays and text (``Pack.kept``), those a viewer here has not read yet
    packed here (``_pack_onto``); then its end."""
    parts: list[_Part] = [_Marker(_OPEN, stream.run_id, stream.base, stream.base)] if opens else []
    stream.pack_read()
    events: list[Event] = []
    for kept in stream.kept(start, end):
        if type(kept) is not tuple:
            events.append(kept)  # type: ignore[arg-type]
            continue
        if events:
            _pack_onto(parts, events)
            events = []
        parts.append(Pack.kept(*kept))
    if events:
        _pack_onto(parts, events)
    if ends:
        parts.append(_Marker(_END, stream.run_id, stream.last_seq, stream.base))
    return parts


def _pack_onto(parts: list[_Part], events: list[Event]) -> None:
    """``events`` after ``parts``, each run of consecutive tokens (``pack_key``) onto the
    pack before it where it goes on, else packed, but for a lone token."""
    for key, group in groupby(events, pack_key):
        if type(key) is not tuple:
            parts += group
            continue
        tokens = cast(list[Token], list(group))
        if parts and type(last := parts[-1]) is Pack and last.goes_on_with(tokens[0]):
            last.extend(tokens)
        else:
            parts += [Pack.of(tokens)] if tokens[1:] else tokens


def _markers_of(stream: Stream) -> Stream:
    """A stand-in for an ended stream whose events were dropped: its start and end, no event."""
    ended = Stream(stream.run_id, stream.base)
    ended.count = ended.mirrored = stream.count
    ended.closed = True
    return ended


def _events_in(part: _Part) -> int:
    if isinstance(part, Pack):
        return len(part.ts)
    return 0 if isinstance(part, _Marker) else 1


def _parts_framed(parts: list[_Part]) -> list[bytes]:
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
