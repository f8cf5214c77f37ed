"""Runs as tasks of their own: started by a request, independent of its connection.

The manager owns every live run. It enforces the execution timeout, turns a cancel into a
truthful ending (in-flight tools settle as cancelled, status ``cancelled``), and writes the
outcome once, whatever happened.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import anyio
from anyio.abc import TaskGroup

from agentstream.agents import AgentSpec
from agentstream.errors import Conflict, NotFound, RunError, UserError
from agentstream.events import FailureStatus, RunCompleted, RunFailed, RunStarted, ToolResult
from agentstream.providers.registry import ModelRegistry
from agentstream.runlog import RunLog
from agentstream.runtime.agent import AgentAnswer, run_agent
from agentstream.runtime.context import RunContext
from agentstream.runtime.tools import ToolRegistry
from agentstream.store import Store
from agentstream.store.store import StoredAgent

__all__ = ["RunManager", "StartedRun"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StartedRun:
    run_id: str
    session_id: str


@dataclass(slots=True)
class _LiveRun:
    session_id: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    """Set once the outcome is recorded and the session is free again."""
    cancel_reason: str | None = None


class RunManager:
    """Starts, cancels and finishes runs. Use as an async context manager: leaving it
    interrupts the runs still going."""

    def __init__(
        self, *, store: Store, log: RunLog, models: ModelRegistry, tools: ToolRegistry
    ) -> None:
        self.store = store
        self.log = log
        self.models = models
        self.tools = tools
        self._live: dict[str, _LiveRun] = {}
        self._by_session: dict[str, _LiveRun] = {}
        self._group: TaskGroup | None = None

    async def __aenter__(self) -> Self:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._group is not None
        self._group.cancel_scope.cancel()
        await self._group.__aexit__(kind, exc, tb)
        self._group = None

    async def start(
        self,
        agent: StoredAgent,
        message: str,
        *,
        session_id: str | None = None,
        create_session: bool = False,
        reasoning: bool | None = None,
    ) -> StartedRun:
        """Record a new run and start it. Raises ``UserError`` before writing anything.

        ``session_id`` continues that conversation; with ``create_session`` a session of
        that id that does not exist yet is created (clients that name their conversations).
        """
        if self._group is None:
            raise RuntimeError("RunManager is not running")
        spec = agent.spec
        new_session = session_id is None
        if session_id is None:
            session_id = f"ses_{uuid.uuid4().hex}"
        else:
            owner = await self.store.session_agent(session_id)
            new_session = owner is None and create_session
            if owner != spec.id and not new_session:
                raise NotFound(
                    f"No session {session_id!r} for agent {spec.id!r}", field="session_id"
                )
        await self._after_cancelled_run(session_id)
        if session_id in self._by_session:
            raise Conflict(
                f"Session {session_id!r} already has a run in progress", field="session_id"
            )
        model = self.models.get(spec.model)
        tools = self.tools.select(spec.tools)
        reasoning = spec.reasoning if reasoning is None else reasoning

        live = self._by_session[session_id] = _LiveRun(session_id=session_id)
        try:
            history = [] if new_session else await self.store.history(session_id)
            run_id = f"run_{uuid.uuid4().hex}"
            await self.store.create_run(
                run_id=run_id,
                agent=agent,
                session_id=session_id,
                new_session=new_session,
                input=message,
                reasoning_requested=reasoning,
            )
        except BaseException:
            del self._by_session[session_id]
            raise
        self.log.open(run_id)
        self._live[run_id] = live

        async def execute() -> None:
            ctx = RunContext(run_id, log=self.log, store=self.store)
            answer: AgentAnswer | None = None
            failure: tuple[FailureStatus, str] = (
                "interrupted",
                "The server stopped during the run",
            )
            try:
                with live.scope:
                    await ctx.emit(RunStarted, agent_id=spec.id, session_id=session_id)
                    try:
                        with anyio.fail_after(spec.timeout_seconds):
                            answer = await run_agent(
                                ctx,
                                spec,
                                model,
                                tools,
                                history=history,
                                message=message,
                                reasoning=reasoning,
                            )
                    except TimeoutError:
                        failure = (
                            "timeout",
                            f"Execution timed out after {spec.timeout_seconds:g}s",
                        )
                    except RunError as exc:
                        failure = ("error", str(exc))
                    except Exception as exc:
                        logger.exception("Run %s failed", run_id)
                        failure = ("error", f"{type(exc).__name__}: {exc}")
                if live.scope.cancelled_caught:
                    failure = ("cancelled", live.cancel_reason or "Run cancelled")
            finally:
                with anyio.CancelScope(shield=True):
                    await self._finish(ctx, answer, failure)
                    del self._live[run_id], self._by_session[session_id]
                    live.done.set()

        self._group.start_soon(execute, name=run_id)
        return StartedRun(run_id=run_id, session_id=session_id)

    def check_agent(self, spec: AgentSpec) -> None:
        """Refuse an agent whose model or tools this server does not have."""
        if spec.model not in self.models:
            known = ", ".join(self.models.names())
            raise UserError(f"Unknown model {spec.model!r}; known: {known}", field="model")
        if unknown := [name for name in spec.tools if name not in self.tools]:
            available = ", ".join(self.tools.names())
            raise UserError(f"Unknown tools {unknown}; available: {available}", field="tools")

    def cancel(self, run_id: str, reason: str = "Run cancelled") -> anyio.Event | None:
        """Stop a live run. Returns the event set once it has ended, or None if the run is
        not live here."""
        live = self._live.get(run_id)
        if live is None:
            return None
        live.cancel_reason = live.cancel_reason or reason
        live.scope.cancel()
        return live.done

    async def _after_cancelled_run(self, session_id: str) -> None:
        """A run being cancelled still holds its session for a moment: let it finish, so
        "Stop" then a new message works."""
        busy = self._by_session.get(session_id)
        if busy is not None and busy.cancel_reason is not None:
            with anyio.move_on_after(10):
                await busy.done.wait()

    def is_live(self, run_id: str) -> bool:
        return run_id in self._live

    async def _finish(
        self, ctx: RunContext, answer: AgentAnswer | None, failure: tuple[FailureStatus, str]
    ) -> None:
        """End the run truthfully: settle open tool calls, emit the last event, record it."""
        try:
            for call_id, (step, name) in list(ctx.open_tool_calls.items()):
                await ctx.emit(
                    ToolResult, step=step, call_id=call_id, tool_name=name, status="cancelled"
                )
            if answer is not None:
                await ctx.emit(RunCompleted, content=answer.content, usage=ctx.usage)
                await self.store.finish_run(
                    ctx.run_id,
                    status="completed",
                    content=answer.content,
                    error=None,
                    usage=ctx.usage,
                    memory=answer.memory,
                )
            else:
                status, message = failure
                await ctx.emit(RunFailed, status=status, message=message)
                await self.store.finish_run(
                    ctx.run_id,
                    status=status,
                    content=None,
                    error=message,
                    usage=ctx.usage,
                    memory=(),
                )
        except Exception:
            logger.exception("Could not record the end of run %s", ctx.run_id)
        finally:
            self.log.close(ctx.run_id)
