"""OpenAI's wire formats as views of an agent run: chat completion chunks, and the
Responses API's events and response object.

The agent is the model (``model`` is its id) and its tools run on the server, so a client
sees what the run did, never a call to make itself. Text: every step's text streams as it
comes. In a chat completion it all goes into ``content`` (this format cannot take text
back), as on the native surface; in a response each step's text is a message item of its
own, so the preamble before tool calls is one message and the answer another. Tool calls
are ``mcp_call`` items, the Responses API's kind for a tool that a server ran (a
``function_call`` item asks the client to run the function); a call waiting for a person
is an ``mcp_approval_request`` item. A run read back from the store has no deltas: each
settled text comes as one delta.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentstream.events import (
    ApprovalRequested,
    Event,
    Reasoning,
    ReasoningDelta,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunStarted,
    Text,
    TextDelta,
    TextRetracted,
    ToolCall,
    ToolResult,
    Usage,
)
from agentstream.views.frames import SLOT, JSONText, Template

__all__ = [
    "NUMBERS_PER_EVENT",
    "SERVER_LABEL",
    "ChatCompletionChunks",
    "ResponseEvents",
    "awaiting_approval",
    "chat_completion",
    "chat_error",
    "chat_usage",
    "response_usage",
]

Frame = dict[str, Any]

SERVER_LABEL = "agentstream"
"""The ``server_label`` of the tool calls the agent made (``mcp_call`` items)."""


def chat_usage(usage: Usage) -> Frame:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }


def response_usage(usage: Usage) -> Frame:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def chat_error(message: str, code: str) -> Frame:
    """An error as OpenAI writes one, in a response body or as a stream's last frame (the
    official clients raise it)."""
    return {"error": {"message": message, "type": "server_error", "param": None, "code": code}}


@dataclass(slots=True)
class ChatCompletionChunks:
    """The ``chat.completion.chunk`` frames of a live agent run: the role first, then
    ``content`` and ``reasoning_content`` deltas, then ``finish_reason`` (and the usage,
    when asked for), or an error frame. A run that stops to wait for an approval ends with
    an error frame that says where to decide (this format has no way to ask)."""

    completion_id: str
    model: str
    created: int
    include_usage: bool = False
    _deltas: dict[str, Template] = field(init=False, repr=False, compare=False)
    """A token's chunk by the delta's key (``content``, ``reasoning_content``)."""

    def __post_init__(self) -> None:
        self._deltas = {
            key: Template(self._chunk({key: SLOT})) for key in ("content", "reasoning_content")
        }

    def __call__(self, event: Event) -> Iterable[Frame | JSONText]:
        if type(event) is TextDelta:  # most of the frames: returned, not generated
            return (self._deltas["content"].fill(event.separator + event.delta),)
        return self._frames(event)

    def _frames(self, event: Event) -> Iterator[Frame | JSONText]:
        match event:
            case RunStarted():
                yield self._chunk({"role": "assistant", "content": ""})
            case ReasoningDelta(delta=delta):
                yield self._deltas["reasoning_content"].fill(delta)
            case RunPaused(run_id=run_id, awaiting=awaiting):
                yield chat_error(awaiting_approval(run_id, awaiting), "approval_required")
            case RunCompleted(usage=usage):
                yield self._chunk({}, finish_reason="stop")
                if self.include_usage:
                    yield {**self._chunk(None), "usage": chat_usage(usage)}
            case RunFailed(status=status, message=message):
                yield chat_error(message, status)

    def _chunk(self, delta: Frame | None, finish_reason: str | None = None) -> Frame:
        chunk: Frame = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk


def awaiting_approval(run_id: str, call_ids: Sequence[str]) -> str:
    """Why a chat completion has no answer: the run waits for approvals (``RunPaused``)."""
    calls = ", ".join(call_ids)
    return (
        f"Run {run_id} waits for a person to approve tool calls ({calls}): decide at "
        f"POST /api/agents/runs/{run_id}/approve or /deny, then follow GET "
        f"/api/agents/runs/{run_id}/stream"
    )


def chat_completion(
    events: Sequence[Event], *, completion_id: str, model: str, created: int
) -> Frame:
    """The ``chat.completion`` of a run that completed: its answer (the final turn's text;
    a stream also shows the text before tool calls) and its reasoning."""
    last = events[-1]
    assert isinstance(last, RunCompleted)
    message: Frame = {"role": "assistant", "content": last.content, "refusal": None}
    if reasoning := "\n\n".join(e.text for e in events if isinstance(e, Reasoning)):
        message["reasoning_content"] = reasoning
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}],
        "usage": chat_usage(last.usage),
    }


ResponseStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled"]


@dataclass(slots=True)
class _Item:
    """An output item while it grows: its place, and the pieces of its text so far. Kept as
    pieces, joined once it is done: a string grown a token at a time is copied whole at
    every token, which made a long answer's stream slow down as it went."""

    index: int
    item: Frame
    pieces: list[str] = field(default_factory=list)
    deltas: Template | None = None
    """Its text's delta event, numbered and filled at each delta (a text item's)."""

    @property
    def text(self) -> str:
        return "".join(self.pieces)


NUMBERS_PER_EVENT = 8
"""The ``sequence_number``s a run event's frames take: ``(seq - 1) * 8`` and up. Numbers
come from the run's seq, not a count of frames, so a stream read back from the store,
where a settled text comes as one delta instead of many, numbers every frame of every
other event as the live stream did, and ``starting_after`` means the same in both. An
event other than the last makes at most six frames; the last may make more."""


@dataclass(slots=True)
class ResponseEvents:
    """The Responses API's events of an agent run, fed the run from its first event.
    ``response`` is the response object as it stands."""

    response: Frame
    _open: dict[tuple[str, str | int], _Item] = field(default_factory=dict)
    _number: int = 0
    """The ``sequence_number`` of the next frame."""
    _reasoned: set[int] = field(default_factory=set)
    """The steps whose reasoning is settled: reasoning a model goes on with after that is
    not stored, so a stream read back would not have it, and the live one leaves it out
    too (the items must be the same in both)."""

    @classmethod
    def begin(
        cls,
        response_id: str,
        *,
        model: str,
        created_at: float,
        background: bool = False,
        previous_response_id: str | None = None,
        instructions: str | None = None,
    ) -> ResponseEvents:
        """Before the run's first event: the response object as created."""
        return cls(
            {
                "id": response_id,
                "object": "response",
                "created_at": int(created_at),
                "status": "in_progress",
                "background": background,
                "error": None,
                "incomplete_details": None,
                "instructions": instructions,
                "metadata": {},
                "model": model,
                "output": [],
                "parallel_tool_calls": True,
                "previous_response_id": previous_response_id,
                "store": True,
                "temperature": None,
                "text": {"format": {"type": "text"}},
                "tool_choice": "auto",
                "tools": [],
                "top_p": None,
                "usage": None,
            }
        )

    def __call__(self, event: Event) -> Iterable[Frame | JSONText]:
        self._number = (event.seq - 1) * NUMBERS_PER_EVENT
        if type(event) is TextDelta and (growing := self._open.get(("message", event.step))):
            # A token of the open message, most of the frames: returned, not generated.
            return (self._delta(growing, event.delta),)
        return self._frames(event)

    def _frames(self, event: Event) -> Iterator[Frame | JSONText]:
        match event:
            case RunStarted():
                yield self._with_response("response.created")
                yield self._with_response("response.in_progress")
            case ReasoningDelta(step=step, delta=delta) if step not in self._reasoned:
                yield from self._grow_reasoning(step, delta)
            case Reasoning(step=step, text=text):
                if ("reasoning", step) not in self._open:  # read back: no deltas
                    yield from self._grow_reasoning(step, text)
                self._reasoned.add(step)
                yield from self._end_reasoning(step, "completed")
            case TextDelta(step=step, delta=delta):
                yield from self._grow_message(step, delta)
            case Text(step=step, text=text) | TextRetracted(step=step, text=text):
                if ("message", step) not in self._open:
                    if not text:
                        return
                    yield from self._grow_message(step, text)
                phase = "final_answer" if isinstance(event, Text) else "commentary"
                yield from self._end_message(step, "completed", phase)
            case ToolCall(call_id=call_id, tool_name=name, arguments=arguments):
                yield from self._call(call_id, name, json.dumps(arguments))
            case ToolResult(call_id=call_id, status=status, result=result):
                yield from self._call_result(call_id, status, result)
            case ApprovalRequested(call_id=call_id, tool_name=name, tool_input=arguments):
                item = {
                    "id": f"mcpr_{call_id}",
                    "type": "mcp_approval_request",
                    "server_label": SERVER_LABEL,
                    "name": name,
                    "arguments": json.dumps(arguments),
                }
                index = self._add(item)
                yield self._event("response.output_item.added", output_index=index, item=item)
                yield self._event("response.output_item.done", output_index=index, item=item)
            case RunCompleted(usage=usage):
                yield from self._end_all("completed")
                self.response["usage"] = response_usage(usage)
                yield self._with_response("response.completed", status="completed")
            case RunFailed(status=status, message=message):
                yield from self._end_all("incomplete")
                self.response["error"] = {"code": "server_error", "message": message}
                yield self._with_response(
                    "response.failed", status="cancelled" if status == "cancelled" else "failed"
                )

    def _event(self, kind: str, **fields: Any) -> Frame:
        self._number += 1
        return _numbered(kind, self._number - 1, **fields)

    def _delta(self, growing: _Item, delta: str) -> JSONText:
        """A text item's next delta event."""
        assert growing.deltas is not None, "a text item's"
        growing.pieces.append(delta)
        self._number += 1
        return growing.deltas.fill(self._number - 1, delta)

    def _with_response(self, kind: str, status: ResponseStatus | None = None) -> Frame:
        if status is not None:
            self.response["status"] = status
        snapshot = {**self.response, "output": [dict(item) for item in self.response["output"]]}
        return self._event(kind, response=snapshot)

    def _item_id(self, prefix: str) -> str:
        """The id of the next output item: the response's, and the item's place in it."""
        return f"{prefix}_{self.response['id'].removeprefix('run_')}_{len(self.response['output'])}"

    def _add(self, item: Frame) -> int:
        self.response["output"].append(item)
        return len(self.response["output"]) - 1

    def _open_item(self, key: tuple[str, str | int], item: Frame) -> tuple[_Item, Frame]:
        opened = self._open[key] = _Item(self._add(item), item)
        return opened, self._event(
            "response.output_item.added", output_index=opened.index, item=dict(item)
        )

    def _grow_reasoning(self, step: int, delta: str) -> Iterator[Frame | JSONText]:
        key = ("reasoning", step)
        if (growing := self._open.get(key)) is None:
            item = {"id": self._item_id("rs"), "type": "reasoning", "summary": []}
            growing, added = self._open_item(key, item)
            where = {"item_id": item["id"], "output_index": growing.index, "summary_index": 0}
            growing.deltas = Template(
                _numbered("response.reasoning_summary_text.delta", SLOT, **where, delta=SLOT)
            )
            yield added
            yield self._event(
                "response.reasoning_summary_part.added",
                **where,
                part={"type": "summary_text", "text": ""},
            )
        yield self._delta(growing, delta)

    def _end_reasoning(self, step: int, status: str) -> Iterator[Frame]:
        growing = self._open.pop(("reasoning", step))
        where = {"item_id": growing.item["id"], "output_index": growing.index, "summary_index": 0}
        text = growing.text
        part = {"type": "summary_text", "text": text}
        yield self._event("response.reasoning_summary_text.done", **where, text=text)
        yield self._event("response.reasoning_summary_part.done", **where, part=part)
        growing.item.update(summary=[part], status=status)
        yield self._event(
            "response.output_item.done", output_index=growing.index, item=dict(growing.item)
        )

    def _grow_message(self, step: int, delta: str) -> Iterator[Frame | JSONText]:
        key = ("message", step)
        if (growing := self._open.get(key)) is None:
            item = {
                "id": self._item_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            growing, added = self._open_item(key, item)
            where = {"item_id": item["id"], "output_index": growing.index, "content_index": 0}
            growing.deltas = Template(
                _numbered("response.output_text.delta", SLOT, **where, delta=SLOT, logprobs=[])
            )
            yield added
            yield self._event("response.content_part.added", **where, part=_output_text(""))
        yield self._delta(growing, delta)

    def _end_message(self, step: int, status: str, phase: str | None = None) -> Iterator[Frame]:
        """``phase``: ``commentary`` for the text before tool calls, ``final_answer`` for
        the answer (the Responses API's names)."""
        growing = self._open.pop(("message", step))
        where = {"item_id": growing.item["id"], "output_index": growing.index, "content_index": 0}
        text = growing.text
        part = _output_text(text)
        yield self._event("response.output_text.done", **where, text=text, logprobs=[])
        yield self._event("response.content_part.done", **where, part=part)
        growing.item.update(content=[part], status=status)
        if phase is not None:
            growing.item["phase"] = phase
        yield self._event(
            "response.output_item.done", output_index=growing.index, item=dict(growing.item)
        )

    def _call(self, call_id: str, name: str, arguments: str) -> Iterator[Frame]:
        item = {
            "id": f"mcp_{call_id}",
            "type": "mcp_call",
            "server_label": SERVER_LABEL,
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        growing, added = self._open_item(("call", call_id), item)
        where = {"item_id": item["id"], "output_index": growing.index}
        yield added
        yield self._event("response.mcp_call_arguments.delta", **where, delta=arguments)
        yield self._event("response.mcp_call_arguments.done", **where, arguments=arguments)
        item["arguments"] = arguments
        yield self._event("response.mcp_call.in_progress", **where)

    def _call_result(self, call_id: str, status: str, result: Any) -> Iterator[Frame]:
        growing = self._open.pop(("call", call_id))
        item, where = growing.item, {"item_id": growing.item["id"], "output_index": growing.index}
        if status == "success":
            item.update(status="completed", output=json.dumps(result))
            yield self._event("response.mcp_call.completed", **where)
        else:
            error = result if isinstance(result, str) else f"The call was {status}"
            item.update(
                status="failed", error={"type": "mcp_tool_execution_error", "content": error}
            )
            yield self._event("response.mcp_call.failed", **where)
        yield self._event("response.output_item.done", output_index=growing.index, item=dict(item))

    def _end_all(self, status: str) -> Iterator[Frame]:
        """Items still open when the run ends, ended as they stand: a failed run's, or
        reasoning that went on after its step's was settled."""
        for kind, key in list(self._open):
            if kind == "reasoning":
                yield from self._end_reasoning(int(key), status)
            elif kind == "message":
                yield from self._end_message(int(key), status)
            else:
                yield from self._call_result(str(key), "cancelled", None)


def _output_text(text: str) -> Frame:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _numbered(kind: str, number: int | str, **fields: Any) -> Frame:
    """A Responses API event: its type, its ``sequence_number`` (or ``SLOT``), its fields."""
    return {"type": kind, "sequence_number": number, **fields}
