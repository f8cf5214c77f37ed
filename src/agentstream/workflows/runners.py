"""How agent and orchestration blocks run: behind two small protocols the engine is handed.

So the engine needs nothing of the store, the model registry, the server or the runtime
(whose runners are in ``runtime.blocks``). A runner
reports what its agents do as canonical agent events (``agentstream.events``) to the
``events`` callback, which re-scopes them to the block, and returns the final answer; it
raises (preferably a ``RunError`` with a message for people) when there is none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from agentstream.agents import AgentSpec
from agentstream.events import BaseEvent

__all__ = [
    "AgentEvents",
    "AgentRunner",
    "OrchestrationRunner",
    "needs_a_run",
]

AgentEvents = Callable[[Sequence[BaseEvent]], Awaitable[None]]
"""Where a runner sends the canonical events of the agents it runs, as they happen: those
that came at once together."""


class AgentRunner(Protocol):
    async def run_agent(
        self, agent: str | AgentSpec, message: str, *, reasoning: bool | None, events: AgentEvents
    ) -> str:
        """Run the agent (a saved agent's id, or a spec) on ``message``; the answer."""
        ...


class OrchestrationRunner(Protocol):
    async def run_orchestration(
        self, orchestration: str, message: str, *, events: AgentEvents, execution_id: str
    ) -> str:
        """Run the orchestration on ``message`` for the execution ``execution_id`` (its
        coordinator's run is that execution's child); the coordinator's final synthesis."""
        ...


def needs_a_run(spec: AgentSpec) -> str | None:
    """Why an agent block cannot run ``spec``, or None. Delegating and searching knowledge
    are tools only a run has (their handlers record against its id); an agent block is not
    one, and quietly running the agent without them would answer differently."""
    if spec.delegates:
        return (
            f"Agent {spec.id!r} delegates to other agents, which an agent block cannot do: "
            "use an orchestration block"
        )
    if spec.knowledge_bases:
        return f"Agent {spec.id!r} searches knowledge bases, which agent blocks cannot do yet"
    return None
