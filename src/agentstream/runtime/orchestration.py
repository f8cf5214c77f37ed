"""Orchestration: a coordinator agent whose tools are other agents, its entities.

An agent with ``delegates`` gets a ``delegate_to_<entity>`` tool for each. A call starts the
entity as a run of its own (recorded, replayable, cancellable by id), forwards its text live
into the coordinator's run (and records it there whole once the entity ends, for replay),
and returns its answer as the tool's result, which the coordinator's model reads to
synthesise. Calls made in one turn run concurrently, like every tool call. Cancelling the
coordinator cancels each entity run and waits for it to record its ending, so no entity
outlives its coordinator.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import anyio

from agentstream.agents import AgentSpec, StoredAgent
from agentstream.errors import NotFound, RunError, UserError
from agentstream.events import (
    BaseEvent,
    DelegationCompleted,
    DelegationStarted,
    Emitted,
    EntityChunk,
    EntityText,
    FailureStatus,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunStarted,
    TextDelta,
)
from agentstream.runtime.context import RunContext
from agentstream.runtime.ports import AgentLookup, Runs
from agentstream.runtime.tools import Tool

__all__ = ["EntityFailed", "RunEnding", "delegate_tools", "follow_run", "resolve_entities"]

_TOOL_PREFIX = "delegate_to_"
"""A delegation tool is named this, then the entity's id."""
_TASK = "The whole task, with all it needs to know: the agent sees nothing else."
_STOP_WAIT = 10.0
"""Seconds a cancelled run gets to record its ending before its follower goes on."""


class EntityFailed(RunError):
    """An entity's run ended without an answer; the coordinator's model reads why."""


async def resolve_entities(agents: AgentLookup, coordinator: AgentSpec) -> dict[str, StoredAgent]:
    """The coordinator's entities as stored now, pinned for its run.

    Refuses an entity that does not exist, and delegations that lead back to the
    coordinator: each entity would start the next run, without end.
    """
    entities: dict[str, StoredAgent] = {}
    for entity_id in coordinator.delegates:
        stored = await agents.get_agent(entity_id)
        if stored is None:
            raise NotFound(
                f"Agent {coordinator.id!r} delegates to {entity_id!r}, which does not exist",
                field="delegates",
            )
        entities[entity_id] = stored
    seen = set(entities)
    reachable = [stored.spec for stored in entities.values()]
    while reachable:
        spec = reachable.pop()
        if coordinator.id in spec.delegates:
            raise UserError(
                f"Agent {coordinator.id!r} delegates to {spec.id!r}, which delegates back to it",
                field="delegates",
            )
        for entity_id in set(spec.delegates) - seen:
            seen.add(entity_id)
            if (stored := await agents.get_agent(entity_id)) is not None:
                reachable.append(stored.spec)
    return entities


def delegate_tools(runs: Runs, ctx: RunContext, entities: Mapping[str, StoredAgent]) -> list[Tool]:
    """One tool per entity, delegating from the coordinator's run ``ctx``."""
    return [_delegate_tool(runs, ctx, entity) for entity in entities.values()]


def _delegate_tool(runs: Runs, ctx: RunContext, entity: StoredAgent) -> Tool:
    async def delegate(task: Annotated[str, _TASK]) -> str:
        return await _delegate(runs, ctx, entity, task)

    spec = entity.spec
    purpose = " ".join(spec.instructions.split())[:300]
    return Tool.from_function(
        delegate,
        name=_TOOL_PREFIX + spec.id,
        description=f"Hand a task to the agent {spec.name or spec.id!r} and get its answer. "
        f"Its instructions: {purpose}",
    )


async def _delegate(runs: Runs, ctx: RunContext, entity: StoredAgent, task: str) -> str:
    started = await runs.start(entity, task, parent_run_id=ctx.run_id)
    scope = {"entity": entity.spec.id, "entity_run_id": started.run_id}

    def shown(events: Sequence[BaseEvent]) -> Iterator[Emitted]:
        """What the coordinator's run shows of the entity's events."""
        for event in events:
            match event:
                case RunStarted():
                    yield DelegationStarted, {**scope, "task": task}
                case TextDelta(delta=delta, separator=separator):
                    yield EntityChunk, {**scope, "delta": separator + delta}

    async def forward(events: Sequence[BaseEvent]) -> None:
        await ctx.emit_all(*shown(events))

    async def settle(**outcome: str) -> None:
        """The delegation's end, with its answer: final-turn text only (a preamble, or a turn
        cut off, is never persisted); in one write."""
        text = outcome.get("content")
        answer = [(EntityText, {**scope, "text": text})] if text else []
        await ctx.emit_all(*answer, (DelegationCompleted, {**scope, **outcome}))

    try:
        ending = await follow_run(
            runs, started.run_id, forward, reason="Cancelled with its coordinator's run"
        )
    except BaseException:  # cancelled, most likely: follow_run stopped the entity
        with anyio.move_on_after(_STOP_WAIT, shield=True):
            await settle(status="cancelled", error="Run cancelled")
        raise
    if ending.status == "completed":
        await settle(status="completed", content=ending.text)
        return ending.text
    await settle(status=ending.status, error=ending.text)
    raise EntityFailed(f"Agent {entity.spec.id!r} did not answer ({ending.status}): {ending.text}")


@dataclass(frozen=True, slots=True)
class RunEnding:
    """How a followed run ended."""

    status: Literal["completed"] | FailureStatus
    text: str
    """The answer if it completed, else why not."""


async def follow_run(
    runs: Runs,
    run_id: str,
    forward: Callable[[Sequence[BaseEvent]], Awaitable[None]],
    *,
    reason: str,
) -> RunEnding:
    """Hand the events of a run just started to ``forward``, those read at once together,
    until the run ends; how it ended.

    The run must not outlive its follower: should following stop first (cancelled, most
    likely), the run is cancelled for ``reason`` and waited for until it has recorded its
    ending. A run that pauses for an approval is cancelled: nobody would decide on it.
    """
    subscription = runs.subscribe(run_id)
    last: BaseEvent | None = None
    try:
        while batch := await subscription.next_batch():
            await forward(batch)
            last = batch[-1]
    except BaseException:
        with anyio.move_on_after(_STOP_WAIT, shield=True):
            stopped = runs.cancel(run_id, reason)
            if stopped is not None:
                await stopped.wait()
        raise
    finally:
        subscription.close()
    match last:
        case RunCompleted(content=content):
            return RunEnding("completed", content)
        case RunFailed(status=status, message=message):
            return RunEnding(status, message)
        case RunPaused():
            await runs.cancel_paused(run_id)
            return RunEnding("cancelled", "It waited for an approval, which nobody can give here")
    return RunEnding("interrupted", "Its run ended without an outcome")
