"""The workflow event vocabulary: what one execution of a DAG does, in one seq-numbered stream.

The engine emits only these. Block lifecycle and outputs are persisted; token deltas are
forwarded-only (``persisted = False``), as in the agent vocabulary: replay shows each block's
assembled output, reasoning and tool calls, and live viewers also see the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter

from agentstream.events import ToolStatus

__all__ = [
    "BlockChunk",
    "BlockChunkReset",
    "BlockCompleted",
    "BlockContentDelta",
    "BlockError",
    "BlockOutput",
    "BlockReasoning",
    "BlockReasoningDelta",
    "BlockSkipped",
    "BlockStarted",
    "BlockTool",
    "Stopped",
    "WorkflowCancelled",
    "WorkflowComplete",
    "WorkflowError",
    "WorkflowEvent",
    "WorkflowEventAdapter",
    "WorkflowEventBase",
    "WorkflowStart",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowEventBase:
    """Fields every workflow event carries."""

    persisted: ClassVar[bool] = True

    execution_id: str
    """The execution this event belongs to."""
    seq: int
    """Position in the execution, from 1, strictly increasing: what subscribers resume from."""
    ts: float
    """Unix time at emission."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _BlockScoped(WorkflowEventBase):
    block_id: str
    """The block this event is about."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowStart(WorkflowEventBase):
    """The execution has begun. Always the first event."""

    type: Literal["workflow_start"] = "workflow_start"
    workflow_id: str
    """The workflow being executed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockStarted(_BlockScoped):
    """The engine is about to execute a block: all its predecessors are done."""

    type: Literal["block_started"] = "block_started"
    block_type: str
    """The block's type, e.g. ``agent`` or ``condition``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockContentDelta(_BlockScoped):
    """A piece of an agent's answer text, forwarded live; provisional until the turn settles."""

    persisted: ClassVar[bool] = False
    type: Literal["content_delta"] = "content_delta"
    delta: str
    """The new text."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockChunkReset(_BlockScoped):
    """The text streamed by this block since its last settled chunk was preamble: discard it."""

    persisted: ClassVar[bool] = False
    type: Literal["chunk_reset"] = "chunk_reset"


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockChunk(_BlockScoped):
    """A streaming block settled a piece of its output text (an agent's final-turn answer):
    the "settled text only" cadence, never retracted."""

    persisted: ClassVar[bool] = False
    type: Literal["block_chunk"] = "block_chunk"
    delta: str
    """The settled text."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockReasoningDelta(_BlockScoped):
    """A piece of an agent's reasoning, forwarded live."""

    persisted: ClassVar[bool] = False
    type: Literal["reasoning_delta"] = "reasoning_delta"
    delta: str
    """The new reasoning text."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockReasoning(_BlockScoped):
    """A segment of an agent's reasoning, assembled: what replay shows of its thinking."""

    type: Literal["block_reasoning"] = "block_reasoning"
    text: str
    """The whole segment."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockTool(_BlockScoped):
    """A tool call of an agent block started or settled. Arguments and results are for
    authenticated surfaces; public ones keep only the lifecycle."""

    type: Literal["block_tool"] = "block_tool"
    phase: Literal["start", "end"]
    """``start`` when the model called the tool, ``end`` when the call settled."""
    call_id: str
    """Pairs the start of a call with its end."""
    name: str
    """The tool called."""
    status: ToolStatus | None = None
    """How the call settled; only at ``end``."""
    arguments: dict[str, Any] | None = None
    """The arguments; only at ``start``."""
    result: Any = None
    """The result or error message; only at ``end``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockOutput(_BlockScoped):
    """A block finished with this output, which downstream blocks may reference."""

    type: Literal["block_output"] = "block_output"
    output: dict[str, Any]
    """The block's output fields, e.g. ``{"content": ...}`` for an agent."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCompleted(_BlockScoped):
    """A block has fully finished, after its output."""

    type: Literal["block_completed"] = "block_completed"


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockError(_BlockScoped):
    """A block failed. The workflow short-circuits unless the block has error edges, whose
    handlers run next with ``<block.error>``."""

    type: Literal["block_error"] = "block_error"
    error: str
    """What went wrong, for a person."""
    handled: bool
    """True when error edges lead on from here, so the execution continues."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockSkipped(_BlockScoped):
    """The block will not run: every edge into it was not taken (a condition's other branch,
    a success edge of a failed block, or a skipped predecessor)."""

    type: Literal["block_skipped"] = "block_skipped"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowComplete(WorkflowEventBase):
    """The execution finished. A terminal event: exactly one ends each execution."""

    type: Literal["workflow_complete"] = "workflow_complete"
    result: Any
    """The output of the response block that ran (several: an object by block id; none:
    null)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowError(WorkflowEventBase):
    """The execution failed at the top level. A terminal event."""

    type: Literal["workflow_error"] = "workflow_error"
    error: str
    """What went wrong, for a person."""
    block_id: str | None = None
    """The failing block that short-circuited the execution, if one did."""


Stopped = Literal["cancelled", "timeout", "interrupted"]
"""Why an execution ended before its blocks did."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowCancelled(WorkflowEventBase):
    """The execution was stopped before it ended; every running block was stopped. A
    terminal event."""

    type: Literal["workflow_cancelled"] = "workflow_cancelled"
    reason: str
    """Why, for a person (e.g. "Client cancelled request")."""
    status: Stopped = "cancelled"
    """Who stopped it: a cancel, the execution's timeout, or the server stopping."""


WorkflowEvent = Annotated[
    WorkflowStart
    | BlockStarted
    | BlockContentDelta
    | BlockChunkReset
    | BlockChunk
    | BlockReasoningDelta
    | BlockReasoning
    | BlockTool
    | BlockOutput
    | BlockCompleted
    | BlockError
    | BlockSkipped
    | WorkflowComplete
    | WorkflowError
    | WorkflowCancelled,
    Field(discriminator="type"),
]
"""Any workflow event."""

WorkflowEventAdapter: TypeAdapter[WorkflowEvent] = TypeAdapter(WorkflowEvent)
"""Validates and serialises workflow events, e.g. to and from the store's JSON."""
