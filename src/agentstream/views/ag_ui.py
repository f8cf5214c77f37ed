"""AG-UI (the Agent User Interaction protocol, 1.0) as a view of an agent run: the events
CopilotKit's ``HttpAgent`` reads, camelCase, one ``data:`` frame each.

One AG-UI run is the agentstream run (or, after a pause for approvals, its continuation);
its thread is the run's session. A step is ``STEP_STARTED``/``STEP_FINISHED`` named
``step N``; a delegation to another agent is a step inside it named
``delegate:<agent>:<its run id>``, and the delegated agent's text ``CUSTOM`` events named
``entity_text``. Each step's text is an assistant message of its own (``TEXT_MESSAGE_*``),
so the text a model writes before calling tools is a message before the calls, as AG-UI
models it. Reasoning is a reasoning message inside ``REASONING_START``/``REASONING_END``.
Tool calls ran on the server: start, the arguments whole, end, and ``TOOL_CALL_RESULT``.
A run that stops for approvals finishes with an ``interrupt`` outcome, one interrupt per
call, whose id is the call's; a cancelled run finishes ``cancelled``; a failed one is
``RUN_ERROR``. Citations of ``knowledge_search`` are a ``CUSTOM`` event named
``context_handler``. A run read back from the store has no deltas: a settled text comes
as one delta.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agentstream.events import (
    ApprovalRequested,
    ContextHandlerCreated,
    DelegationCompleted,
    DelegationStarted,
    EntityChunk,
    EntityText,
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

__all__ = ["APPROVAL", "PROTOCOL_VERSION", "AGUIEvents"]

Frame = dict[str, Any]

PROTOCOL_VERSION = "1.0"
"""The version of AG-UI these events are, which ``RUN_STARTED`` declares."""

APPROVAL = "tool_approval"
"""The ``reason`` of an interrupt that asks a person to approve a tool call."""


@dataclass(slots=True)
class AGUIEvents:
    """The AG-UI events of one agentstream run on the thread ``thread_id``, fed the run
    from its first event (for a run that goes on after its approvals, see
    ``views.continued``)."""

    thread_id: str
    run_id: str
    _open: dict[str, OpenPart] = field(default_factory=dict)
    """The messages begun and not ended, by ``text`` or ``reasoning``: their id, and their
    content event."""
    _steps: list[str] = field(default_factory=list)
    """The steps begun and not finished: an agent step, and delegations inside it."""
    _chunked: set[str] = field(default_factory=set)
    """The delegations whose text came live (``EntityChunk``), by entity run."""
    _asked: list[Frame] = field(default_factory=list)
    """The interrupts of the pause to come."""

    @property
    def opening(self) -> Frame:
        """The event that opens the run."""
        return {
            "type": "RUN_STARTED",
            "threadId": self.thread_id,
            "runId": self.run_id,
            "protocolVersion": PROTOCOL_VERSION,
        }

    def __call__(self, event: Event) -> Iterable[Frame | JSONText]:
        if type(event) is TextDelta and "reasoning" not in self._open and "text" in self._open:
            # A token of the open message, most of the frames: returned, not generated.
            return (self._open["text"].deltas.fill(event.delta),) if event.delta else ()
        return self._frames(event)

    def _frames(self, event: Event) -> Iterator[Frame | JSONText]:
        match event:
            case RunStarted():
                yield self.opening
            case StepStarted(step=step):
                yield from self._start_step(f"step {step}")
            case StepCompleted(step=step):
                yield from self._end_step(f"step {step}")
            case DelegationStarted(entity=entity, entity_run_id=entity_run_id):
                yield from self._start_step(f"delegate:{entity}:{entity_run_id}")
            case DelegationCompleted(entity=entity, entity_run_id=entity_run_id):
                yield from self._end_step(f"delegate:{entity}:{entity_run_id}")
            case EntityChunk(entity=entity, entity_run_id=entity_run_id, delta=delta):
                self._chunked.add(entity_run_id)
                yield _entity_text(entity, entity_run_id, delta)
            case EntityText(entity=entity, entity_run_id=entity_run_id, text=text):
                if entity_run_id not in self._chunked:  # read back: no chunks
                    yield _entity_text(entity, entity_run_id, text)
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
                yield from self._end_messages()
                yield {"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name}
                yield {
                    "type": "TOOL_CALL_ARGS",
                    "toolCallId": call_id,
                    "delta": json.dumps(arguments),
                }
                yield {"type": "TOOL_CALL_END", "toolCallId": call_id}
            case ToolResult(seq=seq, call_id=call_id, result=result):
                yield {
                    "type": "TOOL_CALL_RESULT",
                    "messageId": f"result_{self.run_id}_{seq}",
                    "toolCallId": call_id,
                    "content": result if isinstance(result, str) else json.dumps(result),
                    "role": "tool",
                }
            case ApprovalRequested(call_id=call_id, tool_name=name, tool_input=arguments):
                self._asked.append(
                    {
                        "id": call_id,
                        "reason": APPROVAL,
                        "message": f"Approve the call to {name} with {json.dumps(arguments)}?",
                        "toolCallId": call_id,
                    }
                )
            case ContextHandlerCreated(call_id=call_id, context_handler_id=handler_id):
                yield {
                    "type": "CUSTOM",
                    "name": "context_handler",
                    "value": {
                        "toolCallId": call_id,
                        "contextHandlerId": handler_id,
                        "url": f"/api/context-handlers/{handler_id}",
                    },
                }
            case RunPaused():
                asked, self._asked = self._asked, []
                yield from self._finish({"type": "interrupt", "interrupts": asked})
            case RunCompleted(usage=usage):
                counted = {
                    "inputTokens": usage.input_tokens,
                    "outputTokens": usage.output_tokens,
                    "totalTokens": usage.total_tokens,
                }
                yield from self._finish({"type": "success"}, usage=[counted])
            case RunFailed(status="cancelled"):
                yield from self._finish({"type": "cancelled"})
            case RunFailed(status=status, message=message):
                yield from self._end_steps()
                yield {"type": "RUN_ERROR", "message": message, "code": status}

    def _start_step(self, name: str) -> Iterator[Frame]:
        yield from self._end_messages()
        self._steps.append(name)
        yield {"type": "STEP_STARTED", "stepName": name}

    def _end_step(self, name: str) -> Iterator[Frame]:
        yield from self._end_messages()
        if name in self._steps:
            self._steps.remove(name)
            yield {"type": "STEP_FINISHED", "stepName": name}

    def _end_steps(self) -> Iterator[Frame]:
        """Every step still going, innermost first: the run ends."""
        for name in reversed(list(self._steps)):
            yield from self._end_step(name)
        yield from self._end_messages()

    def _finish(self, outcome: Frame, **more: Any) -> Iterator[Frame]:
        yield from self._end_steps()
        yield {
            "type": "RUN_FINISHED",
            "threadId": self.thread_id,
            "runId": self.run_id,
            "outcome": outcome,
            **more,
        }

    def _grow(self, kind: str, seq: int, delta: str) -> Iterator[Frame | JSONText]:
        """A delta of the open message of ``kind``, which begins (named by the seq of its
        first event) if none is open. AG-UI refuses empty deltas."""
        if (message := self._open.get(kind)) is None:
            message_id = f"{kind}_{self.run_id}_{seq}"
            content = "REASONING_MESSAGE_CONTENT" if kind == "reasoning" else "TEXT_MESSAGE_CONTENT"
            deltas = Template({"type": content, "messageId": message_id, "delta": SLOT})
            message = self._open[kind] = OpenPart(message_id, deltas)
            if kind == "reasoning":
                yield {"type": "REASONING_START", "messageId": message_id}
                yield {
                    "type": "REASONING_MESSAGE_START",
                    "messageId": message_id,
                    "role": "reasoning",
                }
            else:
                yield {"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"}
        if delta:
            yield message.deltas.fill(delta)

    def _end(self, kind: str) -> Iterator[Frame]:
        if (message := self._open.pop(kind, None)) is None:
            return
        message_id = message.id
        if kind == "reasoning":
            yield {"type": "REASONING_MESSAGE_END", "messageId": message_id}
            yield {"type": "REASONING_END", "messageId": message_id}
        else:
            yield {"type": "TEXT_MESSAGE_END", "messageId": message_id}

    def _end_messages(self) -> Iterator[Frame]:
        yield from self._end("reasoning")
        yield from self._end("text")


def _entity_text(entity: str, entity_run_id: str, text: str) -> Frame:
    """Text of an agent the coordinator delegated to, which AG-UI has no event for."""
    return {
        "type": "CUSTOM",
        "name": "entity_text",
        "value": {"entity": entity, "entityRunId": entity_run_id, "delta": text},
    }
