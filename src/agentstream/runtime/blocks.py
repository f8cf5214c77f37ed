"""The runtime side of workflow agent and orchestration blocks: the runners the DAG engine
is handed (``workflows.runners`` has their protocols), on the runtime's own agent loop and
run manager."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

import anyio

from agentstream.agents import AgentSpec
from agentstream.providers.registry import ModelRegistry
from agentstream.runtime.agent import AgentState, AwaitingApproval, run_agent
from agentstream.runtime.context import RunContext
from agentstream.runtime.orchestration import follow_run
from agentstream.runtime.ports import AgentLookup, Runs
from agentstream.runtime.tools import ToolRegistry
from agentstream.workflows.errors import BlockFailed
from agentstream.workflows.runners import AgentEvents, needs_a_run

__all__ = ["RuntimeAgentRunner", "RuntimeOrchestrationRunner"]


class RuntimeAgentRunner:
    """Runs agents on the runtime's own agent loop, as a run does, but each event goes to
    the workflow instead of a run's log and store (the context's sink is the block's
    ``events``). Agents that need a run's own tools are refused (``needs_a_run``)."""

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
        if reason := needs_a_run(spec):
            raise BlockFailed(reason)
        try:
            tools = self.tools.select(spec.tools)
        except KeyError as exc:
            raise BlockFailed(f"Agent {spec.id!r} cannot run here: {exc.args[0]}") from None
        model = self.models.get(spec.model)
        # Not a run: nothing is kept, every event goes to the workflow, which keeps its own.
        context = RunContext(
            f"wfa_{secrets.token_hex(16)}", sink=events, pricing=self.models.info(spec.model)
        )
        state = AgentState.begin(spec, [], message)
        try:
            with anyio.fail_after(spec.timeout_seconds):
                answer = await run_agent(
                    context,
                    spec,
                    model,
                    tools,
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


class RuntimeOrchestrationRunner:
    """Runs an orchestration as a run of its coordinator agent, so the coordinator and each
    entity it delegates to are recorded, replayable and cancellable like any run.

    Every event of the coordinator's run goes to the block's ``events``: its text, reasoning
    and tool calls (a delegation is its ``delegate_to_<entity>`` tool call, whose result is
    the entity's answer), and its delegation events, which a workflow may drop. Entity text
    reaches the workflow only as those results, never as the block's own content. Cancelling
    the block cancels the coordinator's run, which cancels its entities' runs.
    """

    def __init__(self, runs: Runs, agents: AgentLookup) -> None:
        self.runs = runs
        self.agents = agents

    async def run_orchestration(
        self, orchestration: str, message: str, *, events: AgentEvents, execution_id: str
    ) -> str:
        coordinator = await self.agents.get_agent(orchestration)
        if coordinator is None:
            raise BlockFailed(f"No agent {orchestration!r} to coordinate the orchestration")
        if not coordinator.spec.delegates:
            raise BlockFailed(
                f"Agent {orchestration!r} is not an orchestration: it delegates to no one"
            )
        started = await self.runs.start(coordinator, message, parent_run_id=execution_id)
        ending = await follow_run(
            self.runs, started.run_id, events, reason="Cancelled with its workflow execution"
        )
        if ending.status != "completed":
            raise BlockFailed(
                f"Orchestration {orchestration!r} did not answer ({ending.status}): {ending.text}"
            )
        return ending.text
