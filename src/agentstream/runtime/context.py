"""The per-run emitter: stamps each event with its seq and time, persists, then publishes."""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from agentstream.events import BaseEvent, Usage
from agentstream.providers.catalog import ModelInfo
from agentstream.runlog import RunLog
from agentstream.store import Store

__all__ = ["RunContext", "ToolCallScope", "current_tool_call"]

E = TypeVar("E", bound=BaseEvent)


class RunContext:
    """What the runtime needs of the outside world while a run executes."""

    def __init__(
        self,
        run_id: str,
        *,
        log: RunLog,
        store: Store,
        pricing: ModelInfo | None = None,
        seq: int = 0,
        usage: Usage | None = None,
    ) -> None:
        """``seq`` and ``usage`` are where a continued (once paused) run left off."""
        self.run_id = run_id
        self.pricing = pricing
        self.usage = usage or (pricing.priced(Usage()) if pricing else Usage())
        self.open_tool_calls: dict[str, tuple[int, str]] = {}
        """Tool calls announced but not settled: (step, tool name) by call id."""
        self._log = log
        self._store = store
        self._seq = seq
        self._in_order = anyio.Lock()
        """Held from stamping a persisted event to publishing it, so seqs go out in order."""

    def count(self, usage: Usage) -> None:
        """Add a turn's usage to the run's, priced at the model's rates."""
        self.usage += self.pricing.priced(usage) if self.pricing else usage

    def stamp(self, kind: type[E], /, **fields: Any) -> E:
        """The next event of this run: its seq and time."""
        self._seq += 1
        return kind(run_id=self.run_id, seq=self._seq, ts=time.time(), **fields)

    def publish(self, event: BaseEvent) -> None:
        """Deliver to live viewers (persisting, if due, is the caller's business)."""
        self._log.append(event)

    async def emit(self, kind: type[E], /, **fields: Any) -> E:
        """Create the next event of this run and deliver it.

        A persisted event is in the database before any viewer sees it, so whatever a
        viewer saw can be replayed; the write is shielded so a cancel cannot tear it.
        Concurrent emitters (parallel tool calls) still publish in seq order.
        """
        if not kind.persisted and not self._in_order.locked():
            event = self.stamp(kind, **fields)  # no await before it is published
            self.publish(event)
            return event
        async with self._in_order:
            event = self.stamp(kind, **fields)
            if kind.persisted:
                with anyio.CancelScope(shield=True):
                    await self._store.append_event(event)
            self.publish(event)
            return event


@dataclass(frozen=True, slots=True)
class ToolCallScope:
    """The call a tool is running for, for tools that emit events of their own."""

    ctx: RunContext
    step: int
    call_id: str


current_tool_call: ContextVar[ToolCallScope] = ContextVar("current_tool_call")
"""Set in the task of each tool call (see ``runtime.agent``)."""
