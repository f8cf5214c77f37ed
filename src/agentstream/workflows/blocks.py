"""What each block type does when it runs: its configuration and upstream outputs in, its
output out. Failures a person should read are raised as ``BlockFailed``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread

from agentstream.inputs import find_problem
from agentstream.workflows.definition import (
    AgentBlock,
    Block,
    Branch,
    ConditionBlock,
    FunctionBlock,
    HttpBlock,
    OrchestrationBlock,
    ResponseBlock,
    StartBlock,
    TemplateBlock,
)
from agentstream.workflows.errors import BlockFailed
from agentstream.workflows.expressions import Expression, parse_expression
from agentstream.workflows.http_block import SafeHttpClient
from agentstream.workflows.references import as_text, resolve
from agentstream.workflows.runners import AgentEvents, AgentRunner, OrchestrationRunner

__all__ = ["Outputs", "Services", "run_block"]

Outputs = Mapping[str, Mapping[str, Any] | None]
"""The outputs of the blocks that ran, by id; None for skipped blocks."""


@dataclass(frozen=True, slots=True)
class Services:
    """What blocks need from outside the engine."""

    agents: AgentRunner | None = None
    orchestrations: OrchestrationRunner | None = None
    functions: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    http: SafeHttpClient = field(default_factory=SafeHttpClient)


async def run_block(
    block: Block,
    services: Services,
    outputs: Outputs,
    *,
    inputs: Any,
    events: AgentEvents,
    execution_id: str,
) -> dict[str, Any]:
    """Run ``block`` in the execution ``execution_id``: ``inputs`` are the execution's (for
    the start block), ``events`` receives what its agents do. An output that cannot be
    streamed and stored as JSON (say ``float('inf')``) fails the block."""
    output = await _output(
        block, services, outputs, inputs=inputs, events=events, execution_id=execution_id
    )
    if (problem := find_problem(output)) is not None:
        raise BlockFailed(f"The block's output is not valid JSON: {problem}")
    return output


async def _output(
    block: Block,
    services: Services,
    outputs: Outputs,
    *,
    inputs: Any,
    events: AgentEvents,
    execution_id: str,
) -> dict[str, Any]:
    match block:
        case StartBlock():
            return {"input": inputs}
        case AgentBlock(agent=agent, input=message, reasoning=reasoning):
            if services.agents is None:
                raise BlockFailed("Agent blocks cannot run here: no agent runner is set up")
            text = as_text(resolve(message, outputs))
            content = await services.agents.run_agent(
                agent, text, reasoning=reasoning, events=events
            )
            return {"content": content}
        case OrchestrationBlock(orchestration=orchestration, input=message):
            if services.orchestrations is None:
                raise BlockFailed("Orchestration blocks cannot run here: no runner is set up")
            text = as_text(resolve(message, outputs))
            content = await services.orchestrations.run_orchestration(
                orchestration, text, events=events, execution_id=execution_id
            )
            return {"content": content}
        case ConditionBlock(branches=branches):
            return {"branch": await _off_loop(functools.partial(_taken, branches), outputs)}
        case FunctionBlock(expression=str(expression)):
            return {"result": await _off_loop(_expression(expression).evaluate, outputs)}
        case FunctionBlock(function=str(name), args=args):
            return {"result": await _call(services, name, resolve(args, outputs))}
        case HttpBlock(timeout_seconds=limit):
            url = as_text(resolve(block.url, outputs))
            try:
                with anyio.fail_after(limit):
                    return await services.http.request(
                        block.method,
                        url,
                        headers={k: as_text(v) for k, v in resolve(block.headers, outputs).items()},
                        body=resolve(block.body, outputs),
                    )
            except TimeoutError:
                raise BlockFailed(f"No response within {limit:g}s") from None
        case TemplateBlock(template=template):
            return {"text": as_text(resolve(template, outputs))}
        case ResponseBlock(output=output):
            return {"result": resolve(output, outputs)}
    # Only a function block with neither expression nor function, which validation refuses.
    raise AssertionError(f"block {block.id!r} is invalid")


@functools.lru_cache(maxsize=1024)
def _expression(text: str) -> Expression:
    """Parsed once per text: the definition was checked when saved, not per execution."""
    return parse_expression(text)


def _taken(branches: Sequence[Branch], outputs: Outputs) -> str | None:
    """The first branch whose condition holds (one without a condition always does)."""
    return next(
        (b.name for b in branches if b.when is None or _expression(b.when).evaluate(outputs)),
        None,
    )


async def _off_loop(evaluate: Callable[[Outputs], Any], outputs: Outputs) -> Any:
    """Evaluate in a worker thread: an expression is bounded but may take most of a second,
    and on the loop every stream would wait for it. A cancelled block waits for it to end
    (it cannot be interrupted, but it is bounded). The outputs are copied, as the other
    branches keep adding to them."""
    return await anyio.to_thread.run_sync(evaluate, dict(outputs))


async def _call(services: Services, name: str, args: dict[str, Any]) -> Any:
    """A registered function: async ones awaited, others run in a worker thread so a slow
    one cannot stall the other branches. What it raises is reported, as a tool's would be."""
    function = services.functions.get(name)
    if function is None:
        raise BlockFailed(f"No function {name!r} is registered")
    try:
        if inspect.iscoroutinefunction(function):
            return await function(**args)
        return await anyio.to_thread.run_sync(functools.partial(function, **args))
    except Exception as exc:
        raise BlockFailed(f"{name} raised {type(exc).__name__}: {exc}") from exc
