"""Workflow executions as tasks of their own: started by a request, independent of its
connection, followed through the log by any number of viewers (the native stream, the
canvas).

Mirrors ``runs.RunManager``: the manager owns every live execution, enforces the execution
timeout, turns a cancel into a truthful ending, writes each persisted event before any
viewer sees it, and writes the outcome with the terminal event in one transaction. Token
deltas only go to the log.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

import anyio
from anyio.abc import TaskGroup
from anyio.lowlevel import checkpoint_if_cancelled

from agentstream.runlog import EventLog, LogSubscription
from agentstream.store.workflows import INTERRUPTED, WorkflowStore
from agentstream.workflows.definition import Workflow
from agentstream.workflows.engine import Execution, WorkflowEngine
from agentstream.workflows.events import (
    Stopped,
    WorkflowCancelled,
    WorkflowComplete,
    WorkflowError,
    WorkflowEventBase,
)

__all__ = ["ExecutionLog", "ExecutionManager", "ExecutionStatus"]

logger = logging.getLogger(__name__)

ExecutionStatus = Literal["running", "completed", "error", "cancelled", "timeout", "interrupted"]
ExecutionLog = EventLog[WorkflowEventBase]
"""The live log of executions, by execution id."""


@dataclass(slots=True)
class _LiveExecution:
    execution_id: str
    execution: Execution | None = None
    last_seq: int = 0
    ended: bool = False
    """The terminal event went out: nothing more may follow it."""
    done: anyio.Event = field(default_factory=anyio.Event)
    """Set once the outcome is recorded and the log closed."""

    def stop(self, status: Stopped, reason: str) -> None:
        assert self.execution is not None
        self.execution.cancel(reason, status)


class ExecutionManager:
    """Starts, follows and cancels workflow executions. Use as an async context manager:
    leaving it interrupts the executions still going."""

    def __init__(
        self,
        *,
        engine: WorkflowEngine,
        store: WorkflowStore,
        log: ExecutionLog,
        timeout_seconds: float,
    ) -> None:
        self.engine = engine
        self.store = store
        self.log = log
        self.timeout_seconds = timeout_seconds
        self._live: dict[str, _LiveExecution] = {}
        self._group: TaskGroup | None = None

    async def __aenter__(self) -> Self:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._group is not None
        live = list(self._live.values())
        for each in live:
            each.stop("interrupted", INTERRUPTED)
        with anyio.move_on_after(5):  # let them record how they ended
            for each in live:
                await each.done.wait()
        self._group.cancel_scope.cancel()
        await self._group.__aexit__(kind, exc, tb)
        self._group = None

    async def start(
        self,
        workflow: Workflow,
        inputs: Any = None,
        *,
        draft: bool = False,
        version: int | None = None,
    ) -> str:
        """Record a new execution of ``workflow`` on ``inputs`` (the start block's
        ``input``) and start it; its id. ``draft`` marks a definition run from the editor
        (saved or not); ``version`` is the saved version that runs, if any.

        Raises ``WorkflowInvalid`` before writing anything if it cannot run here. Its events
        are in the log from seq 1 as soon as this returns: ``subscribe`` then misses none.
        A cancel of the caller cannot leave the execution recorded but never started: once
        recorded, it starts, and is cancelled with the caller.
        """
        group = self._group
        if group is None:
            raise RuntimeError("ExecutionManager is not running")
        live = _LiveExecution(f"wfx_{uuid.uuid4().hex}")

        async def sink(event: WorkflowEventBase) -> None:
            await self._deliver(live, event)

        live.execution = self.engine.execution(workflow, sink=sink, execution_id=live.execution_id)
        with anyio.CancelScope(shield=True):
            await self.store.create_execution(
                live.execution_id, workflow, version=version, draft=draft, input=inputs
            )
            self.log.open(live.execution_id)
            self._live[live.execution_id] = live
            group.start_soon(self._run, live, inputs, name=live.execution_id)
        try:
            await checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            live.stop("cancelled", "The request that started the execution was cancelled")
            raise
        return live.execution_id

    def subscribe(
        self, execution_id: str, *, after: int = 0
    ) -> LogSubscription[WorkflowEventBase] | None:
        """Follow an execution's events (deltas included) from the first with
        ``seq > after``; None if it is not in this server's log (finished a while ago, or
        never ran here): its persisted events are in the store."""
        if execution_id not in self.log:
            return None
        return self.log.subscribe(execution_id, after=after)

    def is_live(self, execution_id: str) -> bool:
        return execution_id in self._live

    def cancel(self, execution_id: str, reason: str = "Execution cancelled") -> anyio.Event | None:
        """Stop a live execution: every running block stops, it ends with status
        ``cancelled``. The event set once it has ended, or None if it is not live here."""
        live = self._live.get(execution_id)
        if live is None:
            return None
        live.stop("cancelled", reason)
        return live.done

    async def _run(self, live: _LiveExecution, inputs: Any) -> None:
        assert live.execution is not None
        assert self._group is not None
        deadline = anyio.CancelScope()

        async def timeout() -> None:
            with deadline:
                await anyio.sleep(self.timeout_seconds)
                live.stop("timeout", f"Execution timed out after {self.timeout_seconds:g}s")

        self._group.start_soon(timeout)
        try:
            await live.execution.run(inputs)
        except Exception:  # the store failed: the engine could not even report it
            logger.exception("Workflow execution %s failed", live.execution_id)
        finally:
            deadline.cancel()
            with anyio.CancelScope(shield=True):
                if not live.ended:
                    await self._fail(live)
                self.log.close(live.execution_id)
                del self._live[live.execution_id]
                live.done.set()

    async def _deliver(self, live: _LiveExecution, event: WorkflowEventBase) -> None:
        """The engine's sink: persist (the outcome with the terminal event), then publish.
        The write is shielded, so a cancel cannot leave a viewer with an event the store has
        not; token deltas, written nowhere, go straight to the log."""
        if live.ended:
            return  # exactly one terminal event, even if a cancel races the ending
        if (write := self._write(live, event)) is not None:
            with anyio.CancelScope(shield=True):
                await write
        live.last_seq = event.seq
        self.log.put(live.execution_id, event)

    def _write(self, live: _LiveExecution, event: WorkflowEventBase) -> Awaitable[None] | None:
        """Persisting ``event``, not yet awaited; None if it is not persisted."""
        match event:
            case WorkflowComplete(result=result):
                return self._finish(live, event, "completed", result=result)
            case WorkflowError(error=error):
                return self._finish(live, event, "error", error=error)
            case WorkflowCancelled(reason=reason, status=status):
                return self._finish(live, event, status, error=reason)
            case _ if event.persisted:
                return self.store.append_event(event)
        return None

    async def _finish(
        self,
        live: _LiveExecution,
        event: WorkflowEventBase,
        status: ExecutionStatus,
        *,
        result: Any = None,
        error: str | None = None,
    ) -> None:
        await self.store.finish_execution(
            live.execution_id, status=status, result=result, error=error, last_event=event
        )
        live.ended = True

    async def _fail(self, live: _LiveExecution) -> None:
        """The execution stopped without a recorded ending (the store failed): at least the
        status, and a terminal event for its viewers."""
        message = (
            f"The execution's outcome could not be saved; see the server log ({live.execution_id})"
        )
        try:
            await self.store.mark_failed(live.execution_id, message)
        except Exception:
            logger.exception("Could not mark execution %s failed", live.execution_id)
        live.ended = True
        live.last_seq += 1
        self.log.put(
            live.execution_id,
            WorkflowError(
                execution_id=live.execution_id, seq=live.last_seq, ts=time.time(), error=message
            ),
        )
