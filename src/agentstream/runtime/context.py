"""The per-run emitter: stamps each event with its seq and time and hands it to the run's
sink, which by default persists it (if its kind is), then publishes it; and ends the run
with its terminal event, recorded with the run's outcome."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar

import anyio

from agentstream.events import BaseEvent, Emitted, RunFailed, TextDelta, Token, Usage, make_token
from agentstream.providers.catalog import ModelInfo
from agentstream.runlog import RunLog
from agentstream.runtime.ports import EventStore

__all__ = [
    "EventSink",
    "RunContext",
    "RunSink",
    "ToolCallScope",
    "TurnText",
    "current_tool_call",
]

logger = logging.getLogger(__name__)

E = TypeVar("E", bound=BaseEvent)

EventSink = Callable[[Sequence[BaseEvent]], Awaitable[None]]
"""Takes a run's events once stamped, in seq order: those that came at once together (a
step's calls, its ending), all or none; never none at all. Another sink than the run's own
(``RunSink``) lets the agent loop run for someone else, e.g. a workflow block."""


class RunSink:
    """A run's own sink: a persisted event goes into the database before any viewer sees it,
    so whatever a viewer saw can be replayed; the write is shielded so a cancel cannot tear
    it. Then every event goes to the live log."""

    def __init__(self, log: RunLog, store: EventStore) -> None:
        self.log = log
        self.store = store

    async def __call__(self, events: Sequence[BaseEvent]) -> None:
        """The persisted ones in one write, then each published."""
        if persisted := [event for event in events if event.persisted]:
            with anyio.CancelScope(shield=True):
                await self.store.append_events(*persisted)
        for event in events:
            self.log.append(event)


class TurnText(Protocol):
    """Where a turn keeps the text of its tokens of one kind: each piece as it is emitted
    (``append``); ``str``, the pieces so far, joined."""

    def append(self, piece: str) -> None: ...

    def __str__(self) -> str: ...


class _Buffered:
    """Text kept piece by piece, as UTF-8 (a piece kept as a string of its own costs about
    60 bytes until the turn ends; ``io.StringIO`` keeps them so on Python 3.11).
    ``surrogatepass``: any string comes back as it went in, lone surrogates too."""

    __slots__ = ("_utf8",)

    def __init__(self) -> None:
        self._utf8 = bytearray()

    def append(self, piece: str) -> None:
        self._utf8 += piece.encode("utf-8", "surrogatepass")

    def __str__(self) -> str:
        return self._utf8.decode("utf-8", "surrogatepass")


class _Logged:
    """Text the run's own log keeps already, for its viewers: the pieces are counted, and
    read back from there, not kept twice (after the log's copy, a live stream's largest
    part)."""

    __slots__ = ("_after", "_count", "_kind", "_log", "_run_id")

    def __init__(self, log: RunLog, run_id: str, kind: type[Token], after: int) -> None:
        self._log, self._run_id, self._kind, self._after = log, run_id, kind, after
        self._count = 0

    def append(self, piece: str) -> None:
        """Kept by the log as it was emitted: the ``kind`` token after the last one."""
        self._count += 1

    def __str__(self) -> str:
        return self._log.text(self._run_id, self._kind, after=self._after, count=self._count)


class _InOrder(asyncio.Lock):
    """A run's ordering lock, whether it is held kept in ``held``: read once a token, where
    ``locked()`` is a call. asyncio's, not anyio's: that one keeps a queue for waiters from
    the start, 760 bytes a live run, where this one makes it once a task waits."""

    def __init__(self) -> None:
        super().__init__()
        self.held = False

    async def acquire(self) -> Literal[True]:
        await super().acquire()
        self.held = True
        return True

    def release(self) -> None:
        super().release()
        self.held = False


class RunContext:
    """What the runtime needs of the outside world while a run executes."""

    def __init__(
        self,
        run_id: str,
        *,
        log: RunLog | None = None,
        store: EventStore | None = None,
        sink: EventSink | None = None,
        pricing: ModelInfo | None = None,
        seq: int = 0,
        usage: Usage | None = None,
    ) -> None:
        """Events go to ``sink``, by default the run's own: ``RunSink(log, store)``.
        ``seq`` and ``usage`` are where a continued (once paused) run left off."""
        if sink is None:
            if log is None or store is None:
                raise TypeError("RunContext needs a sink, or the run's log and store")
            sink = RunSink(log, store)
        elif log is not None:
            raise TypeError("RunContext takes a sink or the run's log, not both")
        self.run_id = run_id
        self.pricing = pricing
        self.usage = usage or (pricing.priced(Usage()) if pricing else Usage())
        self.open_tool_calls: dict[str, tuple[int, str]] = {}
        """Tool calls announced but not settled: (step, tool name) by call id."""
        self._log = log
        self._store = store
        self._sink = sink
        self._seq = seq
        self._in_order = _InOrder()
        """Held from stamping an event to its sink being done with it, so seqs go out in
        order; a token waits for it only where it is held (``emit_token``)."""

    def count(self, usage: Usage) -> Usage:
        """Add a turn's usage to the run's, priced at the model's rates; that usage, priced."""
        priced = self.pricing.priced(usage) if self.pricing else usage
        self.usage += priced
        return priced

    def turn_text(self, kind: type[Token]) -> TurnText:
        """Where a model turn keeps the text of the ``kind`` tokens it emits from now on,
        each appended once emitted (one turn at a time emits them): read back from the
        run's own log, or kept in a buffer where the events go to another sink."""
        if self._log is None:
            return _Buffered()
        return _Logged(self._log, self.run_id, kind, after=self._seq)

    def stamp(self, kind: type[E], /, **fields: Any) -> E:
        """The next event of this run: its seq and time."""
        return self._stamped(kind, fields)

    def _stamped(self, kind: type[E], fields: dict[str, Any]) -> E:
        """``stamp``, for ``emit``, which has the fields at hand: not passed on as keywords
        once more."""
        self._seq += 1
        return kind(run_id=self.run_id, seq=self._seq, ts=time.time(), **fields)

    def publish(self, event: BaseEvent) -> None:
        """Deliver to a run's live viewers an event the caller persisted itself (its first and
        last, written with the run's record)."""
        if self._log is None:
            raise TypeError("Only a run's own context publishes directly")
        self._log.append(event)

    def emit_token(
        self, kind: type[Token], step: int, delta: str, separator: str = ""
    ) -> Awaitable[Token] | None:
        """Emit a token (``separator``: a text token's): at once where nothing is to be
        awaited (a token of the run's own, no emitter ahead of it, so it cannot be
        overtaken), else the ``emit`` to await, at once (it takes its seq when awaited).
        ``emit`` is a coroutine, and a coroutine and its keywords made for each token were
        3.7% of a token's instructions."""
        if self._log is None or self._in_order.held:
            fields = {"separator": separator} if kind is TextDelta else {}
            return self.emit(kind, step=step, delta=delta, **fields)
        self._seq += 1
        self._log.append(
            make_token(kind, self.run_id, self._seq, time.time(), None, step, delta, separator)
        )
        return None

    async def emit(self, kind: type[E], /, **fields: Any) -> E:
        """Create the next event of this run and hand it to the sink. Concurrent emitters
        (parallel tool calls) still deliver in seq order. Tokens come through
        ``emit_token``, and here only where they must wait."""
        async with self._in_order:
            event = self._stamped(kind, fields)
            await self._deliver([event])
            return event

    async def emit_all(self, *events: Emitted) -> None:
        """``emit`` for events that come at once, each a kind and its fields: a run's own sink
        persists them in one write, not one each (a step's calls, its ending)."""
        async with self._in_order:
            await self._deliver([self._stamped(kind, fields) for kind, fields in events])

    async def _deliver(self, events: list[BaseEvent]) -> None:
        """Hand stamped events to the sink. If it did not take them, they give their seqs
        back: the run's seqs stay without a hole, and its log's last seq is its last
        event's (where viewers in other processes stop)."""
        if not events:
            return
        try:
            await self._sink(events)
        except Exception:
            self._seq -= len(events)
            raise

    async def forward(self, events: Sequence[BaseEvent], *, block_id: str) -> None:
        """Hand the sink another run's events (an agent's, in a workflow block) as this
        run's next ones, scoped to the block."""
        async with self._in_order:
            first = self._seq + 1
            self._seq += len(events)
            await self._deliver(
                [
                    replace(event, run_id=self.run_id, seq=seq, block_id=block_id)
                    for seq, event in enumerate(events, first)
                ]
            )

    async def end(
        self, last: BaseEvent, record: Callable[[BaseEvent], Awaitable[None]]
    ) -> BaseEvent:
        """End the run: ``record`` its outcome with its terminal event ``last`` (stamped by
        ``stamp``), then publish that event and close the run's log; that event. If
        recording fails, the run is at least marked failed, and its viewers get a terminal
        event that says so."""
        if self._log is None or self._store is None:
            raise TypeError("Only a run's own context ends it")
        try:
            await record(last)
        except Exception:
            logger.exception("Could not record the end of run %s", self.run_id)
            message = f"The run's outcome could not be saved; see the server log ({self.run_id})"
            last = RunFailed(
                run_id=self.run_id, seq=last.seq, ts=time.time(), status="error", message=message
            )
            try:  # at least the status, so the run does not stay "running"
                await self._store.mark_failed(self.run_id, message)
            except Exception:
                logger.exception("Could not mark run %s failed", self.run_id)
        self._log.append(last)
        self._log.close(self.run_id)
        return last


@dataclass(frozen=True, slots=True)
class ToolCallScope:
    """The call a tool is running for, for tools that emit events of their own."""

    ctx: RunContext
    step: int
    call_id: str


current_tool_call: ContextVar[ToolCallScope] = ContextVar("current_tool_call")
"""Set in the task of each tool call (see ``runtime.agent``)."""
