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
    EntityText,
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
    "error_frame",
    "final_frame",
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
WAITING_FOR_APPROVAL = "The answer is waiting for an approval."


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

    def shown(self, text: str) -> str:
        """Text as this surface may show it: redacted when the deployment says so."""
        return self.redact(text) if self.redact else text

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
    """One block's frames on this surface: the rules every chat view applies per block."""

    policy: ChatPolicy
    block_id: str
    streamed_text: bool = False
    """Live text went out in the current turn and may need a ``chunk_reset``."""
    thinking_sent: int = 0
    thinking_segment: int = 0
    """The segment (step) whose thinking went out last: a new one starts a new paragraph."""
    tool_calls: dict[str, Frame] = field(default_factory=dict)
    """Name and status of each call, for the final envelope: never arguments or results."""

    def live_text(self, delta: str) -> list[Frame]:
        if not self.policy.live_text:
            return []
        self.streamed_text = True
        return [{"blockId": self.block_id, "chunk": delta}]

    def retract(self) -> list[Frame]:
        """The turn's streamed text was preamble: the client drops it."""
        if not self.streamed_text:
            return []
        self.streamed_text = False
        return [{"blockId": self.block_id, "event": "chunk_reset"}]

    def settled_text(self, text: str) -> list[Frame]:
        """Final-turn text in one piece, for clients that get no live text."""
        if self.policy.live_text or not text:
            return []
        return [{"blockId": self.block_id, "chunk": self.policy.shown(text)}]

    def thinking_delta(self, segment: int, delta: str) -> list[Frame]:
        if not self.policy.thinking or self.policy.redact is not None:
            return []
        return self._thinking(segment, delta)

    def thinking_whole(self, segment: int, text: str) -> list[Frame]:
        """A segment's whole thinking: what a redacting deployment shows, masked."""
        if not self.policy.thinking or self.policy.redact is None:
            return []
        return self._thinking(segment, self.policy.redact(text))

    def tool(self, phase: str, call_id: str, name: str, status: str | None = None) -> list[Frame]:
        self.tool_calls[call_id] = {"id": call_id, "name": name, "status": status or "pending"}
        if not self.policy.tools:
            return []
        frame: Frame = {
            "blockId": self.block_id,
            "event": "tool",
            "phase": phase,
            "id": call_id,
            "name": name,
        }
        return [frame | {"status": status}] if phase == "end" else [frame]

    def approval_required(self, call_id: str, name: str) -> list[Frame]:
        """The answer waits for a person to approve a tool call: said to clients that speak
        the protocol; which call, only where tool frames are shown. Never its arguments."""
        if not self.policy.protocol_v1:
            return []
        frame: Frame = {"blockId": self.block_id, "event": "approval_required"}
        return [frame | {"id": call_id, "name": name} if self.policy.tools else frame]

    def _thinking(self, segment: int, text: str) -> list[Frame]:
        """Within the block's cap; a new segment starts a new paragraph."""
        if self.thinking_segment not in (0, segment):
            text = "\n\n" + text
        self.thinking_segment = segment
        room = THINKING_CAP - self.thinking_sent
        if room <= 0:
            return []
        text = text[:room]
        self.thinking_sent += len(text)
        return [{"blockId": self.block_id, "event": "thinking", "data": text}]


def final_frame(policy: ChatPolicy, conversation_id: str, output: Frame) -> Frame:
    """The terminal envelope of an answer, with the outputs the deployment shows."""
    data = {
        "success": True,
        "conversationId": conversation_id,
        "output": {k: v for k, v in output.items() if k in policy.outputs},
    }
    return {"event": "final", "data": data}


def _awaiting_approval_frame(policy: ChatPolicy, conversation_id: str) -> Frame:
    """The terminal envelope of a run that paused: no answer yet, and no failure either."""
    data = {
        "success": False,
        "awaitingApproval": True,
        "error": policy.shown(WAITING_FOR_APPROVAL),
        "conversationId": conversation_id,
    }
    return {"event": "final", "data": data}


def error_frame(policy: ChatPolicy, status: str, message: str) -> Frame:
    """The terminal error: errors can carry a provider's or the server's details, not for
    the public, so those read generically."""
    return {"event": "error", "error": policy.shown(PUBLIC_ERRORS.get(status, message))}


class ChatView:
    """Translates one run's canonical events into public chat frames."""

    def __init__(self, policy: ChatPolicy, *, block_id: str, conversation_id: str) -> None:
        self.policy = policy
        self.block_id = block_id
        self.conversation_id = conversation_id
        self._block = ChatBlock(policy, block_id)

    def frames(self, event: BaseEvent) -> list[Frame]:
        block = self._block
        match event:
            case TextDelta(delta=delta):
                return block.live_text(delta)
            case TextRetracted():
                return block.retract()
            case Text(text=text):
                return block.settled_text(text)
            case ReasoningDelta(step=step, delta=delta):
                return block.thinking_delta(step, delta)
            case Reasoning(step=step, text=text):
                return block.thinking_whole(step, text)
            case ToolCall(call_id=call_id, tool_name=name):
                return block.tool("start", call_id, name)
            case ToolResult(call_id=call_id, tool_name=name, status=status):
                return block.tool("end", call_id, name, status)
            case StepStarted():
                block.streamed_text = False
            case RunCompleted(content=content, usage=usage):
                output: Frame = {
                    "content": self.policy.shown(content),
                    "toolCalls": list(block.tool_calls.values()),
                    "usage": {
                        "inputTokens": usage.input_tokens,
                        "outputTokens": usage.output_tokens,
                    },
                }
                return [final_frame(self.policy, self.conversation_id, output)]
            case RunFailed(status=status, message=message):
                return [error_frame(self.policy, status, message)]
            case ApprovalRequested(call_id=call_id, tool_name=name):
                return block.approval_required(call_id, name)
            case RunPaused():
                return [_awaiting_approval_frame(self.policy, self.conversation_id)]
            case (
                ReasoningSummary()
                | RunStarted()
                | StepCompleted()
                | ContextHandlerCreated()
                | DelegationStarted()
                | EntityChunk()
                | EntityText()
                | DelegationCompleted()
            ):
                pass  # an orchestration's entities work behind its delegation tool calls
            case _:
                raise TypeError(f"No chat frame rule for {type(event).__name__}")
        return []
