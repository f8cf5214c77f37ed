"""Agent runs: the agent loop is the program the supervisor launches, in a session.

Starting one checks the agent, claims its session (one run at a time in a conversation),
records the run with its first events (its start, its first step's: one write), then
launches it. Its ending, however it came (answer, approval pause, error, timeout, cancel,
server stop), settles open tool calls as cancelled and is recorded once, with the
session's memory, and its terminal event.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

import anyio

from agentstream.agents import AgentSpec, StoredAgent
from agentstream.errors import Conflict, NotFound, RunError, ShuttingDown, UserError
from agentstream.events import (
    BaseEvent,
    FailureStatus,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunStarted,
    StepStarted,
    Usage,
    cancelled_tool_calls,
)
from agentstream.providers.base import Message, Model
from agentstream.providers.registry import ModelRegistry
from agentstream.runlog import LogSubscription
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
from agentstream.runtime.ports import AgentRunStore, StartedRun
from agentstream.runtime.supervisor import Stopped, Supervisor, internal_error
from agentstream.runtime.tools import Tool, ToolRegistry
from agentstream.telemetry import RunAbout

__all__ = ["RunManager", "check_agent"]

logger = logging.getLogger(__name__)

RunStatus = Literal["completed", "awaiting_approval"] | FailureStatus


@dataclass(slots=True)
class _Claim:
    """A session taken by a run (or by its deletion): no other run starts in it."""

    run_id: str | None = None
    """The run holding it, once launched."""


class RunManager:
    """Starts agent runs as runs of the supervisor, continues paused ones, and ends them."""

    def __init__(
        self,
        *,
        store: AgentRunStore,
        supervisor: Supervisor,
        models: ModelRegistry,
        tools: ToolRegistry,
        knowledge_search: Callable[[Sequence[str]], Tool] | None = None,
    ) -> None:
        """``knowledge_search`` makes the ``knowledge_search`` tool for an agent's knowledge
        bases (``agentstream.knowledge.tool``); None: this server has no knowledge bases."""
        self.store = store
        self.supervisor = supervisor
        self.log = supervisor.log
        self.models = models
        self.tools = tools
        self.knowledge_search = knowledge_search
        self._by_session: dict[str, _Claim] = {}

    async def start(
        self,
        agent: StoredAgent,
        message: str,
        *,
        session_id: str | None = None,
        create_session: bool = False,
        reasoning: bool | None = None,
        entities: Mapping[str, StoredAgent] | None = None,
        earlier: Sequence[Message] = (),
        instructions: str | None = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
    ) -> StartedRun:
        """Record a new run and start it. Raises ``UserError`` before writing anything.

        ``session_id`` continues that conversation; with ``create_session`` a session of
        that id that does not exist yet is created (clients that name their conversations).
        ``entities`` pins an orchestration's entities (a deployment's); by default they are
        the ones stored now. ``earlier``: the conversation so far, for a new session, from a
        client that keeps it itself (the OpenAI-compatible API), which the session keeps
        from then on. ``instructions``: more system instructions, for this run only.
        ``run_id``: the id a client chose (AG-UI's), free; by default a new one.
        ``parent_run_id``: the run that starts this one (a coordinator's, an execution's).
        """
        if earlier and session_id is not None:
            raise ValueError("earlier turns are for a new session only")
        self.supervisor.admit()
        spec = agent.spec
        self.check_agent(spec)  # a pinned snapshot may name what this server no longer has
        new_session = session_id is None
        if session_id is None:
            session_id = f"ses_{secrets.token_hex(16)}"
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
        claim = self._by_session[session_id] = _Claim()
        try:
            history = list(earlier) if new_session else await self.store.history(session_id)
            state = AgentState.begin(
                spec, history, message, instructions=instructions, new_history=bool(earlier)
            )
            run_id = run_id or f"run_{secrets.token_hex(16)}"
            started = time.time()
            first = (
                RunStarted(
                    run_id=run_id, seq=1, ts=started, agent_id=spec.id, session_id=session_id
                ),
                StepStarted(run_id=run_id, seq=2, ts=started, step=state.step),
            )
            with anyio.CancelScope(shield=True):  # a run recorded is a run launched
                await self.store.create_run(
                    run_id=run_id,
                    agent=agent,
                    session_id=session_id,
                    new_session=new_session,
                    input=message,
                    reasoning_requested=reasoning,
                    first_events=first,
                    owner=self.supervisor.process_id,
                    parent_run_id=parent_run_id,
                )
        except BaseException:
            self._release(session_id, claim)
            raise
        state.step_started = True
        self._launch(
            run_id, session_id, spec, model, reasoning, state, entities, seq=0, first=first
        )
        await self.supervisor.followable(run_id)
        return StartedRun(run_id=run_id, session_id=session_id)

    async def resume(self, run_id: str) -> bool:
        """Continue a paused run once every approval it waits for is decided. False if some
        are still pending, or another request already continued it. Everything that could
        stop it from running is checked before it is claimed, so a refusal leaves it paused."""
        self.supervisor.admit()
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
        if (previous := self.supervisor.get(run_id)) is not None:  # the pausing task, ending
            with anyio.move_on_after(10):
                await previous.done.wait()
        paused = await self.store.claim_paused_run(run_id, self.supervisor.process_id)
        if paused is None:
            return False
        decisions = {
            a.call_id: Decision(a.decision == "approved", a.decided_by or "someone", a.reason)
            for a in approvals
        }
        self._by_session[paused.session_id] = _Claim()
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
        await self.supervisor.followable(run_id)
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
        """At start-up, and every lease round: continue paused runs whose approvals were all
        decided, but which nobody continued (a crash cut in, or the process that recorded
        the last decision was stopping). Not while this process is stopping itself."""
        for run_id in await self.store.decided_paused_runs():
            try:
                await self.resume(run_id)
            except ShuttingDown:
                return
            except Exception:
                logger.exception("Could not continue run %s", run_id)

    def _release(self, session_id: str, claim: _Claim) -> None:
        if self._by_session.get(session_id) is claim:
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
        first: Sequence[BaseEvent] = (),
        usage: Usage | None = None,
        decisions: Mapping[str, Decision] | None = None,
    ) -> None:
        """Run (or continue after ``seq``) the agent as a run of the supervisor, under its
        execution timeout, with a delegation tool per entity. ``first``, already stored, is
        published before anything else."""
        claim = self._by_session[session_id]
        ctx = RunContext(
            run_id,
            log=self.log,
            store=self.store,
            pricing=self.models.info(spec.model),
            seq=seq + len(first),
            usage=usage,
        )
        tools = [*self.tools.select(spec.tools), *delegate_tools(self, ctx, entities)]
        if spec.knowledge_bases and self.knowledge_search is not None:
            tools.append(self.knowledge_search(spec.knowledge_bases))
        self.log.open(run_id, after=seq)
        for event in first:
            ctx.publish(event)
        claim.run_id = run_id

        async def finish(ending: _Outcome | Stopped) -> BaseEvent:
            try:
                return await self._finish(ctx, ending, spec, reasoning)
            finally:
                self._release(session_id, claim)

        self.supervisor.launch(
            run_id,
            partial(self._execute, ctx, spec, model, tools, state, reasoning, decisions),
            finish,
            timeout=spec.timeout_seconds,
            about=RunAbout("agent", agent=spec.id, session_id=session_id),
        )

    def check_agent(self, spec: AgentSpec) -> None:
        """Refuse an agent whose model or tools this server does not have."""
        check_agent(spec, self.models, self.tools, knowledge=self.knowledge_search is not None)

    async def forget_session(self, session_id: str) -> bool:
        """Delete a session with its runs; holds the session meanwhile, so no run starts in
        it. ``Conflict`` while one of its runs is going; False if there is no such session."""
        if session_id in self._by_session:
            raise Conflict(
                f"Session {session_id!r} has a run in progress: cancel it first",
                field="session_id",
            )
        hold = self._by_session[session_id] = _Claim()
        try:
            return await self.store.delete_session(session_id)
        finally:
            self._release(session_id, hold)

    def subscribe(self, run_id: str) -> LogSubscription:
        """Follow a run just started (or continued) from its first event."""
        return self.log.subscribe(run_id)

    def cancel(self, run_id: str, reason: str = "Run cancelled") -> anyio.Event | None:
        """Stop a live run. Returns the event set once it has ended, or None if the run is
        not live here."""
        return self.supervisor.cancel(run_id, reason)

    async def _after_cancelled_run(self, session_id: str) -> None:
        """A run being cancelled still holds its session for a moment: let it finish, so
        "Stop" then a new message works."""
        claim = self._by_session.get(session_id)
        live = self.supervisor.get(claim.run_id) if claim and claim.run_id else None
        if live is not None and live.stopped is not None:
            with anyio.move_on_after(10):
                await live.done.wait()

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
            return _Outcome(
                "error", internal_error(ctx.run_id), detail=f"{type(exc).__name__}: {exc}"
            )
        return _Outcome("completed", answer=answer)

    async def _finish(
        self, ctx: RunContext, ending: _Outcome | Stopped, spec: AgentSpec, reasoning: bool
    ) -> BaseEvent:
        """End the run (or this part of it) truthfully: settle open tool calls, then record
        the outcome with its last event in one transaction and publish that event, which it
        returns."""
        outcome = (
            ending if isinstance(ending, _Outcome) else _Outcome(ending.status, ending.message)
        )
        await ctx.emit_all(*cancelled_tool_calls(ctx.open_tool_calls))
        if outcome.paused is not None:
            asked = outcome.paused.asked
            state = {
                "agent": spec.model_dump(mode="json"),
                "reasoning": reasoning,
                "loop": AgentStateAdapter.dump_python(outcome.paused.state, mode="json"),
            }

            async def pause(last: BaseEvent) -> None:
                await self.store.pause_run(
                    ctx.run_id,
                    state=state,
                    usage=ctx.usage,
                    approvals=[(call.id, call.name, call.arguments) for call in asked],
                    last_event=last,
                )

            return await ctx.end(ctx.stamp(RunPaused, awaiting=[call.id for call in asked]), pause)
        answer = outcome.answer
        last: BaseEvent
        if answer is not None:
            last = ctx.stamp(RunCompleted, content=answer.content, usage=ctx.usage)
        else:
            assert outcome.status not in ("completed", "awaiting_approval")
            last = ctx.stamp(RunFailed, status=outcome.status, message=outcome.message)

        async def record(last: BaseEvent) -> None:
            await self.store.finish_run(
                ctx.run_id,
                status=outcome.status,
                content=answer.content if answer else None,
                error=outcome.detail or outcome.message or None,
                usage=ctx.usage,
                memory=answer.memory if answer else (),
                last_event=last,
            )

        return await ctx.end(last, record)


@dataclass(frozen=True, slots=True)
class _Outcome:
    status: RunStatus
    message: str = ""
    """What the run's last event says."""
    detail: str | None = None
    """What the run's record says, if more than the message (authenticated readers only)."""
    answer: AgentAnswer | None = None
    paused: AwaitingApproval | None = None


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
