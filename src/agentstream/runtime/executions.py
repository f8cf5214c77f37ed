"""Workflow executions as runs: the DAG engine is the program the supervisor launches.

Starting one records it, then launches it; its events go through the run's emitter like
any run's (each persisted event stored before any viewer sees it, token deltas only to the
log), and its ending is recorded with its terminal event in one transaction.
"""

from __future__ import annotations

import secrets
from functools import partial
from typing import Any

import anyio

from agentstream.events import BaseEvent, RunCompleted, RunFailed
from agentstream.runtime.context import RunContext
from agentstream.runtime.ports import ExecutionStore
from agentstream.runtime.supervisor import Stopped, Supervisor
from agentstream.telemetry import RunAbout
from agentstream.workflows.definition import Workflow
from agentstream.workflows.engine import ExecutionResult, WorkflowEngine

__all__ = ["ExecutionManager", "terminal"]


class ExecutionManager:
    """Starts workflow executions as runs of the supervisor."""

    def __init__(
        self,
        *,
        engine: WorkflowEngine,
        store: ExecutionStore,
        supervisor: Supervisor,
        timeout_seconds: float,
    ) -> None:
        self.engine = engine
        self.store = store
        self.supervisor = supervisor
        self.timeout_seconds = timeout_seconds

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
        are in the log from seq 1 as soon as this returns: a subscriber then misses none.
        A cancel of the caller cannot leave the execution recorded but never started: once
        recorded, it starts, and is cancelled with the caller.
        """
        self.supervisor.admit()
        run_id = f"wfx_{secrets.token_hex(16)}"
        ctx = RunContext(run_id, log=self.supervisor.log, store=self.store)
        execution = self.engine.execution(workflow, ctx)

        async def finish(ending: ExecutionResult | Stopped) -> BaseEvent:
            last = terminal(ctx, ending)
            if isinstance(last, RunCompleted):
                status, result, error = "completed", last.result, None
            else:
                status, result, error = last.status, None, last.message
            return await ctx.end(
                last,
                lambda last: self.store.finish_execution(
                    run_id, status=status, result=result, error=error, last_event=last
                ),
            )

        with anyio.CancelScope(shield=True):
            await self.store.create_execution(
                run_id,
                workflow,
                version=version,
                draft=draft,
                input=inputs,
                owner=self.supervisor.process_id,
            )
            self.supervisor.log.open(run_id)
            self.supervisor.launch(
                run_id,
                partial(execution.run, inputs),
                finish,
                timeout=self.timeout_seconds,
                about=RunAbout("workflow", workflow=workflow.id),
            )
        await self.supervisor.followable(run_id)
        return run_id


def terminal(ctx: RunContext, ending: ExecutionResult | Stopped) -> RunCompleted | RunFailed:
    """The terminal event that says how an execution ended: by itself (``ExecutionResult``)
    or stopped by the supervisor."""
    match ending:
        case ExecutionResult(status="completed", result=result):
            return ctx.stamp(RunCompleted, result=result)
        case ExecutionResult(error=error, failed_block=failed_block):
            message = error or "The execution failed"
            return ctx.stamp(RunFailed, status="error", message=message, failed_block=failed_block)
        case Stopped(status=status, message=message):
            return ctx.stamp(RunFailed, status=status, message=message)
