"""The DAG executor: runs each block once all edges into it are settled, independent branches
concurrently, and reports everything as workflow events through a sink.

An edge is *taken* when its source succeeded (for a condition, through the branch it
chose), or, for an error edge, when its source failed. A block runs when every edge into it
is settled and at least one was taken; when none was, it is skipped, which settles its own
edges as not taken. A failure with no error edge leading on short-circuits the execution:
the other blocks are cancelled and the execution ends with ``workflow_error``.

The engine does no I/O of its own besides the blocks' work and the sink.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anyio
from anyio.abc import TaskGroup

from agentstream.errors import AgentstreamError
from agentstream.events import (
    BaseEvent,
    Reasoning,
    ReasoningDelta,
    Text,
    TextDelta,
    TextRetracted,
    ToolCall,
    ToolResult,
)
from agentstream.workflows.blocks import Services, run_block
from agentstream.workflows.definition import ConditionBlock, ResponseBlock, Workflow
from agentstream.workflows.errors import WorkflowInvalid
from agentstream.workflows.events import (
    BlockChunk,
    BlockChunkReset,
    BlockCompleted,
    BlockContentDelta,
    BlockError,
    BlockOutput,
    BlockReasoning,
    BlockReasoningDelta,
    BlockSkipped,
    BlockStarted,
    BlockTool,
    Stopped,
    WorkflowCancelled,
    WorkflowComplete,
    WorkflowError,
    WorkflowEventBase,
    WorkflowStart,
)
from agentstream.workflows.graph import Graph
from agentstream.workflows.http_block import SafeHttpClient
from agentstream.workflows.runners import AgentRunner, OrchestrationRunner
from agentstream.workflows.validation import check_workflow

__all__ = ["EventSink", "Execution", "ExecutionResult", "WorkflowEngine"]

logger = logging.getLogger(__name__)

W = TypeVar("W", bound=WorkflowEventBase)

EventSink = Callable[[WorkflowEventBase], Awaitable[None]]
"""Receives an execution's events one at a time, in seq order (e.g. persists the persisted
ones, then publishes to the run log). It should shield what a cancel must not tear."""


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """How an execution ended, as its terminal event says."""

    status: Literal["completed", "error", "cancelled"]
    result: Any = None
    """The ``workflow_complete`` result."""
    error: str | None = None
    """The ``workflow_error`` error, or the ``workflow_cancelled`` reason."""


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

    def execution(
        self, workflow: Workflow, *, sink: EventSink, execution_id: str | None = None
    ) -> Execution:
        """A new execution of ``workflow``, ready to ``run``. Raises ``WorkflowInvalid`` if the
        workflow cannot run here (e.g. it calls a function that is not registered)."""
        if issues := check_workflow(workflow, functions=self.functions):
            raise WorkflowInvalid(issues)
        return Execution(
            workflow,
            self.services,
            sink=sink,
            execution_id=execution_id or f"wfx_{uuid.uuid4().hex}",
        )


class Execution:
    """One execution of a workflow: ``await run(input)`` once; ``cancel()`` from anywhere."""

    def __init__(
        self, workflow: Workflow, services: Services, *, sink: EventSink, execution_id: str
    ) -> None:
        self.execution_id = execution_id
        self.workflow = workflow
        self._services = services
        self._sink = sink
        self._graph = Graph(workflow)
        self._unsettled = {b: len(edges) for b, edges in self._graph.incoming.items()}
        """Edges into each block not yet settled: it is due when this reaches 0."""
        self._taken: set[str] = set()
        """Blocks some taken edge leads into."""
        self._outputs: dict[str, dict[str, Any] | None] = {}
        self._failure: tuple[str, str] | None = None
        """The block that short-circuited the execution, and its error."""
        self._scope = anyio.CancelScope()
        self._stop: tuple[str, Stopped] | None = None
        """Why and by whom the execution was stopped: the first ``cancel()`` wins."""
        self._seq = 0
        self._lock = anyio.Lock(fast_acquire=True)
        self._started = False

    def cancel(self, reason: str = "Execution cancelled", status: Stopped = "cancelled") -> None:
        """Stop every running block; the execution ends with ``workflow_cancelled`` carrying
        ``reason`` and ``status`` (a cancel, a timeout or the server stopping)."""
        self._stop = self._stop or (reason, status)
        self._scope.cancel()

    async def run(self, inputs: Any = None) -> ExecutionResult:
        """Execute the workflow on ``inputs`` (the start block's output ``input``).

        Exactly one terminal event ends the events. A cancel through ``cancel()`` returns a
        cancelled result; a cancel of the caller's scope emits the same event and propagates.
        """
        if self._started:
            raise RuntimeError("An execution runs once")
        self._started = True
        try:
            await self._emit(WorkflowStart, workflow_id=self.workflow.id)
            with self._scope:
                async with anyio.create_task_group() as group:
                    assert self._graph.start is not None  # checked when it was created
                    group.start_soon(self._run_block, group, self._graph.start, inputs)
            if self._scope.cancelled_caught:
                return await self._cancelled()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._cancelled()
            raise
        except Exception:
            logger.exception("Workflow execution %s failed", self.execution_id)
            message = f"Internal error; the server log has the details ({self.execution_id})"
            await self._emit(WorkflowError, error=message)
            return ExecutionResult("error", error=message)
        if self._failure is not None:
            block_id, error = self._failure
            message = f"Block {block_id!r} failed: {error}"
            await self._emit(WorkflowError, error=message, block_id=block_id)
            return ExecutionResult("error", error=message)
        result = self._result()
        await self._emit(WorkflowComplete, result=result)
        return ExecutionResult("completed", result=result)

    async def _cancelled(self) -> ExecutionResult:
        reason, status = self._stop or ("Execution cancelled", "cancelled")
        await self._emit(WorkflowCancelled, reason=reason, status=status)
        return ExecutionResult("cancelled", error=reason)

    async def _run_block(self, group: TaskGroup, block_id: str, inputs: Any) -> None:
        block = self._graph.blocks[block_id]
        await self._emit(BlockStarted, block_id=block_id, block_type=block.type)
        forward = _Forwarder(self._emit, block_id)
        error = None
        try:
            output = await run_block(
                block, self._services, self._outputs, inputs=inputs, events=forward
            )
        except AgentstreamError as exc:
            error = str(exc)
        except Exception:
            logger.exception("Block %s of execution %s failed", block_id, self.execution_id)
            error = f"Internal error; the server log has the details ({self.execution_id})"
        finally:
            with anyio.CancelScope(shield=True):
                await forward.cancel_open_tools()

        edges = self._graph.outgoing[block_id]
        if error is None:
            self._outputs[block_id] = output
            await self._emit(BlockOutput, block_id=block_id, output=output)
            await self._emit(BlockCompleted, block_id=block_id)
            branch = output.get("branch") if isinstance(block, ConditionBlock) else None
            taken = {e.target for e in edges if e.on == "success" and e.branch == branch}
        elif self._graph.handles_errors(block_id):
            self._outputs[block_id] = {"error": error}
            await self._emit(BlockError, block_id=block_id, error=error, handled=True)
            taken = {e.target for e in edges if e.on == "error"}
        else:
            await self._emit(BlockError, block_id=block_id, error=error, handled=False)
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
                    await self._emit(BlockSkipped, block_id=target)
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

    async def _emit(self, kind: type[W], /, **fields: Any) -> None:
        """Stamp the next event and deliver it. Holding the lock from stamping to delivery
        keeps delivery in seq order even when the sink awaits and branches race."""
        async with self._lock:
            self._seq += 1
            event = kind(execution_id=self.execution_id, seq=self._seq, ts=time.time(), **fields)
            await self._sink(event)


class _Forwarder:
    """Re-scopes what an agent (or orchestration) block's runner reports to the block. Agent
    lifecycle events have no workflow counterpart; the block's own events stand for them.

    A tool call id is unique only within the agent's run (a provider may number its calls,
    the offline model does), and two agent blocks are two runs: in the execution it is
    ``<block id>:<call id>``, unique as each block runs once."""

    def __init__(self, emit: Callable[..., Awaitable[None]], block_id: str) -> None:
        self._emit = emit
        self._block_id = block_id
        self._open_tools: dict[str, str] = {}
        """Tool calls started and not settled: name by call id."""

    async def __call__(self, event: BaseEvent) -> None:
        emit, block_id = self._emit, self._block_id
        match event:
            case TextDelta(delta=delta):
                await emit(BlockContentDelta, block_id=block_id, delta=delta)
            case TextRetracted():
                await emit(BlockChunkReset, block_id=block_id)
            case Text(text=text) if text:
                await emit(BlockChunk, block_id=block_id, delta=text)
            case ReasoningDelta(delta=delta):
                await emit(BlockReasoningDelta, block_id=block_id, delta=delta)
            case Reasoning(text=text):
                await emit(BlockReasoning, block_id=block_id, text=text)
            case ToolCall(call_id=run_call_id, tool_name=name, arguments=arguments):
                call_id = f"{block_id}:{run_call_id}"
                self._open_tools[call_id] = name
                await emit(
                    BlockTool,
                    block_id=block_id,
                    phase="start",
                    call_id=call_id,
                    name=name,
                    arguments=arguments,
                )
            case ToolResult(call_id=run_call_id, tool_name=name, status=status, result=result):
                call_id = f"{block_id}:{run_call_id}"
                self._open_tools.pop(call_id, None)
                await emit(
                    BlockTool,
                    block_id=block_id,
                    phase="end",
                    call_id=call_id,
                    name=name,
                    status=status,
                    result=result,
                )

    async def cancel_open_tools(self) -> None:
        """The block stopped with tool calls in flight: settle them as cancelled, so no
        viewer's tool stays spinning."""
        for call_id, name in self._open_tools.items():
            await self._emit(
                BlockTool,
                block_id=self._block_id,
                phase="end",
                call_id=call_id,
                name=name,
                status="cancelled",
            )
        self._open_tools.clear()
