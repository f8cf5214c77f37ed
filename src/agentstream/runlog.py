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
from collections.abc import AsyncIterator
from typing import Protocol, cast

from agentstream.events import BaseEvent, Event

__all__ = ["LogSubscription", "Mirror", "RunLog", "Subscription"]


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

    async def next_batch(self) -> list[Event]:
        """Every event not yet read, waiting for at least one; ``[]`` once the run has ended
        and everything was read. Safe to cancel."""
        ...

    def close(self) -> None: ...


class Mirror(Protocol):
    """Where this process's streams are copied for other processes: told of each change in
    order, without waiting (it batches the writes)."""

    def open(self, stream_id: str, *, after: int) -> None: ...

    def append(self, event: Event) -> None: ...

    def close(self, stream_id: str, *, last: int) -> None:
        """The stream ended after seq ``last``."""
        ...

    async def sync(self) -> None:
        """Wait until the changes told so far are visible to the other processes."""
        ...


class _Stream:
    __slots__ = ("base", "closed", "events", "subscribers")

    def __init__(self, base: int) -> None:
        self.base = base
        """The seq before this stream's first event: 0, or where a paused run left off."""
        self.events: list[Event] = []
        self.closed = False
        self.subscribers: set[LogSubscription] = set()

    @property
    def last_seq(self) -> int:
        """Of its last event; its base while it has none."""
        return self.events[-1].seq if self.events else self.base

    def notify(self) -> None:
        for subscriber in self.subscribers:
            subscriber.wake()


class LogSubscription:
    """One viewer's cursor into a stream's events."""

    def __init__(self, stream: _Stream, after: int) -> None:
        self._stream = stream
        self._cursor = min(max(after - stream.base, 0), len(stream.events))
        self._waiter: asyncio.Future[None] | None = None
        """What ``next_batch`` awaits while there is nothing new: a bare future, not an
        ``asyncio.Event``, which is heavier to keep and to set, once per token."""
        self.starts_after = stream.base
        """Events up to this seq are not in the log (a continued run's earlier part)."""

    @property
    def ended(self) -> bool:
        """The run's live part is over: what is left to read is all there is."""
        return self._stream.closed

    async def next_batch(self) -> list[Event]:
        """Every event not yet read, waiting for at least one; ``[]`` once the run has ended
        and everything was read.

        Safe to cancel: nothing is consumed until the wait is over.
        """
        stream = self._stream
        while self._cursor >= len(stream.events) and not stream.closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        batch = stream.events[self._cursor :]
        self._cursor += len(batch)
        return batch

    def wake(self) -> None:
        """There is news: new events, or the end."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def __aiter__(self) -> AsyncIterator[Event]:
        while batch := await self.next_batch():
            for event in batch:
                yield event

    def close(self) -> None:
        self._stream.subscribers.discard(self)


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
        """Add an event to its run's stream (open)."""
        stream = self._streams[event.run_id]
        stream.events.append(cast(Event, event))  # the runtime makes only the union's events
        stream.notify()
        if self.mirror is not None:
            self.mirror.append(cast(Event, event))

    def close(self, stream_id: str) -> None:
        """The stream ended: subscribers drain and stop; the log is dropped after retention."""
        stream = self._streams[stream_id]
        stream.closed = True
        stream.notify()
        if self.mirror is not None:
            self.mirror.close(
                stream_id, last=stream.events[-1].seq if stream.events else stream.base
            )
        asyncio.get_running_loop().call_later(self._retention, self._drop, stream_id, stream)

    def _drop(self, stream_id: str, stream: _Stream) -> None:
        # Only this stream: a run continued after a pause has a new one under the same id.
        if self._streams.get(stream_id) is stream:
            del self._streams[stream_id]

    async def sync(self) -> None:
        """Wait until the streams opened so far can be followed from any process (at once
        without a mirror)."""
        if self.mirror is not None:
            await self.mirror.sync()

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._streams

    def subscribe(self, stream_id: str, *, after: int = 0) -> LogSubscription:
        """Follow a stream from the first event with ``seq > after``. KeyError if not in the
        log."""
        stream = self._streams[stream_id]
        subscription = LogSubscription(stream, after)
        stream.subscribers.add(subscription)
        return subscription
