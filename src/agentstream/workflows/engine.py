"""The DAG executor: runs each block once all edges into it are settled, independent branches
concurrently, and reports everything as canonical events through the run's emitter.

An edge is *taken* when its source succeeded (for a condition, through the branch it
chose), or, for an error edge, when its source failed. A block runs when every edge into it
is settled and at least one was taken; when none was, it is skipped, which settles its own
edges as not taken. A failure with no error edge leading on short-circuits the execution:
the other blocks are cancelled and the execution ends in error.

The engine is a program the supervisor runs (``runtime.supervisor``): it returns how the
execution ended, and the supervisor ends the run with its terminal event, as for every run.
It does no I/O of its own besides the blocks' work and the emitter.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup

from agentstream.errors import AgentstreamError
from agentstream.events import (
    BaseEvent,
    BlockCompleted,
    BlockError,
    BlockOutput,
    BlockSkipped,
    BlockStarted,
    Emitted,
    Reasoning,
    ReasoningDelta,
    RunStarted,
    Text,
    TextDelta,
    TextRetracted,
    ToolCall,
    ToolResult,
    cancelled_tool_calls,
)
from agentstream.workflows.blocks import Services, run_block
from agentstream.workflows.definition import ConditionBlock, ResponseBlock, Workflow
from agentstream.workflows.errors import WorkflowInvalid
from agentstream.workflows.graph import Graph
from agentstream.workflows.http_block import SafeHttpClient
from agentstream.workflows.runners import AgentRunner, OrchestrationRunner
from agentstream.workflows.validation import check_workflow

__all__ = ["Emitter", "Execution", "ExecutionResult", "WorkflowEngine"]

logger = logging.getLogger(__name__)

E = TypeVar("E", bound=BaseEvent)


class Emitter(Protocol):
    """Where an execution's events go: the run's emitter (``runtime.context.RunContext``),
    which stamps each with the run's next seq, in order, persists and publishes it."""

    @property
    def run_id(self) -> str: ...

    async def emit(self, kind: type[E], /, **fields: Any) -> E:
        """The run's next event, of ``kind``."""
        ...

    async def emit_all(self, *events: Emitted) -> None:
        """The run's next events, each a kind and its fields, that come at once (one write)."""
        ...

    async def forward(self, events: Sequence[BaseEvent], *, block_id: str) -> None:
        """Another run's events (an agent's, in a block) as the run's next, in the block."""
        ...


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """How an execution ended by itself."""

    status: Literal["completed", "error"]
    result: Any = None
    """The response blocks' output, when completed."""
    error: str | None = None
    """What went wrong, when not."""
    failed_block: str | None = None
    """The block whose failure short-circuited the execution, if one did."""


class WorkflowEngine:
    """Runs workflows with the services their blocks need. One per server is enough."""

    def __init__(
        self,
        *,
        agents: AgentRunner | None = None,
        orchestrations: OrchestrationRunner | None = None,
        functions: Mapping[str, Callable[..., Any]] | None = None,
        http: SafeHttpClient | None = None,
    ) -> None:
        """``functions`` are the Python callables function blocks may call, by name; ``http``
        carries the allow-list of internal networks HTTP blocks may reach (default: none)."""
        self.services = Services(
            agents=agents,
            orchestrations=orchestrations,
            functions=dict(functions or {}),
            http=http or SafeHttpClient(),
        )

    @property
    def functions(self) -> Collection[str]:
        return self.services.functions.keys()

    def execution(self, workflow: Workflow, emitter: Emitter) -> Execution:
        """A new execution of ``workflow``, ready to ``run``, its events going to ``emitter``
        (the run's). Raises ``WorkflowInvalid`` if the workflow cannot run here (e.g. it
        calls a function that is not registered)."""
        if issues := check_workflow(workflow, functions=self.functions):
            raise WorkflowInvalid(issues)
        return Execution(workflow, self.services, emitter)


class Execution:
    """One execution of a workflow: ``await run(input)`` once; cancel it by cancelling that."""

    def __init__(self, workflow: Workflow, services: Services, emitter: Emitter) -> None:
        self.workflow = workflow
        self.emitter = emitter
        self._services = services
        self._graph = Graph(workflow)
        self._unsettled = {b: len(edges) for b, edges in self._graph.incoming.items()}
        """Edges into each block not yet settled: it is due when this reaches 0."""
        self._taken: set[str] = set()
        """Blocks some taken edge leads into."""
        self._outputs: dict[str, dict[str, Any] | None] = {}
        self._failure: tuple[str, str] | None = None
        """The block that short-circuited the execution, and its error."""
        self._started = False

    async def run(self, inputs: Any = None) -> ExecutionResult:
        """Execute the workflow on ``inputs`` (the start block's output ``input``): its
        events, from ``RunStarted``, go to the emitter; how it ended is returned, for whoever
        ends the run to say with its terminal event. A cancel stops every running block
        (their open tool calls settle as cancelled) and propagates."""
        if self._started:
            raise RuntimeError("An execution runs once")
        self._started = True
        await self.emitter.emit(RunStarted, workflow_id=self.workflow.id)
        try:
            async with anyio.create_task_group() as group:
                assert self._graph.start is not None  # checked when it was created
                group.start_soon(self._run_block, group, self._graph.start, inputs)
        except Exception:
            logger.exception("Workflow execution %s failed", self.emitter.run_id)
            return ExecutionResult("error", error=self._internal_error())
        if self._failure is not None:
            block_id, error = self._failure
            return ExecutionResult(
                "error", error=f"Block {block_id!r} failed: {error}", failed_block=block_id
            )
        return ExecutionResult("completed", result=self._result())

    def _internal_error(self) -> str:
        return f"Internal error; the server log has the details ({self.emitter.run_id})"

    async def _run_block(self, group: TaskGroup, block_id: str, inputs: Any) -> None:
        block = self._graph.blocks[block_id]
        await self.emitter.emit(BlockStarted, block_id=block_id, block_type=block.type)
        forward = _BlockScope(self.emitter, block_id)
        error = None
        try:
            output = await run_block(
                block,
                self._services,
                self._outputs,
                inputs=inputs,
                events=forward,
                execution_id=self.emitter.run_id,
            )
        except AgentstreamError as exc:
            error = str(exc)
        except Exception:
            logger.exception("Block %s of execution %s failed", block_id, self.emitter.run_id)
            error = self._internal_error()
        finally:
            with anyio.CancelScope(shield=True):
                await forward.cancel_open_tools()

        edges = self._graph.outgoing[block_id]
        if error is None:
            self._outputs[block_id] = output
            await self.emitter.emit_all(
                (BlockOutput, {"block_id": block_id, "output": output}),
                (BlockCompleted, {"block_id": block_id}),
            )
            branch = output.get("branch") if isinstance(block, ConditionBlock) else None
            taken = {e.target for e in edges if e.on == "success" and e.branch == branch}
        elif self._graph.handles_errors(block_id):
            self._outputs[block_id] = {"error": error}
            await self.emitter.emit(BlockError, block_id=block_id, error=error, handled=True)
            taken = {e.target for e in edges if e.on == "error"}
        else:
            await self.emitter.emit(BlockError, block_id=block_id, error=error, handled=False)
            self._failure = self._failure or (block_id, error)
            group.cancel_scope.cancel()
            return
        await self._settle(group, block_id, taken)

    async def _settle(self, group: TaskGroup, block_id: str, taken: set[str]) -> None:
        """Settle the edges out of ``block_id`` (those into ``taken`` blocks were taken);
        start the blocks that became due, skip those no taken edge leads into (and settle
        theirs in turn)."""
        todo = [(block_id, taken)]
        while todo:
            source, taken = todo.pop()
            for edge in self._graph.outgoing[source]:
                target = edge.target
                self._unsettled[target] -= 1
                if target in taken:
                    self._taken.add(target)
                if self._unsettled[target] > 0:
                    continue
                if target in self._taken:
                    group.start_soon(self._run_block, group, target, None)
                else:
                    self._outputs[target] = None
                    await self.emitter.emit(BlockSkipped, block_id=target)
                    todo.append((target, set()))

    def _result(self) -> Any:
        """The output of the response block that ran; of several, an object by block id."""
        results = {
            block_id: output["result"]
            for block_id, output in self._outputs.items()
            if output is not None and isinstance(self._graph.blocks[block_id], ResponseBlock)
        }
        if len(results) > 1:
            return results
        return next(iter(results.values()), None)


_CARRIED = (TextDelta, TextRetracted, Text, ReasoningDelta, Reasoning, ToolCall, ToolResult)
"""What a workflow carries of an agent's work in a block: its text, reasoning and tool
calls. The agent's own lifecycle (steps, its run's start and end, delegations) is not
carried: the block's lifecycle stands for it."""


class _BlockScope:
    """Takes what an agent (or orchestration) block's runner reports and delivers it as the
    execution's: the same events, with the execution's run id and seq and the block's id.

    A tool call id is unique only within the agent's run (a provider may number its calls,
    the offline model does), and two agent blocks are two runs: in the execution it is
    ``<block id>:<call id>``, unique as each block runs once."""

    def __init__(self, emitter: Emitter, block_id: str) -> None:
        self._emitter = emitter
        self._block_id = block_id
        self._open_tools: dict[str, tuple[int, str]] = {}
        """Tool calls started and not settled: (step, tool name) by call id."""

    async def __call__(self, events: Sequence[BaseEvent]) -> None:
        carried = [self._scoped(event) for event in events if _is_carried(event)]
        await self._emitter.forward(carried, block_id=self._block_id)
        for event in carried:  # delivered (a forward that failed opened and settled nothing)
            if isinstance(event, ToolCall):
                self._open_tools[event.call_id] = (event.step, event.tool_name)
            elif isinstance(event, ToolResult):
                self._open_tools.pop(event.call_id, None)

    def _scoped(self, event: BaseEvent) -> BaseEvent:
        if isinstance(event, ToolCall | ToolResult):
            return replace(event, call_id=f"{self._block_id}:{event.call_id}")
        return event

    async def cancel_open_tools(self) -> None:
        """The block stopped with tool calls in flight: settle them as cancelled."""
        await self._emitter.emit_all(
            *cancelled_tool_calls(self._open_tools, block_id=self._block_id)
        )
        self._open_tools.clear()


def _is_carried(event: BaseEvent) -> bool:
    return isinstance(event, _CARRIED) and not (isinstance(event, Text) and not event.text)
