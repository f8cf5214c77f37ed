"""The public chat surface for a deployment that serves a workflow.

The same frames and rules as ``views.chat`` (cadence by the protocol header, thinking and
tool frames by the deployment's toggles, no tool arguments or results, redaction), applied
per block: the answer is the text of the deployment's output blocks, each under its own
``blockId``, in the deployment's order, a later block's first chunk opening with a blank
line. Other blocks work unseen.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from agentstream.views.chat import ChatBlock, ChatPolicy, Frame, error_frame, final_frame
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
    BlockTool,
    WorkflowCancelled,
    WorkflowComplete,
    WorkflowError,
    WorkflowEventBase,
)

__all__ = ["WorkflowChatView"]

SEPARATOR = "\n\n"


class WorkflowChatView:
    """Translates one execution's workflow events into public chat frames.

    Output blocks may run in parallel, but a chat shows one answer: each block's frames go
    out in the deployment's order, a later block's held back until the earlier ones end.
    """

    def __init__(
        self, policy: ChatPolicy, *, output_blocks: Collection[str], conversation_id: str
    ) -> None:
        self.policy = policy
        self.output_blocks = list(dict.fromkeys(output_blocks))
        self.conversation_id = conversation_id
        self._blocks = {b: ChatBlock(policy, b) for b in self.output_blocks}
        self._segments = dict.fromkeys(self.output_blocks, 1)
        """Each block's thinking segment: a new one starts a new paragraph."""
        self._answers: dict[str, str] = {}
        self._ended: set[str] = set()
        self._held: dict[str, list[Frame]] = {block_id: [] for block_id in self.output_blocks}
        self._current = 0
        """The output block whose frames go out as they come."""
        self._shows_text: dict[str, bool] = {}
        """Whether the client holds text of the block (a reset takes it back)."""

    def frames(self, event: WorkflowEventBase) -> list[Frame]:
        match event:
            case WorkflowComplete():
                return [self._final()]
            case WorkflowError(error=error):
                return [error_frame(self.policy, "error", error)]
            case WorkflowCancelled(reason=reason):
                return [error_frame(self.policy, "cancelled", reason)]
        block_id: str | None = getattr(event, "block_id", None)
        if block_id not in self._blocks:
            return []  # not an output block: it works unseen
        assert block_id is not None
        self._held[block_id] += self._block_frames(block_id, event)
        if isinstance(event, BlockCompleted | BlockError | BlockSkipped):
            self._ended.add(block_id)
        return self._release()

    def _block_frames(self, block_id: str, event: WorkflowEventBase) -> list[Frame]:
        block = self._blocks[block_id]
        match event:
            case BlockContentDelta(delta=delta):
                return block.live_text(delta)
            case BlockChunkReset():
                return block.retract()
            case BlockChunk(delta=delta):
                return block.settled_text(delta)
            case BlockReasoningDelta(delta=delta):
                return block.thinking_delta(self._segments[block_id], delta)
            case BlockReasoning(text=text):  # a segment ended: the next opens a paragraph
                self._segments[block_id] += 1
                return block.thinking_whole(self._segments[block_id] - 1, text)
            case BlockTool(phase=phase, call_id=call_id, name=name, status=status):
                return block.tool(phase, call_id, name, status)
            case BlockOutput(output=output):
                answer = self._answers[block_id] = _text(output)
                streamed = any("chunk" in frame for frame in self._held[block_id])
                if answer and not (streamed or self._shows_text.get(block_id)):
                    # e.g. a template: its output is its only text
                    return [{"blockId": block_id, "chunk": self.policy.shown(answer)}]
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

    def _final(self) -> Frame:
        answered = [b for b in self.output_blocks if b in self._answers]
        output: Frame = {
            "content": self.policy.shown(SEPARATOR.join(self._answers[b] for b in answered)),
            "toolCalls": [call for b in answered for call in self._blocks[b].tool_calls.values()],
        }
        return final_frame(self.policy, self.conversation_id, output)


def _text(output: dict[str, Any]) -> str:
    """A block's answer as text: an agent's ``content``, a template's ``text``, else JSON."""
    for key in ("content", "text"):
        if isinstance(output.get(key), str):
            return str(output[key])
    value = output.get("result", output)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
