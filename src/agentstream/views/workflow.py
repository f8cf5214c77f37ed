"""The native workflow surface (spec 002 "Workflow Streaming").

``frame()`` turns an event of a workflow run into the frame a client receives:
``{"event": NAME, ...}`` with the spec's key fields and the event's ``seq`` (where a client
resumes from: ``GET /api/workflows/executions/{id}/stream?after=<seq>``). What the spec's
table does not name follows the agent surface, scoped to the block, as the spec does for
``content_delta`` / ``reasoning_delta``:

- an agent block's tool calls are ``tool_call`` / ``tool_result`` and its assembled
  reasoning ``reasoning``, each with ``block_id``;
- a block no taken edge led to is ``block_skipped``, so a step indicator can settle it;
- a cancelled (or timed-out, or interrupted) execution ends with ``workflow_error`` and
  ``status: "cancelled"``, so the spec's two terminal frames stay the only ones; a failure
  has ``status: "error"`` and names the failing block in ``block_id``;
- ``chunk_reset`` is not shown: as on the native agent surface, deltas are provisional and
  the settled text comes in ``block_chunk`` and ``block_output``.

The pydantic models below describe the same frames for clients and the docs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, assert_never

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from agentstream.events import (
    ApprovalRequested,
    BlockCompleted,
    BlockError,
    BlockOutput,
    BlockSkipped,
    BlockStarted,
    ContextHandlerCreated,
    DelegationCompleted,
    DelegationStarted,
    EntityChunk,
    EntityText,
    Event,
    Reasoning,
    ReasoningDelta,
    ReasoningSummary,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunStarted,
    StepCompleted,
    StepStarted,
    Text,
    TextDelta,
    TextRetracted,
    ToolCall,
    ToolResult,
)

__all__ = ["TERMINAL_FRAMES", "WorkflowFrame", "WorkflowFrameAdapter", "frame", "frames"]

TERMINAL_FRAMES = frozenset({"workflow_complete", "workflow_error"})
"""Exactly one of these ends every execution's stream."""


def frame(event: Event) -> dict[str, Any] | None:
    """The native frame for an event of a workflow run, or None if this surface does not
    show it."""
    body = _body(event)
    return None if body is None else {"seq": event.seq, **body}


def _body(event: Event) -> dict[str, Any] | None:
    block_id = event.block_id
    match event:
        case TextDelta(delta=delta, separator=separator):  # as the agent's own stream
            return {"event": "content_delta", "block_id": block_id, "delta": separator + delta}
        case ReasoningDelta(delta=delta):
            return {"event": "reasoning_delta", "block_id": block_id, "delta": delta}
        case Text(text=text):
            return {"event": "block_chunk", "block_id": block_id, "delta": text}
        case RunStarted(run_id=execution_id, workflow_id=workflow_id):
            return {
                "event": "workflow_start",
                "execution_id": execution_id,
                "workflow_id": workflow_id,
            }
        case BlockStarted(block_type=block_type):
            return {"event": "block_started", "block_id": block_id, "block_type": block_type}
        case Reasoning(text=text):
            return {"event": "reasoning", "block_id": block_id, "text": text}
        case ToolCall(call_id=call_id, tool_name=name, arguments=arguments):
            return {
                "event": "tool_call",
                "block_id": block_id,
                "tool_call_id": call_id,
                "tool_name": name,
                "arguments": arguments,
            }
        case ToolResult(call_id=call_id, tool_name=name, result=result, status=status):
            return {
                "event": "tool_result",
                "block_id": block_id,
                "tool_call_id": call_id,
                "tool_name": name,
                "result": result,
                "status": status,
            }
        case BlockOutput(output=output):
            return {"event": "block_output", "block_id": block_id, "output": output}
        case BlockCompleted():
            return {"event": "block_completed", "block_id": block_id}
        case BlockError(error=error, handled=handled):
            return {
                "event": "block_error",
                "block_id": block_id,
                "error": error,
                "handled": handled,
            }
        case BlockSkipped():
            return {"event": "block_skipped", "block_id": block_id}
        case RunCompleted(run_id=execution_id, result=result):
            return {"event": "workflow_complete", "execution_id": execution_id, "result": result}
        case RunFailed(run_id=execution_id, status=status, message=message):
            return {
                "event": "workflow_error",
                "execution_id": execution_id,
                "error": message,
                "status": "error" if status == "error" else "cancelled",
                "block_id": event.failed_block,
            }
        case (
            TextRetracted()
            | StepStarted()
            | StepCompleted()
            | ReasoningSummary()
            | ApprovalRequested()
            | ContextHandlerCreated()
            | RunPaused()
            | DelegationStarted()
            | EntityChunk()
            | EntityText()
            | DelegationCompleted()
        ):
            return None  # a reset retracts nothing here: deltas are provisional anyway
        case _:
            assert_never(event)


def frames(event: Event) -> tuple[dict[str, Any], ...]:
    """``frame`` as a render function for the SSE encoder: none or one frame."""
    shown = frame(event)
    return () if shown is None else (shown,)


class _Frame(BaseModel):
    # A newer server may add fields: an older client ignores them.
    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True)

    seq: int
    """The event's position in its execution: resume after it with
    ``GET /api/workflows/executions/{execution_id}/stream?after=<seq>``."""


class WorkflowStartFrame(_Frame):
    event: Literal["workflow_start"]
    execution_id: str
    """``GET /api/workflows/executions/{execution_id}`` has it afterwards."""
    workflow_id: str


class BlockStartedFrame(_Frame):
    event: Literal["block_started"]
    block_id: str
    block_type: str


class BlockChunkFrame(_Frame):
    event: Literal["block_chunk"]
    block_id: str
    delta: str
    """Settled output text of a streaming block (never retracted)."""


class BlockContentDeltaFrame(_Frame):
    event: Literal["content_delta"]
    block_id: str
    delta: str


class BlockReasoningDeltaFrame(_Frame):
    event: Literal["reasoning_delta"]
    block_id: str
    delta: str


class BlockReasoningFrame(_Frame):
    event: Literal["reasoning"]
    block_id: str
    text: str


class BlockToolCallFrame(_Frame):
    event: Literal["tool_call"]
    block_id: str
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]


class BlockToolResultFrame(_Frame):
    event: Literal["tool_result"]
    block_id: str
    tool_call_id: str
    tool_name: str
    result: Any
    status: Literal["success", "error", "cancelled"]


class BlockOutputFrame(_Frame):
    event: Literal["block_output"]
    block_id: str
    output: dict[str, Any]


class BlockCompletedFrame(_Frame):
    event: Literal["block_completed"]
    block_id: str


class BlockErrorFrame(_Frame):
    event: Literal["block_error"]
    block_id: str
    error: str
    handled: bool
    """True when an error edge leads on, so the execution continues."""


class BlockSkippedFrame(_Frame):
    event: Literal["block_skipped"]
    block_id: str


class WorkflowCompleteFrame(_Frame):
    event: Literal["workflow_complete"]
    execution_id: str
    result: Any


class WorkflowErrorFrame(_Frame):
    event: Literal["workflow_error"]
    execution_id: str
    error: str
    status: Literal["error", "cancelled"]
    block_id: str | None
    """The block whose failure short-circuited the execution, if one did."""


WorkflowFrame = Annotated[
    WorkflowStartFrame
    | BlockStartedFrame
    | BlockChunkFrame
    | BlockContentDeltaFrame
    | BlockReasoningDeltaFrame
    | BlockReasoningFrame
    | BlockToolCallFrame
    | BlockToolResultFrame
    | BlockOutputFrame
    | BlockCompletedFrame
    | BlockErrorFrame
    | BlockSkippedFrame
    | WorkflowCompleteFrame
    | WorkflowErrorFrame,
    Field(discriminator="event"),
]
"""Any frame of the native workflow stream."""

WorkflowFrameAdapter: TypeAdapter[WorkflowFrame] = TypeAdapter(WorkflowFrame)
