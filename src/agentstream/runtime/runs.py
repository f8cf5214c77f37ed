"""Runs as tasks of their own: started by a request, independent of its connection.

The manager owns every live run. It enforces the execution timeout, turns a cancel into a
truthful ending (in-flight tools settle as cancelled, status ``cancelled``), and writes the
outcome once, whatever happened.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Self

import anyio
from anyio.abc import TaskGroup

from agentstream.agents import AgentSpec
from agentstream.errors import Conflict, NotFound, RunError, UserError
from agentstream.events import (
    BaseEvent,
    FailureStatus,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunStarted,
    ToolResult,
    Usage,
)
from agentstream.knowledge.service import Knowledge
from agentstream.knowledge.tool import knowledge_search_tool
from agentstream.providers.base import Model
from agentstream.providers.registry import ModelRegistry
from agentstream.runlog import RunLog, Subscription
from agentstream.runtime.agent import (
    AgentAnswer,
    AgentState,
    AgentStateAdapter,
    AwaitingApproval,
    Decision,
    run_agent,
)
from agentstream.runtime.context import RunContext
from agentstream.runtime.orchestration import delegate_tools, resolve_entities
from agentstream.runtime.tools import Tool, ToolRegistry
from agentstream.store import Store
from agentstream.store.store import INTERRUPTED, StoredAgent

__all__ = ["RunManager", "StartedRun", "check_agent"]

logger = logging.getLogger(__name__)

RunStatus = Literal["completed", "awaiting_approval"] | FailureStatus


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
        self,
        *,
        store: Store,
        log: RunLog,
        models: ModelRegistry,
        tools: ToolRegistry,
        knowledge: Knowledge | None = None,
    ) -> None:
        self.store = store
        self.log = log
        self.models = models
        self.tools = tools
        self.knowledge = knowledge
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
        entities: Mapping[str, StoredAgent] | None = None,
    ) -> StartedRun:
        """Record a new run and start it. Raises ``UserError`` before writing anything.

        ``session_id`` continues that conversation; with ``create_session`` a session of
        that id that does not exist yet is created (clients that name their conversations).
        ``entities`` pins an orchestration's entities (a deployment's); by default they are
        the ones stored now.
        """
        if self._group is None:
            raise RuntimeError("RunManager is not running")
        spec = agent.spec
        self.check_agent(spec)  # a pinned snapshot may name what this server no longer has
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
        reasoning = spec.reasoning if reasoning is None else reasoning
        model = self.models.get(spec.model)  # raises now if it cannot run here
        if entities is None:
            entities = await resolve_entities(self.store, spec)
        if not new_session and await self.store.session_paused(session_id):
            raise Conflict(
                f"Session {session_id!r} has a run waiting for approval: decide on it first",
                field="session_id",
            )
        await self._after_cancelled_run(session_id)
        # No await between this check and the claim: two requests cannot both pass.
        if session_id in self._by_session:
            raise Conflict(
                f"Session {session_id!r} already has a run in progress", field="session_id"
            )
        live = self._by_session[session_id] = _LiveRun(session_id=session_id)
        try:
            history = [] if new_session else await self.store.history(session_id)
            run_id = f"run_{uuid.uuid4().hex}"
            started = RunStarted(
                run_id=run_id, seq=1, ts=time.time(), agent_id=spec.id, session_id=session_id
            )
            with anyio.CancelScope(shield=True):  # a run recorded is a run launched
                await self.store.create_run(
                    run_id=run_id,
                    agent=agent,
                    session_id=session_id,
                    new_session=new_session,
                    input=message,
                    reasoning_requested=reasoning,
                    first_event=started,
                )
        except BaseException:
            self._release(session_id, live)
            raise
        state = AgentState.begin(spec, history, message)
        self._launch(
            run_id, session_id, spec, model, reasoning, state, entities, seq=0, first=started
        )
        return StartedRun(run_id=run_id, session_id=session_id)

    async def resume(self, run_id: str) -> bool:
        """Continue a paused run once every approval it waits for is decided. False if some
        are still pending, or another request already continued it. Everything that could
        stop it from running is checked before it is claimed, so a refusal leaves it paused."""
        if self._group is None:
            raise RuntimeError("RunManager is not running")
        approvals = await self.store.approvals(run_id)
        if any(a.decision == "pending" for a in approvals):
            return False
        saved = await self.store.paused_state(run_id)
        if saved is None:
            return False
        spec = AgentSpec.model_validate(saved["agent"])
        self.check_agent(spec)
        model = self.models.get(spec.model)
        entities = await resolve_entities(self.store, spec)
        if (previous := self._live.get(run_id)) is not None:  # the pausing task, finishing up
            with anyio.move_on_after(10):
                await previous.done.wait()
        paused = await self.store.claim_paused_run(run_id)
        if paused is None:
            return False
        decisions = {
            a.call_id: Decision(a.decision == "approved", a.decided_by or "someone", a.reason)
            for a in approvals
        }
        self._by_session[paused.session_id] = _LiveRun(session_id=paused.session_id)
        self._launch(
            run_id,
            paused.session_id,
            spec,
            model,
            saved["reasoning"],
            AgentStateAdapter.validate_python(saved["loop"]),
            entities,
            seq=paused.last_seq,
            usage=paused.usage,
            decisions=decisions,
        )
        return True

    async def cancel_paused(self, run_id: str) -> bool:
        """Cancel a run that waits for approval (it has no task to cancel)."""
        last = RunFailed(
            run_id=run_id,
            seq=await self.store.last_seq(run_id) + 1,
            ts=time.time(),
            status="cancelled",
            message="Run cancelled",
        )
        return await self.store.cancel_paused_run(run_id, last)

    async def resume_decided(self) -> None:
        """At start-up: continue paused runs whose approvals were all decided before a
        crash cut in."""
        for run_id in await self.store.decided_paused_runs():
            try:
                await self.resume(run_id)
            except Exception:
                logger.exception("Could not continue run %s", run_id)

    def _release(self, session_id: str, live: _LiveRun) -> None:
        if self._by_session.get(session_id) is live:
            del self._by_session[session_id]

    def _launch(
        self,
        run_id: str,
        session_id: str,
        spec: AgentSpec,
        model: Model,
        reasoning: bool,
        state: AgentState,
        entities: Mapping[str, StoredAgent],
        *,
        seq: int,
        first: BaseEvent | None = None,
        usage: Usage | None = None,
        decisions: Mapping[str, Decision] | None = None,
    ) -> None:
        """Run (or continue after ``seq``) the agent as a task of its own, under the execution
        timeout, with a delegation tool per entity. ``first``, already stored, is published
        before anything else."""
        assert self._group is not None
        live = self._by_session[session_id]
        ctx = RunContext(
            run_id,
            log=self.log,
            store=self.store,
            pricing=self.models.info(spec.model),
            seq=seq + (first is not None),
            usage=usage,
        )
        tools = [*self.tools.select(spec.tools), *delegate_tools(self, ctx, entities)]
        if spec.knowledge_bases and self.knowledge is not None:
            tools.append(knowledge_search_tool(self.knowledge, spec.knowledge_bases))
        self.log.open(run_id, after=seq)
        if first is not None:
            ctx.publish(first)
        self._live[run_id] = live

        async def execute() -> None:
            outcome = _Outcome("interrupted", INTERRUPTED)
            try:
                with live.scope:
                    with anyio.move_on_after(spec.timeout_seconds) as deadline:
                        outcome = await self._execute(
                            ctx, spec, model, tools, state, reasoning, decisions
                        )
                    if deadline.cancelled_caught:
                        outcome = _Outcome(
                            "timeout", f"Execution timed out after {spec.timeout_seconds:g}s"
                        )
                if live.scope.cancelled_caught:
                    outcome = _Outcome("cancelled", live.cancel_reason or "Run cancelled")
            except Exception as exc:  # the start event could not be saved
                logger.exception("Run %s failed", run_id)
                outcome = _Outcome("error", _internal(run_id), detail=repr(exc))
            finally:
                with anyio.CancelScope(shield=True):
                    await self._finish(ctx, outcome, spec, reasoning)
                    if self._live.get(run_id) is live:
                        del self._live[run_id]
                    self._release(session_id, live)
                    live.done.set()

        self._group.start_soon(execute, name=run_id)

    def check_agent(self, spec: AgentSpec) -> None:
        """Refuse an agent whose model or tools this server does not have."""
        check_agent(spec, self.models, self.tools, knowledge=self.knowledge is not None)

    async def forget_session(self, session_id: str) -> bool:
        """Delete a session with its runs; holds the session meanwhile, so no run starts in
        it. ``Conflict`` while one of its runs is going; False if there is no such session."""
        if session_id in self._by_session:
            raise Conflict(
                f"Session {session_id!r} has a run in progress: cancel it first",
                field="session_id",
            )
        hold = self._by_session[session_id] = _LiveRun(session_id=session_id)
        try:
            return await self.store.delete_session(session_id)
        finally:
            self._release(session_id, hold)

    def subscribe(self, run_id: str, *, after: int = 0) -> Subscription | None:
        """Follow a run's events (deltas included) from the first with ``seq > after``; None
        if it is not in this server's log (finished a while ago, or never ran here): its
        persisted events are in the store."""
        if run_id not in self.log:
            return None
        return self.log.subscribe(run_id, after=after)

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

    async def _execute(
        self,
        ctx: RunContext,
        spec: AgentSpec,
        model: Model,
        tools: list[Tool],
        state: AgentState,
        reasoning: bool,
        decisions: Mapping[str, Decision] | None,
    ) -> _Outcome:
        """Run the agent; every exception becomes an outcome, none escapes to the task group.

        What the run's viewers read of an unexpected error is generic (a public chat may be
        watching); the details go to the log and the run's record.
        """
        try:
            answer = await run_agent(
                ctx, spec, model, tools, state=state, reasoning=reasoning, decisions=decisions
            )
        except AwaitingApproval as pause:
            return _Outcome("awaiting_approval", paused=pause)
        except RunError as exc:
            return _Outcome("error", str(exc))
        except Exception as exc:
            logger.exception("Run %s failed", ctx.run_id)
            return _Outcome("error", _internal(ctx.run_id), detail=f"{type(exc).__name__}: {exc}")
        return _Outcome("completed", answer=answer)

    async def _finish(
        self, ctx: RunContext, outcome: _Outcome, spec: AgentSpec, reasoning: bool
    ) -> None:
        """End the run (or this part of it) truthfully: settle open tool calls, then record
        the outcome with its last event in one transaction and publish that event. Viewers
        always get a last event, even when the store fails."""
        try:
            for call_id, (step, name) in list(ctx.open_tool_calls.items()):
                await ctx.emit(
                    ToolResult, step=step, call_id=call_id, tool_name=name, status="cancelled"
                )
            answer = outcome.answer
            last: BaseEvent
            if outcome.paused is not None:
                asked = outcome.paused.asked
                last = ctx.stamp(RunPaused, awaiting=[call.id for call in asked])
                await self.store.pause_run(
                    ctx.run_id,
                    state={
                        "agent": spec.model_dump(mode="json"),
                        "reasoning": reasoning,
                        "loop": AgentStateAdapter.dump_python(outcome.paused.state, mode="json"),
                    },
                    usage=ctx.usage,
                    approvals=[(call.id, call.name, call.arguments) for call in asked],
                    last_event=last,
                )
                ctx.publish(last)
                self.log.close(ctx.run_id)
                return
            if answer is not None:
                last = ctx.stamp(RunCompleted, content=answer.content, usage=ctx.usage)
            else:
                assert outcome.status not in ("completed", "awaiting_approval")
                last = ctx.stamp(RunFailed, status=outcome.status, message=outcome.message)
            await self.store.finish_run(
                ctx.run_id,
                status=outcome.status,
                content=answer.content if answer else None,
                error=outcome.detail or outcome.message or None,
                usage=ctx.usage,
                memory=answer.memory if answer else (),
                last_event=last,
            )
        except Exception:
            logger.exception("Could not record the end of run %s", ctx.run_id)
            message = f"The run's outcome could not be saved; see the server log ({ctx.run_id})"
            last = ctx.stamp(RunFailed, status="error", message=message)
            try:  # at least the status, so the run does not stay "running"
                await self.store.mark_failed(ctx.run_id, message)
            except Exception:
                logger.exception("Could not mark run %s failed", ctx.run_id)
        ctx.publish(last)
        self.log.close(ctx.run_id)


@dataclass(frozen=True, slots=True)
class _Outcome:
    status: RunStatus
    message: str = ""
    """What the run's last event says."""
    detail: str | None = None
    """What the run's record says, if more than the message (authenticated readers only)."""
    answer: AgentAnswer | None = None
    paused: AwaitingApproval | None = None


def _internal(run_id: str) -> str:
    return f"Internal error; the server log has the details of run {run_id}"


def check_agent(
    spec: AgentSpec, models: ModelRegistry, tools: ToolRegistry, *, knowledge: bool = True
) -> None:
    """Refuse an agent whose model or tools are not in the registries (``UserError`` naming
    the field)."""
    if spec.model not in models:
        known = ", ".join(models.names())
        raise UserError(
            f"Unknown model {spec.model!r}; known: {known} (GET /api/models)", field="model"
        )
    if unknown := [name for name in spec.tools if name not in tools]:
        raise UserError(
            f"Unknown tools {unknown}; available: {', '.join(tools.names())}", field="tools"
        )
    if spec.knowledge_bases and not knowledge:
        raise UserError("This server has no knowledge bases", field="knowledge_bases")
