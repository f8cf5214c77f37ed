"""The native agent API surface (spec 002 "Agent Streaming Events").

``frame()`` turns a canonical event into the frame a client receives: a JSON object with
an ``event`` field, the spec's key fields, and the event's ``seq`` (where a client resumes
from: ``GET /api/agents/runs/{run_id}/stream?after=<seq>``). The pydantic models below
describe the same frames for clients (the SDK parses with them) and for the docs.

What a native client assembles by joining every ``content_delta`` is each step's text in
turn, a later step's set apart by a blank line (its first delta starts with ``"\n\n"``).
The record keeps the same per step: a step that went on to call tools has a ``preamble``
frame, the last step's text is ``complete.content`` (and, in a run of one step, ``chunk``).
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


def frame(event: Event, *, live: bool = False) -> dict[str, Any] | None:
    """The native frame for an event, or None if this surface does not show it. ``live``:
    the event comes from the live log, with its deltas, not from the store (a replay)."""
    body = _body(event, live)
    return None if body is None else {"seq": event.seq, **body}


def _body(event: Event, live: bool) -> dict[str, Any] | None:
    match event:
        case TextDelta(delta=delta, separator=separator):
            return {"event": "content_delta", "delta": separator + delta}
        case ReasoningDelta(delta=delta):
            return {"event": "reasoning_delta", "delta": delta}
        case EntityChunk(entity=entity, entity_run_id=entity_run_id, delta=delta):
            return _entity_chunk(entity, entity_run_id, delta)
        case EntityText(entity=entity, entity_run_id=entity_run_id, text=text):
            # Live, its deltas were the entity_chunk frames; a replay has only this one.
            return None if live else _entity_chunk(entity, entity_run_id, text)
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
        case TextRetracted(step=step, text=text):
            return {"event": "preamble", "step": step, "text": text}
        case Text():
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
        case BlockStarted() | BlockOutput() | BlockCompleted() | BlockError() | BlockSkipped():
            return None  # an agent run has no blocks
        case _:
            assert_never(event)


def _entity_chunk(entity: str, entity_run_id: str, delta: str) -> dict[str, Any]:
    return {
        "event": "entity_chunk",
        "entity": entity,
        "entity_run_id": entity_run_id,
        "delta": delta,
    }


class _Model(BaseModel):
    # A newer server may add fields: an older client ignores them.
    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True)


class _Frame(_Model):
    seq: int
    """The event's position in its run: resume after it with
    ``GET /api/agents/runs/{run_id}/stream?after=<seq>`` (``Client.iter_resume``)."""


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


class PreambleFrame(_Frame):
    event: Literal["preamble"]
    step: int
    text: str
    """What the step streamed before it called tools (its ``content_delta`` frames, less
    the separator): not part of the answer."""


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


class UsageJSON(_Model):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float | None = None
    """At the model's list prices (see ``GET /api/models``); None when unknown."""


class CompleteFrame(_Frame):
    event: Literal["complete"]
    run_id: str
    content: str
    """The final answer: the last step's text (never a preamble)."""
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
    | PreambleFrame
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
