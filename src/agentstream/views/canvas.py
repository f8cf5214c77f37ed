"""The canvas execution-events surface (spec 000 "Canvas (draft Run)"): what the builder's
run view shows of one workflow execution.

The canvas is always opted in: no header, no deployment toggles. Every frame is
``{"type", "timestamp", "executionId", "workflowId", "eventId", "data"}`` where ``eventId``
is the seq of the workflow event it came from; one event gives at most one frame, so
``eventId`` is unique and a client can resume after it.

Rules:

- Answer text goes out live as ``stream:chunk``; ``stream:chunk_reset`` discards a block's
  provisional text; ``stream:done`` marks the end of a block's live stream (only for a block
  that streamed). Settled text (``block_chunk`` on the native surface) is not shown: the live deltas
  already were.
- Thinking goes out live as ``stream:thinking``, capped per block at ``THINKING_CAP``.
  Executions read back from the store have no deltas, only assembled segments: those are
  shown instead.
- ``stream:tool`` carries name and lifecycle only, never arguments or results.
- ``stream:chunk``, ``stream:chunk_reset``, ``stream:thinking``, ``stream:tool`` (and the
  ``stream:done`` that closes them) are live-only: a viewer that (re)connects is not sent
  them for what happened before it did (``CanvasView.replayed``).
- A block's output arrives once, in ``block:completed`` (the frame of ``block_completed``;
  ``block_output`` only records it). Skipped blocks get ``block:skipped``.
- PII redaction on a block's output disables live forwarding for that block: no
  ``stream:chunk`` / ``stream:chunk_reset`` / ``stream:thinking`` / ``stream:tool`` /
  ``stream:done`` for it;
  its output and error arrive redacted, and so does the execution's result once a redacted
  block has completed (a response block may quote it).

The pydantic models at the end describe the frames ``CanvasView`` builds, for clients and
the docs (``CanvasFrameAdapter``; the OpenAPI document's schema of the canvas endpoints).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
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
from agentstream.redaction import redact as default_redact
from agentstream.views.chat import THINKING_CAP

__all__ = [
    "LIVE_ONLY",
    "CanvasFrame",
    "CanvasFrameAdapter",
    "CanvasPolicy",
    "CanvasView",
    "redact_value",
]

Frame = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class CanvasPolicy:
    """Which blocks have PII redaction on their output, and the redaction to apply."""

    redacted_blocks: Collection[str] = frozenset()
    """Block ids whose output is redacted: nothing of them is forwarded live."""
    redact: Callable[[str], str] = default_redact


def redact_value(value: Any, redact: Callable[[str], str]) -> Any:
    """``value`` with every string in it (keys excepted) redacted."""
    match value:
        case str():
            return redact(value)
        case dict():
            return {k: redact_value(v, redact) for k, v in value.items()}
        case list() | tuple():
            return [redact_value(v, redact) for v in value]
        case _:
            return value


LIVE_ONLY = frozenset(
    {"stream:chunk", "stream:chunk_reset", "stream:thinking", "stream:tool", "stream:done"}
)
"""Frames that go to those watching as they happen, and are not buffered for a reconnect's
replay (spec 000, "Reconnect", names the first four; ``stream:done`` only closes them)."""


@dataclass(slots=True)
class _Block:
    streamed: bool = False
    """Live text or thinking went out: the block's stream needs a ``stream:done``."""
    text_since_reset: bool = False
    """Live text went out since the last reset: a ``chunk_reset`` has something to discard."""
    thinking_sent: int = 0
    segments: int = 0
    """Reasoning segments settled so far; a new one starts on a new paragraph."""
    segment_live: bool = False
    """The current segment went out as deltas, so its assembled form is not shown again."""
    output: dict[str, Any] | None = None


class CanvasView:
    """Translates one execution's workflow events into canvas frames, in order."""

    def __init__(self, *, workflow_id: str, policy: CanvasPolicy | None = None) -> None:
        self.workflow_id = workflow_id
        self.policy = policy or CanvasPolicy()
        self._blocks: dict[str, _Block] = {}
        self._redacted_ran = False
        """A block whose output is redacted has completed: the result may quote it."""

    def frames(self, event: Event) -> list[Frame]:
        """The frames for ``event``: none or one."""
        data = self._data(event)
        if data is None:
            return []
        kind, payload = data
        if kind in LIVE_ONLY and self._redacted(event.block_id or ""):
            return []  # redaction disables a block's live forwarding, whatever the frame
        return [
            {
                "type": kind,
                "timestamp": _iso(event.ts),
                "executionId": event.run_id,
                "workflowId": self.workflow_id,
                "eventId": event.seq,
                "data": payload,
            }
        ]

    def replayed(self, event: Event) -> list[Frame]:
        """``frames`` for an event that happened before its viewer connected: without the
        live-only ones (``LIVE_ONLY``)."""
        return [frame for frame in self.frames(event) if frame["type"] not in LIVE_ONLY]

    def _data(self, event: Event) -> tuple[str, Frame] | None:
        policy = self.policy
        block_id = event.block_id or ""
        match event:
            case RunStarted():
                return "execution:started", {}
            case BlockStarted(block_type=block_type):
                self._block(block_id)
                return "block:started", {"blockId": block_id, "blockType": block_type}
            case TextDelta(delta=delta):
                if not delta:
                    return None
                block = self._block(block_id)
                block.streamed = block.text_since_reset = True
                return "stream:chunk", {"blockId": block_id, "chunk": delta}
            case TextRetracted():
                block = self._block(block_id)
                if not block.text_since_reset:
                    return None
                block.text_since_reset = False
                return "stream:chunk_reset", {"blockId": block_id}
            case ReasoningDelta(delta=delta):
                block = self._block(block_id)
                if not block.segment_live:
                    block.segment_live = True
                    if block.segments:
                        delta = "\n\n" + delta
                return self._thinking(block_id, block, delta)
            case Reasoning(text=text):
                block = self._block(block_id)
                live, block.segment_live = block.segment_live, False
                block.segments += 1
                if live:
                    return None
                if block.segments > 1:
                    text = "\n\n" + text
                return self._thinking(block_id, block, text)
            case ToolCall(call_id=call_id, tool_name=name):
                return "stream:tool", {
                    "blockId": block_id,
                    "phase": "start",
                    "id": call_id,
                    "name": name,
                }
            case ToolResult(call_id=call_id, tool_name=name, status=status):
                return "stream:tool", {
                    "blockId": block_id,
                    "phase": "end",
                    "id": call_id,
                    "name": name,
                    "status": status,
                }
            case BlockOutput(output=output):
                block = self._block(block_id)
                block.output = output
                if not block.streamed:
                    return None
                block.streamed = False
                return "stream:done", {"blockId": block_id}
            case BlockCompleted():
                completed: Frame = {"blockId": block_id}
                recorded = self._block(block_id).output
                if recorded is not None:
                    if self._redacted(block_id):
                        self._redacted_ran = True
                        recorded = redact_value(recorded, policy.redact)
                    completed["output"] = recorded
                return "block:completed", completed
            case BlockError(error=error, handled=handled):
                if self._redacted(block_id):
                    error = policy.redact(error)
                return "block:error", {"blockId": block_id, "error": error, "handled": handled}
            case BlockSkipped():
                return "block:skipped", {"blockId": block_id}
            case RunCompleted(result=result):
                if self._redacted_ran:
                    result = redact_value(result, policy.redact)
                return "execution:completed", {"result": result}
            case RunFailed(status="cancelled", message=message):
                return "execution:cancelled", {"reason": message}
            case RunFailed(message=message, failed_block=failed_block):
                # A timeout or the server stopping is not somebody's cancel: spec 000 keeps
                # cancel distinct from the execution timeout.
                failed: Frame = {"error": message}
                if failed_block is not None:
                    failed["blockId"] = failed_block
                    if self._redacted(failed_block):
                        failed["error"] = policy.redact(message)
                return "execution:error", failed
            case (
                Text()  # settled text: the live deltas already went out
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
                return None
            case _:
                assert_never(event)

    def _block(self, block_id: str) -> _Block:
        return self._blocks.setdefault(block_id, _Block())

    def _redacted(self, block_id: str) -> bool:
        return block_id in self.policy.redacted_blocks

    def _thinking(self, block_id: str, block: _Block, text: str) -> tuple[str, Frame] | None:
        room = THINKING_CAP - block.thinking_sent
        if room <= 0 or not text:
            return None
        text = text[:room]
        block.thinking_sent += len(text)
        block.streamed = True
        return "stream:thinking", {"blockId": block_id, "text": text}


def _iso(ts: float) -> str:
    """A Unix time after 1970 in ISO 8601, UTC, with milliseconds: what
    ``datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")`` writes (its
    rounding to microseconds, then milliseconds cut), with ``Z``. The second's text is made
    once: made whole, a frame's time took half of a token's frame."""
    second = math.floor(ts)
    micro = round((ts - second) * 1e6)  # as datetime rounds: half to even
    if micro == 1_000_000:
        second, micro = second + 1, 0
    return f"{_second(second)}.{micro // 1000:03d}Z"


@functools.lru_cache(maxsize=8)
def _second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).isoformat()[:19]


class _Model(BaseModel):
    # A newer server may add fields: an older client ignores them.
    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True)


class _Frame(_Model):
    timestamp: str
    """When the event happened, ISO 8601 in UTC with milliseconds."""
    executionId: str
    workflowId: str
    eventId: int
    """The workflow event's seq, unique in the execution: resume after it with
    ``Last-Event-ID`` or ``?after=``."""


class CanvasNoData(_Model):
    pass


class CanvasBlock(_Model):
    blockId: str


class CanvasBlockStarted(CanvasBlock):
    blockType: str


class CanvasChunk(CanvasBlock):
    chunk: str


class CanvasThinking(CanvasBlock):
    text: str


class CanvasTool(CanvasBlock):
    """Name and lifecycle only, never arguments or results."""

    phase: Literal["start", "end"]
    id: str
    name: str
    status: Literal["success", "error", "cancelled"] | None = None
    """At ``end`` only."""


class CanvasBlockCompleted(CanvasBlock):
    output: dict[str, Any] | None = None
    """The block's output (redacted where the block redacts); absent if it recorded none."""


class CanvasBlockError(CanvasBlock):
    error: str
    handled: bool
    """An error edge leads on: the execution continues."""


class CanvasResult(_Model):
    result: Any


class CanvasCancelled(_Model):
    reason: str


class CanvasFailed(_Model):
    error: str
    blockId: str | None = None
    """The block whose failure ended the execution, if one did."""


class ExecutionStartedFrame(_Frame):
    type: Literal["execution:started"]
    data: CanvasNoData


class BlockStartedCanvasFrame(_Frame):
    type: Literal["block:started"]
    data: CanvasBlockStarted


class StreamChunkFrame(_Frame):
    type: Literal["stream:chunk"]
    data: CanvasChunk


class StreamChunkResetFrame(_Frame):
    """Discard the block's provisional text."""

    type: Literal["stream:chunk_reset"]
    data: CanvasBlock


class StreamThinkingFrame(_Frame):
    type: Literal["stream:thinking"]
    data: CanvasThinking


class StreamToolFrame(_Frame):
    type: Literal["stream:tool"]
    data: CanvasTool


class StreamDoneFrame(_Frame):
    """The end of a block's live stream (a block that streamed)."""

    type: Literal["stream:done"]
    data: CanvasBlock


class BlockCompletedCanvasFrame(_Frame):
    type: Literal["block:completed"]
    data: CanvasBlockCompleted


class BlockErrorCanvasFrame(_Frame):
    type: Literal["block:error"]
    data: CanvasBlockError


class BlockSkippedCanvasFrame(_Frame):
    type: Literal["block:skipped"]
    data: CanvasBlock


class ExecutionCompletedFrame(_Frame):
    type: Literal["execution:completed"]
    data: CanvasResult


class ExecutionCancelledFrame(_Frame):
    type: Literal["execution:cancelled"]
    data: CanvasCancelled


class ExecutionErrorFrame(_Frame):
    """A failure, a timeout, or the server stopping (a cancel is ``execution:cancelled``)."""

    type: Literal["execution:error"]
    data: CanvasFailed


CanvasFrame = Annotated[
    ExecutionStartedFrame
    | BlockStartedCanvasFrame
    | StreamChunkFrame
    | StreamChunkResetFrame
    | StreamThinkingFrame
    | StreamToolFrame
    | StreamDoneFrame
    | BlockCompletedCanvasFrame
    | BlockErrorCanvasFrame
    | BlockSkippedCanvasFrame
    | ExecutionCompletedFrame
    | ExecutionCancelledFrame
    | ExecutionErrorFrame,
    Field(discriminator="type"),
]
"""Any frame of the canvas execution-events stream."""

CanvasFrameAdapter: TypeAdapter[CanvasFrame] = TypeAdapter(CanvasFrame)
