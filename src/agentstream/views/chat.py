"""The public chat surface (spec 000 "Agent stream events"): who may see what, and when.

Two independent questions decide every frame. Cadence: a client that sent
``X-Sim-Stream-Protocol: agent-events-v1`` gets answer text live and honours
``chunk_reset``; any other client gets only settled final-turn text, in one piece.
Exposure: thinking frames need the header *and* ``include_thinking``; tool lifecycle
frames need the header *and* ``include_tool_calls``. Tool arguments and results never
appear here, in any frame. With redaction on, no text is forwarded live at all. A run read
back from the store has no deltas: its text and thinking come settled, whatever the cadence.

The pydantic models at the end describe the frames ``ChatView`` builds, for clients and the
docs (``ChatFrameAdapter``; the OpenAPI document's schema of ``POST /api/chat/{slug}``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
from agentstream.views.frames import SLOT, JSONText, Template

__all__ = [
    "PROTOCOL_HEADER",
    "PROTOCOL_V1",
    "PUBLIC_ERRORS",
    "THINKING_CAP",
    "ChatBlock",
    "ChatFrame",
    "ChatFrameAdapter",
    "ChatPolicy",
    "ChatView",
    "ends_answer",
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
SEPARATOR = "\n\n"
"""Between two output blocks' text."""


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
    chunk: Template = field(init=False, repr=False, compare=False)
    """``live_text``'s frame, for a token that goes out as it is (``ChatView._showing``)."""

    def __post_init__(self) -> None:
        self.chunk = Template({"blockId": self.block_id, "chunk": SLOT})

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
        """Final-turn text in one piece, where it did not go out live: for clients that get
        no live text, and for a turn read back from the store, which keeps no deltas."""
        if not text or (self.policy.live_text and self.streamed_text):
            return []
        return [{"blockId": self.block_id, "chunk": self.policy.shown(text)}]

    def thinking_delta(self, segment: int, delta: str) -> list[Frame]:
        if not self.policy.thinking or self.policy.redact is not None:
            return []
        return self._thinking(segment, delta)

    def thinking_whole(self, segment: int, text: str) -> list[Frame]:
        """A segment's whole thinking, where it did not go out live: what a redacting
        deployment shows, masked, and a segment read back from the store."""
        if not self.policy.thinking or self.thinking_segment == segment:
            return []
        return self._thinking(segment, self.policy.shown(text))

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
        """The answer waits for a person to approve a tool call: part of the tool lifecycle,
        so shown where tool frames are (the header alone exposes nothing; ``final`` says
        ``awaitingApproval`` to every client). Never its arguments."""
        if not self.policy.tools:
            return []
        return [
            {"blockId": self.block_id, "event": "approval_required", "id": call_id, "name": name}
        ]

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


def ends_answer(event: Event) -> bool:
    """The event ends an answer: its ``final`` or ``error`` frame is the stream's last
    before ``[DONE]``."""
    return isinstance(event, RunCompleted | RunFailed | RunPaused)


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
    """Translates one run's events into public chat frames.

    The answer is the text of the run's output blocks, each under its own ``blockId``, in
    the deployment's order: a workflow deployment names blocks of its workflow; an agent
    deployment's one output block is the run itself (its events have no block id), shown
    under ``run_block``. Other blocks work unseen. Output blocks may run in parallel, but a
    chat shows one answer: each block's frames go out in order, a later block's held back
    until the earlier ones end, and its first text opens with a blank line.
    """

    def __init__(
        self,
        policy: ChatPolicy,
        *,
        output_blocks: Sequence[str],
        conversation_id: str,
        run_block: str | None = None,
    ) -> None:
        self.policy = policy
        self.output_blocks = list(dict.fromkeys(output_blocks))
        self.conversation_id = conversation_id
        self.run_block = run_block
        self._blocks = {b: ChatBlock(policy, b) for b in self.output_blocks}
        self._answers: dict[str, str] = {}
        self._ended: set[str] = set()
        self._held: dict[str, list[Frame]] = {block_id: [] for block_id in self.output_blocks}
        self._current = 0
        """The output block whose frames go out as they come."""
        self._shows_text: dict[str, bool] = {}
        """Whether the client holds text of the block (a reset takes it back)."""

    def frames(self, event: Event) -> Sequence[Frame | JSONText]:
        if type(event) is TextDelta and (block := self._showing(event)) is not None:
            block.streamed_text = True  # as live_text does
            return [block.chunk.fill(event.delta)]
        match event:
            case RunCompleted(content=content, usage=usage) if self.run_block is not None:
                self._answers[self.run_block] = content
                tokens = {"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens}
                return [self._final(tokens)]
            case RunCompleted():
                return [self._final(None)]
            case RunFailed(status=status, message=message):
                return [error_frame(self.policy, status, message)]
            case RunPaused():
                return [_awaiting_approval_frame(self.policy, self.conversation_id)]
        block_id = self.run_block if event.block_id is None else event.block_id
        if block_id not in self._blocks:
            return []  # not an output block: it works unseen
        assert block_id is not None
        self._held[block_id] += self._block_frames(self._blocks[block_id], event)
        if isinstance(event, BlockCompleted | BlockError | BlockSkipped):
            self._ended.add(block_id)
        return self._release()

    def _showing(self, event: TextDelta) -> ChatBlock | None:
        """The block whose text this token goes on with as it comes, when its frame goes out
        as ``live_text`` makes it (most of the frames): text is live, the block is the
        current one, and the client shows some of its text already (no separator to add,
        nothing held)."""
        if self._current == len(self.output_blocks):
            return None
        current = self.output_blocks[self._current]
        block_id = self.run_block if event.block_id is None else event.block_id
        if block_id == current and self.policy.live_text and self._shows_text.get(current):
            return self._blocks[current]
        return None

    def _block_frames(self, block: ChatBlock, event: Event) -> list[Frame]:
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
            case ApprovalRequested(call_id=call_id, tool_name=name):
                return block.approval_required(call_id, name)
            case StepStarted():
                block.streamed_text = False
            case BlockOutput(output=output):
                answer = self._answers[block.block_id] = _text(output)
                held = self._held[block.block_id]
                streamed = any("chunk" in frame for frame in held)
                if answer and not (streamed or self._shows_text.get(block.block_id)):
                    # e.g. a template: its output is its only text
                    return [{"blockId": block.block_id, "chunk": self.policy.shown(answer)}]
            case (
                RunStarted()
                | RunCompleted()
                | RunFailed()
                | RunPaused()
                | ReasoningSummary()
                | StepCompleted()
                | ContextHandlerCreated()
                | DelegationStarted()
                | EntityChunk()
                | EntityText()
                | DelegationCompleted()
                | BlockStarted()
                | BlockCompleted()
                | BlockError()
                | BlockSkipped()
            ):
                pass  # an orchestration's entities work behind its delegation tool calls
            case _:
                assert_never(event)
        return []

    def _release(self) -> list[Frame]:
        """The held frames of the current block, and of each next one once it is current."""
        out: list[Frame] = []
        while self._current < len(self.output_blocks):
            block_id = self.output_blocks[self._current]
            out += [self._separated(frame) for frame in self._held[block_id]]
            self._held[block_id] = []
            if block_id not in self._ended:
                break
            self._current += 1
        return out

    def _separated(self, frame: Frame) -> Frame:
        """A block's first text after an earlier block's opens with a blank line."""
        block_id = frame["blockId"]
        if frame.get("event") == "chunk_reset":
            self._shows_text[block_id] = False
        elif "chunk" in frame and not self._shows_text.get(block_id):
            self._shows_text[block_id] = True
            if any(self._shows_text.get(b) for b in self.output_blocks[: self._current]):
                return frame | {"chunk": SEPARATOR + frame["chunk"]}
        return frame

    def _final(self, usage: Frame | None) -> Frame:
        """The envelope: the answered blocks' text and tool calls, and an agent's usage."""
        answered = [b for b in self.output_blocks if b in self._answers]
        output: Frame = {
            "content": self.policy.shown(SEPARATOR.join(self._answers[b] for b in answered)),
            "toolCalls": [call for b in answered for call in self._blocks[b].tool_calls.values()],
        }
        if usage is not None:
            output["usage"] = usage
        return final_frame(self.policy, self.conversation_id, output)


def _text(output: dict[str, Any]) -> str:
    """A block's answer as text: an agent's ``content``, a template's ``text``, else JSON."""
    for key in ("content", "text"):
        if isinstance(output.get(key), str):
            return str(output[key])
    value = output.get("result", output)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


class _Frame(BaseModel):
    # A newer server may add fields: an older client ignores them.
    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True)


class ChatChunkFrame(_Frame):
    """Answer text: live deltas with the protocol header; else the settled text at once."""

    blockId: str
    """The output block it belongs to: an agent deployment's agent id, or a workflow's."""
    chunk: str
    """Appended to the block's text (a later block's first one opens with a blank line)."""


class ChatChunkResetFrame(_Frame):
    """The block's text so far was a preamble before tool calls: drop it."""

    blockId: str
    event: Literal["chunk_reset"]


class ChatThinkingFrame(_Frame):
    """The model's thinking (header and ``includeThinking``), capped per block."""

    blockId: str
    event: Literal["thinking"]
    data: str


class ChatToolFrame(_Frame):
    """A tool call's lifecycle (header and ``includeToolCalls``): never its arguments or
    result."""

    blockId: str
    event: Literal["tool"]
    phase: Literal["start", "end"]
    id: str
    name: str
    status: Literal["success", "error", "cancelled"] | None = None
    """At ``end`` only."""


class ChatApprovalRequiredFrame(_Frame):
    """The answer waits for a person to approve a tool call (where tool frames are shown:
    the header and ``include_tool_calls``)."""

    blockId: str
    event: Literal["approval_required"]
    id: str
    name: str


class ChatToolCall(_Frame):
    id: str
    name: str
    status: str
    """pending, success, error or cancelled."""


class ChatUsage(_Frame):
    inputTokens: int
    outputTokens: int


class ChatOutput(_Frame):
    """What the deployment's ``outputs`` show."""

    content: str | None = None
    toolCalls: list[ChatToolCall] | None = None
    usage: ChatUsage | None = None
    """An agent deployment's, when ``outputs`` has it."""


class ChatAnswer(_Frame):
    success: Literal[True]
    conversationId: str
    output: ChatOutput


class ChatAwaitingApproval(_Frame):
    success: Literal[False]
    awaitingApproval: Literal[True]
    error: str
    conversationId: str


class ChatFinalFrame(_Frame):
    """The answer's end: the envelope, or that it waits for an approval."""

    event: Literal["final"]
    data: ChatAnswer | ChatAwaitingApproval


class ChatErrorFrame(_Frame):
    """The answer failed; what the public may read of why."""

    event: Literal["error"]
    error: str


ChatDone = Literal["[DONE]"]
"""The stream's last frame, a JSON string (``data: "[DONE]"``)."""

ChatFrame = Annotated[
    ChatChunkFrame
    | ChatChunkResetFrame
    | ChatThinkingFrame
    | ChatToolFrame
    | ChatApprovalRequiredFrame
    | ChatFinalFrame
    | ChatErrorFrame
    | ChatDone,
    Field(union_mode="left_to_right"),
]
"""Any frame of a public chat stream."""

ChatFrameAdapter: TypeAdapter[ChatFrame] = TypeAdapter(ChatFrame)
