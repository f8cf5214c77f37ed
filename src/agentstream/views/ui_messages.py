"""The Vercel AI SDK's UI message stream (protocol v1) as a view of an agent run: the
chunks ``useChat`` and ``DefaultChatTransport`` read into one assistant message per run.

A run is one assistant message (its id is the run's): a step is a ``start-step`` ...
``finish-step``, each step's text a text part (the text before tool calls is a part of
its own, before them), reasoning a reasoning part. Tool calls ran on the server:
``providerExecuted`` and ``dynamic`` (the client need not know the tool), input, then
output or error. A call that needs a person is a ``tool-approval-request`` (its
``approvalId`` is the call's id) and the message finishes there, to continue once the
client sends the decision. Citations of ``knowledge_search`` are a ``source-url`` part
naming their context handler. A run read back from the store has no deltas: a settled
text comes as one delta.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agentstream.events import (
    ApprovalRequested,
    ContextHandlerCreated,
    Event,
    Reasoning,
    ReasoningDelta,
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
from agentstream.views.frames import SLOT, JSONText, OpenPart, Template

__all__ = ["HEADERS", "UIMessageChunks"]

Frame = dict[str, Any]

HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}
"""The response header that says which protocol the stream speaks."""


@dataclass(slots=True)
class UIMessageChunks:
    """The chunks of one run's assistant message, fed the run from its first event (for a
    message that goes on after its approvals, see ``views.continued``)."""

    message_id: str
    _open: dict[str, OpenPart] = field(default_factory=dict)
    """The parts begun and not ended, by ``text`` or ``reasoning``: their id, and their
    delta chunk."""
    _in_step: bool = False

    @property
    def opening(self) -> Frame:
        """The chunk that opens the message."""
        return {"type": "start", "messageId": self.message_id}

    def __call__(self, event: Event) -> Iterable[Frame | JSONText]:
        if type(event) is TextDelta and "reasoning" not in self._open and "text" in self._open:
            # A token of the open part, most of the frames: returned, not generated.
            return (self._open["text"].deltas.fill(event.delta),)
        return self._frames(event)

    def _frames(self, event: Event) -> Iterator[Frame | JSONText]:
        match event:
            case RunStarted():
                yield self.opening
            case StepStarted():
                self._in_step = True
                yield {"type": "start-step"}
            case ReasoningDelta(seq=seq, delta=delta):
                yield from self._grow("reasoning", seq, delta)
            case Reasoning(seq=seq, text=text):
                if "reasoning" not in self._open:  # read back: no deltas
                    yield from self._grow("reasoning", seq, text)
                yield from self._end("reasoning")
            case TextDelta(seq=seq, delta=delta):
                yield from self._end("reasoning")  # reasoning streamed after the text began
                yield from self._grow("text", seq, delta)
            case Text(seq=seq, text=text) | TextRetracted(seq=seq, text=text):
                if "text" not in self._open and text:
                    yield from self._grow("text", seq, text)
                yield from self._end("text")
            case ToolCall(call_id=call_id, tool_name=name, arguments=arguments):
                tool = {"toolCallId": call_id, "toolName": name, **_SERVER_SIDE}
                yield {"type": "tool-input-start", **tool}
                yield {"type": "tool-input-available", **tool, "input": arguments}
            case ToolResult(call_id=call_id, status="success", result=result):
                yield {
                    "type": "tool-output-available",
                    "toolCallId": call_id,
                    "output": result,
                    **_SERVER_SIDE,
                }
            case ToolResult(call_id=call_id, status=status, result=result):
                error = result if isinstance(result, str) else f"The call was {status}"
                yield {
                    "type": "tool-output-error",
                    "toolCallId": call_id,
                    "errorText": error,
                    **_SERVER_SIDE,
                }
            case ApprovalRequested(call_id=call_id):
                yield {
                    "type": "tool-approval-request",
                    "approvalId": call_id,
                    "toolCallId": call_id,
                }
            case ContextHandlerCreated(context_handler_id=handler_id):
                yield {
                    "type": "source-url",
                    "sourceId": handler_id,
                    "url": f"/api/context-handlers/{handler_id}",
                    "title": "Passages found by knowledge_search",
                }
            case StepCompleted():
                yield from self._end_all()
            case RunPaused():
                yield from self._end_all()
                yield {"type": "finish", "finishReason": "tool-calls"}
            case RunCompleted():
                yield from self._end_all()
                yield {"type": "finish", "finishReason": "stop"}
            case RunFailed(status="cancelled", message=message):
                yield from self._end_all()
                yield {"type": "abort", "reason": message}
            case RunFailed(message=message):
                yield from self._end_all()
                yield {"type": "error", "errorText": message}

    def _grow(self, kind: str, seq: int, delta: str) -> Iterator[Frame | JSONText]:
        """A delta of the open part of ``kind``, which begins (named by the seq of its
        first event) if none is open."""
        if (part := self._open.get(kind)) is None:
            part_id = f"{kind}_{seq}"
            deltas = Template({"type": f"{kind}-delta", "id": part_id, "delta": SLOT})
            part = self._open[kind] = OpenPart(part_id, deltas)
            yield {"type": f"{kind}-start", "id": part_id}
        yield part.deltas.fill(delta)

    def _end(self, kind: str) -> Iterator[Frame]:
        if (part := self._open.pop(kind, None)) is not None:
            yield {"type": f"{kind}-end", "id": part.id}

    def _end_all(self) -> Iterator[Frame]:
        """The open parts, and the step: before the next step or the message's end."""
        yield from self._end("reasoning")
        yield from self._end("text")
        if self._in_step:
            self._in_step = False
            yield {"type": "finish-step"}


_SERVER_SIDE = {"providerExecuted": True, "dynamic": True}
"""A tool call that ran on the server, of a tool the client need not know."""
