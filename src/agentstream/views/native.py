"""The native agent API surface (spec 002 "Agent Streaming Events").

``frame()`` turns a canonical event into the frame a client receives: a JSON object with
an ``event`` field and the spec's key fields. The pydantic models below describe the same
frames for clients (the SDK parses with them) and for the docs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from agentstream.events import (
    ApprovalRequested,
    BaseEvent,
    ContextHandlerCreated,
    DelegationCompleted,
    DelegationStarted,
    EntityChunk,
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
    Usage,
)

__all__ = ["NativeFrame", "NativeFrameAdapter", "frame", "usage_json"]


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "cost_usd": usage.cost_usd,
    }


def frame(event: BaseEvent) -> dict[str, Any] | None:
    """The native frame for an event, or None if this surface does not show it."""
    match event:
        case TextDelta(delta=delta):
            return {"event": "content_delta", "delta": delta}
        case ReasoningDelta(delta=delta):
            return {"event": "reasoning_delta", "delta": delta}
        case EntityChunk(entity=entity, entity_run_id=entity_run_id, delta=delta):
            return {
                "event": "entity_chunk",
                "entity": entity,
                "entity_run_id": entity_run_id,
                "delta": delta,
            }
        case RunStarted(run_id=run_id, session_id=session_id):
            return {"event": "start", "run_id": run_id, "session_id": session_id}
        case StepStarted(step=step):
            return {"event": "step_started", "step": step}
        case Reasoning(text=text):
            return {"event": "reasoning", "text": text}
        case ReasoningSummary(summary=summary):
            return {"event": "reasoning_summary", "summary": summary}
        case Text(step=1, text=text):
            # spec: "chunk" is the terminal assembled text of a single-turn generation;
            # after tool calls the answer arrives in "complete".
            return {"event": "chunk", "content": text}
        case Text() | TextRetracted():
            return None
        case ToolCall(call_id=call_id, tool_name=name, arguments=arguments):
            return {
                "event": "tool_call",
                "tool_call_id": call_id,
                "tool_name": name,
                "arguments": arguments,
            }
        case ToolResult(call_id=call_id, tool_name=name, result=result, status=status):
            return {
                "event": "tool_result",
                "tool_call_id": call_id,
                "tool_name": name,
                "result": result,
                "status": status,
            }
        case ApprovalRequested(call_id=call_id, tool_name=name, tool_input=tool_input):
            return {
                "event": "approval_requested",
                "tool_call_id": call_id,
                "tool_name": name,
                "tool_input": tool_input,
            }
        case ContextHandlerCreated(call_id=call_id, context_handler_id=handler_id):
            return {
                "event": "context_handler_created",
                "tool_call_id": call_id,
                "context_handler_id": handler_id,
            }
        case DelegationStarted(entity=entity, entity_run_id=entity_run_id, task=task):
            return {
                "event": "delegation_start",
                "entity": entity,
                "entity_run_id": entity_run_id,
                "task": task,
            }
        case DelegationCompleted(
            entity=entity, entity_run_id=entity_run_id, status=status, content=content, error=error
        ):
            return {
                "event": "delegation_complete",
                "entity": entity,
                "entity_run_id": entity_run_id,
                "status": status,
                "content": content,
                "error": error,
            }
        case RunPaused():
            return None  # approval_requested said it; the stream then ends until approved
        case StepCompleted(step=step):
            return {"event": "step_completed", "step": step}
        case RunCompleted(run_id=run_id, content=content, usage=usage):
            return {
                "event": "complete",
                "run_id": run_id,
                "content": content,
                "usage": usage_json(usage),
            }
        case RunFailed(message=message, status=status):
            return {"event": "error", "message": message, "status": status}
    raise TypeError(f"No native frame for {type(event).__name__}")


class _Frame(BaseModel):
    # A newer server may add fields: an older client ignores them.
    model_config = ConfigDict(frozen=True, extra="ignore")


class StartFrame(_Frame):
    event: Literal["start"]
    run_id: str
    session_id: str


class StepStartedFrame(_Frame):
    event: Literal["step_started"]
    step: int


class ContentDeltaFrame(_Frame):
    event: Literal["content_delta"]
    delta: str


class ReasoningDeltaFrame(_Frame):
    event: Literal["reasoning_delta"]
    delta: str


class ReasoningFrame(_Frame):
    event: Literal["reasoning"]
    text: str


class ReasoningSummaryFrame(_Frame):
    event: Literal["reasoning_summary"]
    summary: str


class ChunkFrame(_Frame):
    event: Literal["chunk"]
    content: str


class ToolCallFrame(_Frame):
    event: Literal["tool_call"]
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]


class ToolResultFrame(_Frame):
    event: Literal["tool_result"]
    tool_call_id: str
    tool_name: str
    result: Any
    status: Literal["success", "error", "cancelled"]


class ApprovalRequestedFrame(_Frame):
    event: Literal["approval_requested"]
    tool_call_id: str
    tool_name: str
    tool_input: dict[str, Any]


class ContextHandlerCreatedFrame(_Frame):
    event: Literal["context_handler_created"]
    tool_call_id: str
    context_handler_id: str
    """Its citations: ``GET /api/context-handlers/{context_handler_id}``."""


class DelegationStartFrame(_Frame):
    event: Literal["delegation_start"]
    entity: str
    """The agent delegated to."""
    entity_run_id: str
    """Its own run: ``GET /api/agents/runs/{entity_run_id}`` has all it did."""
    task: str


class EntityChunkFrame(_Frame):
    event: Literal["entity_chunk"]
    entity: str
    entity_run_id: str
    delta: str


class DelegationCompleteFrame(_Frame):
    event: Literal["delegation_complete"]
    entity: str
    entity_run_id: str
    status: Literal["completed", "error", "timeout", "cancelled", "interrupted"]
    content: str | None
    """The entity's answer, when it completed: the result of the coordinator's tool call."""
    error: str | None


class StepCompletedFrame(_Frame):
    event: Literal["step_completed"]
    step: int


class UsageJSON(_Frame):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float | None = None
    """At the model's list prices (see ``GET /api/models``); None when unknown."""


class CompleteFrame(_Frame):
    event: Literal["complete"]
    run_id: str
    content: str
    usage: UsageJSON


class ErrorFrame(_Frame):
    event: Literal["error"]
    message: str
    status: Literal["error", "timeout", "cancelled", "interrupted"]


NativeFrame = Annotated[
    StartFrame
    | StepStartedFrame
    | ContentDeltaFrame
    | ReasoningDeltaFrame
    | ReasoningFrame
    | ReasoningSummaryFrame
    | ChunkFrame
    | ToolCallFrame
    | ToolResultFrame
    | ApprovalRequestedFrame
    | ContextHandlerCreatedFrame
    | DelegationStartFrame
    | EntityChunkFrame
    | DelegationCompleteFrame
    | StepCompletedFrame
    | CompleteFrame
    | ErrorFrame,
    Field(discriminator="event"),
]
"""Any frame of the native agent stream."""

NativeFrameAdapter: TypeAdapter[NativeFrame] = TypeAdapter(NativeFrame)
