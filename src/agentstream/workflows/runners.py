"""How agent and orchestration blocks run: behind two small protocols the engine is handed.

So the engine needs nothing of the store, the model registry or the server. A runner
reports what its agents do as canonical agent events (``agentstream.events``) to the
``events`` callback, which re-scopes them to the block, and returns the final answer; it
raises (preferably a ``RunError`` with a message for people) when there is none.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import anyio

from agentstream.agents import AgentSpec
from agentstream.events import BaseEvent, Usage
from agentstream.providers.registry import ModelRegistry
from agentstream.runtime.agent import AgentState, AwaitingApproval, run_agent
from agentstream.runtime.context import RunContext
from agentstream.runtime.tools import ToolRegistry
from agentstream.workflows.errors import BlockFailed

__all__ = ["AgentEvents", "AgentRunner", "OrchestrationRunner", "RuntimeAgentRunner"]

E = TypeVar("E", bound=BaseEvent)

AgentEvents = Callable[[BaseEvent], Awaitable[None]]
"""Where a runner sends the canonical events of the agents it runs, as they happen."""


class AgentRunner(Protocol):
    async def run_agent(
        self, agent: str | AgentSpec, message: str, *, reasoning: bool | None, events: AgentEvents
    ) -> str:
        """Run the agent (a saved agent's id, or a spec) on ``message``; the answer."""
        ...


class OrchestrationRunner(Protocol):
    async def run_orchestration(
        self, orchestration: str, message: str, *, events: AgentEvents
    ) -> str:
        """Run the orchestration on ``message``; the coordinator's final synthesis."""
        ...


class RuntimeAgentRunner:
    """Runs agents on the runtime's own agent loop, as a run does, but each event goes to
    the workflow instead of a run's log and store."""

    def __init__(
        self,
        *,
        models: ModelRegistry,
        tools: ToolRegistry,
        agents: Callable[[str], Awaitable[AgentSpec]],
    ) -> None:
        """``agents`` finds a saved agent by id (raising ``NotFound`` if there is none)."""
        self.models = models
        self.tools = tools
        self.agents = agents

    async def run_agent(
        self, agent: str | AgentSpec, message: str, *, reasoning: bool | None, events: AgentEvents
    ) -> str:
        spec = agent if isinstance(agent, AgentSpec) else await self.agents(agent)
        if unknown := [name for name in spec.tools if name not in self.tools]:
            raise BlockFailed(f"Agent {spec.id!r} uses unknown tools: {', '.join(unknown)}")
        model = self.models.get(spec.model)
        context = _ForwardingContext(events, self.models, spec.model)
        state = AgentState.begin(spec, [], message)
        try:
            with anyio.fail_after(spec.timeout_seconds):
                answer = await run_agent(
                    context,
                    spec,
                    model,
                    self.tools.select(spec.tools),
                    state=state,
                    reasoning=spec.reasoning if reasoning is None else reasoning,
                )
        except TimeoutError:
            raise BlockFailed(
                f"Agent {spec.id!r} timed out after {spec.timeout_seconds:g}s"
            ) from None
        except AwaitingApproval as pause:
            names = ", ".join(call.name for call in pause.asked)
            raise BlockFailed(
                f"Agent {spec.id!r} asked for approval to call {names}: tools that need "
                "approval cannot run in a workflow"
            ) from None
        return answer.content


class _ForwardingContext(RunContext):
    """A run context that keeps nothing: every event goes to the workflow, which stamps,
    publishes and persists it as its own. The log and store of a run are never touched, so
    they are not set up."""

    def __init__(self, events: AgentEvents, models: ModelRegistry, model: str) -> None:
        self.run_id = f"wfa_{uuid.uuid4().hex}"
        self.pricing = models.info(model)
        self.usage = self.pricing.priced(Usage())
        self.open_tool_calls = {}
        self._seq = 0
        self._events = events

    def publish(self, event: BaseEvent) -> None:
        raise NotImplementedError("events go through emit")

    async def emit(self, kind: type[E], /, **fields: Any) -> E:
        event = self.stamp(kind, **fields)
        await self._events(event)
        return event
