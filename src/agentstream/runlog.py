"""The live log of runs: events in seq order, readable from any seq by any number of viewers.

A run writes here whether or not anyone watches; an HTTP connection only subscribes. This
is the in-process implementation; the log outlives its run for ``retention`` seconds so a
late or reconnecting viewer still gets the live-only events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from agentstream.events import BaseEvent

__all__ = ["RunLog", "Subscription"]


class _RunStream:
    __slots__ = ("base", "closed", "events", "subscribers")

    def __init__(self, base: int) -> None:
        self.base = base
        """The seq before this stream's first event: 0, or where a paused run left off."""
        self.events: list[BaseEvent] = []
        self.closed = False
        self.subscribers: set[Subscription] = set()

    def notify(self) -> None:
        for subscriber in self.subscribers:
            subscriber.wake.set()


class Subscription:
    """One viewer's cursor into a run's events."""

    def __init__(self, stream: _RunStream, after: int) -> None:
        self._stream = stream
        self._cursor = min(max(after - stream.base, 0), len(stream.events))
        self.wake = asyncio.Event()
        self.starts_after = stream.base
        """Events up to this seq are not in the log (a continued run's earlier part)."""

    @property
    def ended(self) -> bool:
        """The run's live part is over: what is left to read is all there is."""
        return self._stream.closed

    async def next_batch(self) -> list[BaseEvent]:
        """Every event not yet read, waiting for at least one; ``[]`` once the run has ended
        and everything was read.

        Safe to cancel: nothing is consumed until the wait is over.
        """
        stream = self._stream
        while self._cursor >= len(stream.events) and not stream.closed:
            self.wake.clear()
            await self.wake.wait()
        batch = stream.events[self._cursor :]
        self._cursor += len(batch)
        return batch

    async def __aiter__(self) -> AsyncIterator[BaseEvent]:
        while batch := await self.next_batch():
            for event in batch:
                yield event

    def close(self) -> None:
        self._stream.subscribers.discard(self)


class RunLog:
    """All live runs of this process."""

    def __init__(self, *, retention: float = 300.0) -> None:
        self._runs: dict[str, _RunStream] = {}
        self._retention = retention

    def open(self, run_id: str, *, after: int = 0) -> None:
        """A (new) live stream for the run, whose first event will follow seq ``after``."""
        self._runs[run_id] = _RunStream(after)

    def append(self, event: BaseEvent) -> None:
        stream = self._runs[event.run_id]
        stream.events.append(event)
        stream.notify()

    def close(self, run_id: str) -> None:
        """The run ended: subscribers drain and stop; the log is dropped after retention."""
        stream = self._runs[run_id]
        stream.closed = True
        stream.notify()
        asyncio.get_running_loop().call_later(self._retention, self._drop, run_id, stream)

    def _drop(self, run_id: str, stream: _RunStream) -> None:
        # Only this stream: a run continued after a pause has a new one under the same id.
        if self._runs.get(run_id) is stream:
            del self._runs[run_id]

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def subscribe(self, run_id: str, *, after: int = 0) -> Subscription:
        """Follow a run from the first event with ``seq > after``. KeyError if not in the log."""
        stream = self._runs[run_id]
        subscription = Subscription(stream, after)
        stream.subscribers.add(subscription)
        return subscription
