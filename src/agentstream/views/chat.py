"""The public chat surface (spec 000 "Agent stream events"): who may see what, and when.

Two independent questions decide every frame. Cadence: a client that sent
``X-Sim-Stream-Protocol: agent-events-v1`` gets answer text live and honours
``chunk_reset``; any other client gets only settled final-turn text, in one piece.
Exposure: thinking frames need the header *and* ``include_thinking``; tool lifecycle
frames need the header *and* ``include_tool_calls``. Tool arguments and results never
appear here, in any frame. With redaction on, no text is forwarded live at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
)

__all__ = [
    "PROTOCOL_HEADER",
    "PROTOCOL_V1",
    "PUBLIC_ERRORS",
    "THINKING_CAP",
    "ChatBlock",
    "ChatPolicy",
    "ChatView",
]

PROTOCOL_HEADER = "X-Sim-Stream-Protocol"
PROTOCOL_V1 = "agent-events-v1"
THINKING_CAP = 512_000
"""Thinking characters forwarded per block; the rest is dropped, the answer is not."""

Frame = dict[str, Any]

PUBLIC_ERRORS = {
    "error": "Something went wrong while answering; please try again.",
    "interrupted": "The server restarted while answering; please try again.",
}
"""What a public client reads for these endings; timeouts and cancels say their own."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatPolicy:
    """What one request may see: the negotiated protocol and the deployment's toggles."""

    protocol_v1: bool
    """The client sent the protocol header with a value this server speaks."""
    include_thinking: bool = False
    include_tool_calls: bool = False
    redact: Callable[[str], str] | None = None
    """PII redaction for every text this surface shows; disables live text forwarding."""
    outputs: tuple[str, ...] = ("content", "toolCalls")
    """What the final envelope's ``output`` holds."""

    @property
    def live_text(self) -> bool:
        return self.protocol_v1 and self.redact is None

    @property
    def thinking(self) -> bool:
        return self.protocol_v1 and self.include_thinking

    @property
    def tools(self) -> bool:
        return self.protocol_v1 and self.include_tool_calls


@dataclass(slots=True)
class ChatBlock:
    streamed_text: bool = False
    """Live text went out in the current step and may need a ``chunk_reset``."""
    thinking_sent: int = 0
    thinking_step: int = 0
    """The step whose thinking went out last: a new step's starts on a new paragraph."""
    tool_calls: dict[str, Frame] = field(default_factory=dict)

    def thinking(self, block_id: str, segment: int, text: str) -> list[Frame]:
        """A thinking frame, within the block's cap; a new segment starts a new paragraph."""
        if self.thinking_step not in (0, segment):
            text = "\n\n" + text
        self.thinking_step = segment
        room = THINKING_CAP - self.thinking_sent
        if room <= 0:
            return []
        text = text[:room]
        self.thinking_sent += len(text)
        return [{"blockId": block_id, "event": "thinking", "data": text}]


class ChatView:
    """Translates one run's canonical events into public chat frames."""

    def __init__(self, policy: ChatPolicy, *, block_id: str, conversation_id: str) -> None:
        self.policy = policy
        self.block_id = block_id
        self.conversation_id = conversation_id
        self._block = ChatBlock()

    def frames(self, event: BaseEvent) -> list[Frame]:
        policy, block, block_id = self.policy, self._block, self.block_id
        match event:
            case TextDelta(delta=delta) if policy.live_text:
                block.streamed_text = True
                return [{"blockId": block_id, "chunk": delta}]
            case TextRetracted() if block.streamed_text:
                block.streamed_text = False
                return [{"blockId": block_id, "event": "chunk_reset"}]
            case Text(text=text) if not policy.live_text and text:
                return [{"blockId": block_id, "chunk": self._shown(text)}]
            case ReasoningDelta(step=step, delta=delta) if (
                policy.thinking and policy.redact is None
            ):
                return self._thinking(step, delta)
            case Reasoning(step=step, text=text) if policy.thinking and policy.redact is not None:
                return self._thinking(step, policy.redact(text))
            case ToolCall(call_id=call_id, tool_name=name):
                block.tool_calls[call_id] = {"id": call_id, "name": name, "status": "pending"}
                if policy.tools:
                    return [
                        {
                            "blockId": block_id,
                            "event": "tool",
                            "phase": "start",
                            "id": call_id,
                            "name": name,
                        }
                    ]
            case ToolResult(call_id=call_id, tool_name=name, status=status):
                block.tool_calls[call_id] = {"id": call_id, "name": name, "status": status}
                if policy.tools:
                    return [
                        {
                            "blockId": block_id,
                            "event": "tool",
                            "phase": "end",
                            "id": call_id,
                            "name": name,
                            "status": status,
                        }
                    ]
            case StepStarted():
                block.streamed_text = False
            case RunCompleted(content=content, usage=usage):
                output: Frame = {
                    "content": self._shown(content),
                    "toolCalls": list(block.tool_calls.values()),
                    "usage": {
                        "inputTokens": usage.input_tokens,
                        "outputTokens": usage.output_tokens,
                    },
                }
                data = {
                    "success": True,
                    "conversationId": self.conversation_id,
                    "output": {k: v for k, v in output.items() if k in policy.outputs},
                }
                return [{"event": "final", "data": data}]
            case RunFailed(status=status, message=message):
                # Errors can carry a provider's or the server's details: not for the public.
                shown = PUBLIC_ERRORS.get(status, message)
                return [{"event": "error", "error": self._shown(shown)}]
            case RunPaused():
                data = {
                    "success": False,
                    "error": "The answer is waiting for an approval",
                    "conversationId": self.conversation_id,
                }
                return [{"event": "final", "data": data}]
            case (
                TextDelta()
                | TextRetracted()
                | Text()
                | ReasoningDelta()
                | Reasoning()
                | ReasoningSummary()
                | RunStarted()
                | StepCompleted()
                | ApprovalRequested()
                | ContextHandlerCreated()
                | DelegationStarted()
                | EntityChunk()
                | DelegationCompleted()
            ):
                pass  # an orchestration's entities work behind its delegation tool calls
            case _:
                raise TypeError(f"No chat frame rule for {type(event).__name__}")
        return []

    def _shown(self, text: str) -> str:
        return self.policy.redact(text) if self.policy.redact else text

    def _thinking(self, step: int, text: str) -> list[Frame]:
        return self._block.thinking(self.block_id, step, text)
