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

from agentstream.views.chat import PUBLIC_ERRORS, ChatBlock, ChatPolicy, Frame
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
        self._blocks = {block_id: ChatBlock() for block_id in self.output_blocks}
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
            case WorkflowError():
                return [{"event": "error", "error": self._shown(PUBLIC_ERRORS["error"])}]
            case WorkflowCancelled(reason=reason):
                return [{"event": "error", "error": self._shown(reason)}]
        block_id: str | None = getattr(event, "block_id", None)
        if block_id not in self._blocks:
            return []  # not an output block: it works unseen
        assert block_id is not None
        self._held[block_id] += self._block_frames(block_id, event)
        if isinstance(event, BlockCompleted | BlockError | BlockSkipped):
            self._ended.add(block_id)
        return self._release()

    def _block_frames(self, block_id: str, event: WorkflowEventBase) -> list[Frame]:
        policy, block = self.policy, self._blocks[block_id]
        match event:
            case BlockContentDelta(delta=delta) if policy.live_text:
                block.streamed_text = True
                return [{"blockId": block_id, "chunk": delta}]
            case BlockChunkReset() if block.streamed_text:
                block.streamed_text = False
                return [{"blockId": block_id, "event": "chunk_reset"}]
            case BlockChunk(delta=delta) if not policy.live_text and delta:
                return [{"blockId": block_id, "chunk": self._shown(delta)}]
            case BlockReasoningDelta(delta=delta) if policy.thinking and policy.redact is None:
                return block.thinking(block_id, 1, delta)
            case BlockReasoning(text=text) if policy.thinking and policy.redact is not None:
                return block.thinking(block_id, 1, policy.redact(text))
            case BlockTool(phase=phase, call_id=call_id, name=name, status=status):
                block.tool_calls[call_id] = {
                    "id": call_id,
                    "name": name,
                    "status": status or "pending",
                }
                if policy.tools:
                    frame: Frame = {
                        "blockId": block_id,
                        "event": "tool",
                        "phase": phase,
                        "id": call_id,
                        "name": name,
                    }
                    return [frame | {"status": status}] if phase == "end" else [frame]
            case BlockOutput(output=output):
                answer = self._answers[block_id] = _text(output)
                streamed = any("chunk" in frame for frame in self._held[block_id])
                if answer and not (streamed or self._shows_text.get(block_id)):
                    # e.g. a template: its output is its only text
                    return [{"blockId": block_id, "chunk": self._shown(answer)}]
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
            "content": self._shown(SEPARATOR.join(self._answers[b] for b in answered)),
            "toolCalls": [call for b in answered for call in self._blocks[b].tool_calls.values()],
        }
        data = {
            "success": True,
            "conversationId": self.conversation_id,
            "output": {k: v for k, v in output.items() if k in self.policy.outputs},
        }
        return {"event": "final", "data": data}

    def _shown(self, text: str) -> str:
        return self.policy.redact(text) if self.policy.redact else text


def _text(output: dict[str, Any]) -> str:
    """A block's answer as text: an agent's ``content``, a template's ``text``, else JSON."""
    for key in ("content", "text"):
        if isinstance(output.get(key), str):
            return str(output[key])
    value = output.get("result", output)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
