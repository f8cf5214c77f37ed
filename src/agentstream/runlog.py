"""The live log of runs (agent runs and workflow executions alike): each run's events in seq
order, readable from any seq by any number of viewers.

A run writes here whether or not anyone watches; an HTTP connection only subscribes. This
is the in-process log: viewers in this process read it directly, and a run's stream outlives
it for ``retention`` seconds so a late or reconnecting viewer still gets the live-only
events. In cluster mode a ``Mirror`` copies every stream where the other processes read it
(``agentstream.cluster.redis_log``).
"""

from __future__ import annotations

import asyncio
from array import array
from bisect import bisect_right
from collections.abc import AsyncIterator, Callable, Iterator
from itertools import groupby
from typing import Protocol, cast

from agentstream.events import BaseEvent, Event, ReasoningDelta, TextDelta, Token, make_token

__all__ = ["LogSubscription", "Mirror", "RunLog", "Subscription", "Take"]

Take = Callable[[Event], bool]
"""A waiting viewer's way to read each event the moment it is appended, in the task that
appends it: True if it took the event (it is read, the viewer waits on), False to be woken
and read it. It must not raise: it runs inside the run."""


class Subscription(Protocol):
    """One viewer's cursor into a run's live events, wherever the run executes."""

    @property
    def starts_after(self) -> int:
        """Events up to this seq are not in the log (a continued run's earlier part, or
        events trimmed): the store has the persisted ones."""
        ...

    @property
    def ended(self) -> bool:
        """The run's live part is over: what is left to read is all there is."""
        ...

    @property
    def head(self) -> int:
        """The seq of the last event in the log when the viewer subscribed: what comes after
        it happens while the viewer watches."""
        ...

    async def next_batch(self, take: Take | None = None) -> list[Event]:
        """Every event not yet read, waiting for at least one; ``[]`` once the run has ended
        and everything was read. Safe to cancel. While it waits, a subscription may offer
        each new event to ``take`` (the in-process log's does; one of another process's
        run does not)."""
        ...

    def close(self) -> None: ...


class Mirror(Protocol):
    """Where this process's streams are copied for other processes: told of each change in
    order, without waiting (it batches the writes)."""

    def open(self, stream_id: str, *, after: int) -> None: ...

    def append(self, event: Event) -> None: ...

    def close(self, stream_id: str, *, after: int, last: int) -> None:
        """The stream (opened after seq ``after``) ended after seq ``last``."""
        ...

    async def sync(self, stream_id: str) -> None:
        """Wait until the stream's changes told so far are visible to the other
        processes."""
        ...


class _Deltas:
    """Consecutive tokens of one kind, block and step, packed: their times and lengths, and
    their texts joined. A live run keeps every token for a viewer that joins late: as
    events, a token of a few letters costs about 220 bytes; packed, about 17."""

    __slots__ = ("block_id", "first_seq", "kind", "lengths", "run_id", "step", "text", "times")

    MOST = 1024
    """A pack takes more tokens while it holds fewer than this (it may end a few past it):
    its text is copied each time it grows."""

    def __init__(self, tokens: list[Token]) -> None:
        first = tokens[0]
        self.kind = type(first)
        self.run_id, self.block_id, self.step = first.run_id, first.block_id, first.step
        self.first_seq = first.seq
        self.times = array("d")
        self.lengths = array("B")
        """A byte each while every token is shorter than 256 (almost always), else 4."""
        self.text = ""
        self.extend(tokens)

    def goes_on_with(self, event: Event) -> bool:
        """``event`` (the next after this pack's last) belongs in it."""
        return len(self) < self.MOST and _pack_key(event) == (self.kind, self.block_id, self.step)

    def goes_on_with_all(self, events: list[Event]) -> bool:
        """``events`` (the next after this pack's last) all belong in it: told in one loop,
        where ``groupby`` by ``_pack_key`` made a call and a tuple an event (1,500 of a
        paced token's 59,000 instructions)."""
        if len(self.times) >= self.MOST:
            return False
        kind, block_id, step = self.kind, self.block_id, self.step
        for event in events:
            if type(event) is not kind or event.step != step or event.block_id != block_id:
                return False
            if kind is TextDelta and event.separator:  # type: ignore[union-attr]
                return False
        return True

    def extend(self, tokens: list[Token]) -> None:
        self.times.extend([token.ts for token in tokens])
        deltas = [token.delta for token in tokens]
        self._keep_lengths(list(map(len, deltas)))
        self.text += "".join(deltas)

    def _keep_lengths(self, lengths: list[int]) -> None:
        """A byte each while they fit, by ``frombytes``: ``array("B").extend`` parses each
        number as a C function's argument, a thousand instructions a token."""
        if self.lengths.typecode == "B":
            try:
                self.lengths.frombytes(bytes(lengths))
                return
            except ValueError:  # 256 or more
                self.lengths = array("I", self.lengths)
        self.lengths.extend(lengths)

    def __len__(self) -> int:
        return len(self.times)

    def events(self, start: int) -> list[Event]:
        """The tokens again, from the ``start``-th: equal to the events that were packed."""
        end = self._offset(start)
        events: list[Event] = []
        for i in range(start, len(self)):
            begin, end = end, end + self.lengths[i]
            events.append(
                make_token(
                    self.kind,
                    self.run_id,
                    self.first_seq + i,
                    self.times[i],
                    self.block_id,
                    self.step,
                    self.text[begin:end],
                )
            )
        return events

    def joined(self, start: int, end: int) -> str:
        """The deltas of the ``start``-th to the ``end``-th token (not included), joined."""
        return self.text[self._offset(start) : self._offset(end)]

    def _offset(self, start: int) -> int:
        """Where the ``start``-th token's delta begins in ``text``."""
        return sum(self.lengths[:start])


def _pack_key(event: Event) -> object:
    """Tokens of one kind, block and step pack together (a text token with a separator
    does not: a pack gives every token back without one); any other event stays as it is."""
    if type(event) is ReasoningDelta or (type(event) is TextDelta and not event.separator):
        return (type(event), event.block_id, event.step)
    return id(event)


class _Stream:
    """A run's events in seq order: those some viewer has not read yet as they were
    appended, where the viewers that keep up read them; the rest packed, for a viewer that
    joins late."""

    __slots__ = (
        "base",
        "closed",
        "count",
        "ends",
        "held",
        "packed",
        "recent",
        "subscribers",
        "waiting",
    )

    RECENT = 8
    """Whenever a multiple of ``RECENT`` events is kept as they are, those every viewer has
    read are packed, tokens onto the pack before them where they go on: a viewer that keeps
    up reads the events as they were appended, and a stream keeps a few of them (each about
    220 bytes with its text)."""

    BEHIND = 256
    """Events kept as they are at most (a multiple of ``RECENT``): past it, all but the newest
    ``RECENT`` are packed whether read or not, and a viewer that far behind reads them back
    from their packs."""

    def __init__(self, base: int) -> None:
        self.base = base
        """The seq before this stream's first event: 0, or where a paused run left off."""
        self.packed: list[Event | _Deltas] = []
        self.ends: list[int] = []
        """How many events ``packed`` holds up to and with each of its entries."""
        self.held = 0
        """How many events ``packed`` holds."""
        self.recent: list[Event] = []
        self.count = 0
        """How many events it holds: read by every viewer at every token, so kept, not
        summed."""
        self.closed = False
        self.subscribers: set[LogSubscription] = set()
        self.waiting: list[LogSubscription] = []
        """The viewers that have read every event and wait for the next (and, until their
        tasks run, those cancelled meanwhile)."""

    @property
    def last_seq(self) -> int:
        """Of its last event; its base while it has none."""
        return self.base + self.count

    def append(self, event: Event) -> None:
        """Keep the event and offer it to the viewers that wait for it. Those it wakes
        leave the waiting list at once: the rest of a burst (an unpaced model's, or a
        provider's read of several tokens) makes no call for them."""
        self.recent.append(event)
        self.count += 1
        if len(self.recent) % self.RECENT == 0:
            self.pack_read()
        if self.waiting:  # offered to each waiting viewer here, not in a call of its own
            woken = False  # those it wakes leave the list
            for viewer in self.waiting:
                if not viewer.waits_on_after(event):
                    woken = True
            if woken:
                self.waiting = [viewer for viewer in self.waiting if viewer.waits]

    def pack_read(self) -> None:
        """Pack the events that every viewer has read (all but the newest ``RECENT`` once
        ``BEHIND`` are kept as they are). A run may append a burst of tokens before its
        viewers next run (an unpaced model yields to the event loop every few); packed at
        once, each would be packed, then made again as an event for the viewer, which cost a
        tenth of a stream's CPU."""
        count = len(self.recent)
        if count >= self.BEHIND:
            count -= self.RECENT
        else:
            for subscriber in self.subscribers:
                count = min(count, subscriber.read - self.held)
        if count > 0:
            read = self.recent[:count]
            last = self.packed[-1] if self.packed else None
            if type(last) is _Deltas and last.goes_on_with_all(read):  # a paced stream's:
                # grown here as ``_pack`` grows a pack, not in a call of its own (a call a
                # batch measured at +0.2 to +0.7% of a paced token's instructions)
                last.extend(cast(list[Token], read))
                self.held += count
                self.ends[-1] = self.held
            else:
                for _, group in groupby(read, _pack_key):
                    self._pack(list(group))
            del self.recent[:count]

    def _pack(self, events: list[Event]) -> None:
        """Pack events of one ``_pack_key``, the next after those packed so far."""
        last = self.packed[-1] if self.packed else None
        self.held += len(events)
        if isinstance(last, _Deltas) and last.goes_on_with(events[0]):
            last.extend(cast(list[Token], events))
            self.ends[-1] = self.held
        else:
            self.packed.append(_Deltas(cast(list[Token], events)) if events[1:] else events[0])
            self.ends.append(self.held)

    def since(self, index: int) -> list[Event]:
        """Every event from the ``index``-th on (from 0)."""
        held = self.held
        if index >= held:
            return self.recent[index - held :]
        events: list[Event] = []
        for entry, start in self._packed_from(index):
            if isinstance(entry, _Deltas):
                events += entry.events(start)
            else:
                events.append(entry)
        return events + self.recent

    def text(self, kind: type[Token], index: int, count: int) -> str:
        """The deltas of the first ``count`` ``kind`` tokens from the ``index``-th event on,
        joined, read from the packs without making the events again."""
        pieces: list[str] = []
        for entry, start in self._packed_from(index):
            if isinstance(entry, _Deltas):
                if entry.kind is kind and count:
                    taken = min(count, len(entry) - start)
                    pieces.append(entry.joined(start, start + taken))
                    count -= taken
            elif type(entry) is kind and count:
                pieces.append(entry.delta)
                count -= 1
        recent = self.recent[max(index - self.held, 0) :]
        pieces += [event.delta for event in recent if type(event) is kind][:count]
        return "".join(pieces)

    def _packed_from(self, index: int) -> Iterator[tuple[Event | _Deltas, int]]:
        """The packed entries from the one that holds the ``index``-th event, each with
        where in it the events from the ``index``-th begin (0 for a single event)."""
        at = bisect_right(self.ends, index)
        for entry, end in zip(self.packed[at:], self.ends[at:], strict=True):
            begins = end - len(entry) if isinstance(entry, _Deltas) else end - 1
            yield entry, max(index - begins, 0)

    def wake(self) -> None:
        """The stream ended: the viewers that wait read what is left."""
        for viewer in self.waiting:
            viewer.wake()
        self.waiting.clear()


class LogSubscription:
    """One viewer's cursor into a stream's events."""

    def __init__(self, stream: _Stream, after: int) -> None:
        self._stream = stream
        self.read = max(after - stream.base, 0)
        """Events read so far, from the stream's first; past its end for a viewer that has
        seen more than the stream holds yet (it waits for the rest)."""
        self.starts_after = stream.base
        """Events up to this seq are not in the log (a continued run's earlier part)."""
        self.head = stream.last_seq
        """The seq of the stream's last event when the viewer subscribed."""
        self._waiter: asyncio.Future[None]
        """What ``next_batch`` waits on (set from its first wait on): a bare future, not an
        ``asyncio.Event``, which is heavier to keep and to set."""
        self._take: Take | None = None

    @property
    def ended(self) -> bool:
        """The run's live part is over: what is left to read is all there is."""
        return self._stream.closed

    async def next_batch(self, take: Take | None = None) -> list[Event]:
        """Every event not yet read, waiting for at least one; ``[]`` once the run has ended
        and everything was read. While it waits, the next event is offered to ``take``
        first, in the task that appends it: a viewer that writes a token's frame from the
        run's task spares the wake of its own, the most a token's second task costs.

        Safe to cancel: nothing is consumed until the wait is over (but what ``take`` took).
        """
        stream = self._stream
        while self.read >= stream.count and not stream.closed:
            self._take = take
            self._waiter = asyncio.get_running_loop().create_future()
            stream.waiting.append(self)
            try:
                await self._waiter
            except asyncio.CancelledError:
                if self in stream.waiting:  # not woken: nothing is to wake it any more
                    stream.waiting.remove(self)
                raise
            finally:
                self._take = None  # which holds its viewer's response
        batch = stream.since(self.read)
        self.read += len(batch)
        return batch

    @property
    def waits(self) -> bool:
        """It waits for an event (not woken, nor cancelled)."""
        return not self._waiter.done()

    def waits_on_after(self, event: Event) -> bool:
        """``event`` was appended while this viewer waits: whether it waits on (its
        ``take`` took the event, or it has seen the event: it resumed past the stream's
        end); else it is woken to read it (or was, or stopped waiting). Only the next
        unread event is offered to ``take``."""
        waiter = self._waiter
        if waiter.done():
            return False
        unread = self._stream.count - self.read
        if unread <= 0:
            return True
        if unread == 1 and self._take is not None and self._take(event):
            self.read += 1
            return True
        waiter.set_result(None)
        return False

    def wake(self) -> None:
        """Stop waiting (the stream ended)."""
        if not self._waiter.done():
            self._waiter.set_result(None)

    async def __aiter__(self) -> AsyncIterator[Event]:
        while batch := await self.next_batch():
            for event in batch:
                yield event

    def close(self) -> None:
        """Stop viewing: what this viewer alone held unpacked is packed (a run that has
        ended appends nothing more that would)."""
        self._stream.subscribers.discard(self)
        self._stream.pack_read()


class RunLog:
    """The live streams of every run in this process, by run id."""

    def __init__(self, *, retention: float = 300.0, mirror: Mirror | None = None) -> None:
        self._streams: dict[str, _Stream] = {}
        self._retention = retention
        self.mirror = mirror

    def open(self, stream_id: str, *, after: int = 0) -> None:
        """A (new) live stream, whose first event will follow seq ``after``."""
        self._streams[stream_id] = _Stream(after)
        if self.mirror is not None:
            self.mirror.open(stream_id, after=after)

    def append(self, event: BaseEvent) -> None:
        """Add an event to its run's stream (open). Takes ``Event``s only (the runtime
        makes no others): not ``cast`` to one, which is a call a token."""
        self._streams[event.run_id].append(event)  # type: ignore[arg-type]
        if self.mirror is not None:
            self.mirror.append(event)  # type: ignore[arg-type]

    def close(self, stream_id: str) -> None:
        """The stream ended: subscribers drain and stop; the log is dropped after retention."""
        stream = self._streams[stream_id]
        stream.closed = True
        stream.wake()
        if self.mirror is not None:
            self.mirror.close(stream_id, after=stream.base, last=stream.last_seq)
        asyncio.get_running_loop().call_later(self._retention, self._drop, stream_id, stream)

    def _drop(self, stream_id: str, stream: _Stream) -> None:
        # Only this stream: a run continued after a pause has a new one under the same id.
        if self._streams.get(stream_id) is stream:
            del self._streams[stream_id]

    async def sync(self, stream_id: str) -> None:
        """Wait until the stream can be followed from any process (at once without a
        mirror)."""
        if self.mirror is not None:
            await self.mirror.sync(stream_id)

    def text(self, stream_id: str, kind: type[Token], *, after: int, count: int) -> str:
        """The deltas of the first ``count`` of a stream's ``kind`` tokens with ``seq >
        after``, joined: what a turn streamed, which the log keeps anyway (while the
        stream is open)."""
        stream = self._streams[stream_id]
        return stream.text(kind, max(after - stream.base, 0), count)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._streams

    def subscribe(self, stream_id: str, *, after: int = 0) -> LogSubscription:
        """Follow a stream from the first event with ``seq > after``. KeyError if not in the
        log."""
        stream = self._streams[stream_id]
        subscription = LogSubscription(stream, after)
        stream.subscribers.add(subscription)
        return subscription
