"""A local OpenAI API: replays canned Chat Completions and Responses streams in their documented
SSE formats and records each request body, so tests can assert what the adapters sent.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fakes.server import CannedStream, run_app

__all__ = [
    "FakeOpenAI",
    "Reply",
    "StreamedItem",
    "chat_call_arguments",
    "chat_call_start",
    "chat_chunk",
    "chat_stream",
    "chat_text",
    "chat_usage",
    "function_call_item",
    "http_error",
    "message_item",
    "raw_stream",
    "reasoning_item",
    "response_object",
    "responses_reply",
    "responses_stream",
]


@dataclass(frozen=True, slots=True)
class Reply:
    """One canned HTTP answer: status, headers and the body's chunks, sent in order."""

    status: int = 200
    chunks: tuple[bytes, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    stalls: bool = False
    """After the chunks, send nothing more and never end: the client must time out."""


def raw_stream(*chunks: bytes) -> Reply:
    """An event stream of exactly these bytes (for truncated or malformed streams)."""
    return Reply(chunks=chunks, headers={"content-type": "text/event-stream"})


def chat_chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk``: one choice with ``delta``, or none (the usage chunk)."""
    choices = (
        [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    )
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "gpt-fake",
        "system_fingerprint": "fp_fake",
        "choices": choices,
        "usage": usage,
    }


def chat_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The usage of the last chunk, with the details OpenAI reports."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def chat_stream(*chunks: dict[str, Any], done: bool = True) -> Reply:
    """Chat Completions streaming: ``data: {chunk}`` events, then ``data: [DONE]``."""
    body = [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks]
    return raw_stream(*body, *([b"data: [DONE]\n\n"] if done else []))


def chat_text(*pieces: str, usage: tuple[int, int] = (12, 3)) -> Reply:
    """A whole text answer: the role, the text in these pieces, ``stop``, then usage."""
    return chat_stream(
        chat_chunk({"role": "assistant", "content": "", "refusal": None}),
        *(chat_chunk({"content": piece}) for piece in pieces),
        chat_chunk({}, finish_reason="stop"),
        chat_chunk(usage=chat_usage(*usage)),
    )


def chat_call_start(index: int, call_id: str, name: str) -> dict[str, Any]:
    """The delta that starts a tool call: its index, id and name, no arguments yet."""
    function = {"name": name, "arguments": ""}
    call = {"index": index, "id": call_id, "type": "function", "function": function}
    return {"tool_calls": [call]}


def chat_call_arguments(index: int, piece: str) -> dict[str, Any]:
    """A delta with the next piece of a tool call's arguments."""
    return {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}


def responses_stream(*events: dict[str, Any]) -> Reply:
    """Responses streaming: typed ``event:`` + ``data:`` pairs, numbered in order."""
    body = [
        f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': n})}\n\n".encode()
        for n, event in enumerate(events)
    ]
    return raw_stream(*body)


@dataclass(frozen=True, slots=True)
class StreamedItem:
    """One output item of a response: the events that stream it, and the item when done."""

    events: list[dict[str, Any]]
    item: dict[str, Any]


def reasoning_item(item_id: str, *summaries: list[str], encrypted: str) -> StreamedItem:
    """A reasoning item whose summary parts stream in the given pieces."""
    item = {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "".join(s)} for s in summaries],
        "encrypted_content": encrypted,
    }
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "item": {**item, "summary": []}}
    ]
    for index, pieces in enumerate(summaries):
        part = {"item_id": item_id, "summary_index": index}
        text = "".join(pieces)
        events += [
            {"type": "response.reasoning_summary_part.added", **part, "part": _summary("")},
            *(
                {"type": "response.reasoning_summary_text.delta", **part, "delta": piece}
                for piece in pieces
            ),
            {"type": "response.reasoning_summary_text.done", **part, "text": text},
            {"type": "response.reasoning_summary_part.done", **part, "part": _summary(text)},
        ]
    events.append({"type": "response.output_item.done", "item": item})
    return StreamedItem(events, item)


def message_item(item_id: str, *pieces: str) -> StreamedItem:
    """An assistant message whose text streams in the given pieces."""
    text = "".join(pieces)
    item = {
        "id": item_id,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }
    part = {"item_id": item_id, "content_index": 0}
    empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return StreamedItem(
        [
            {
                "type": "response.output_item.added",
                "item": {**item, "status": "in_progress", "content": []},
            },
            {"type": "response.content_part.added", **part, "part": empty},
            *(
                {"type": "response.output_text.delta", **part, "delta": piece, "logprobs": []}
                for piece in pieces
            ),
            {"type": "response.output_text.done", **part, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **part, "part": item["content"][0]},
            {"type": "response.output_item.done", "item": item},
        ],
        item,
    )


def function_call_item(item_id: str, call_id: str, name: str, *pieces: str) -> StreamedItem:
    """A function call whose JSON arguments stream in the given pieces."""
    arguments = "".join(pieces)
    item = {
        "id": item_id,
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    return StreamedItem(
        [
            {
                "type": "response.output_item.added",
                "item": {**item, "status": "in_progress", "arguments": ""},
            },
            *(
                {"type": "response.function_call_arguments.delta", "item_id": item_id, "delta": p}
                for p in pieces
            ),
            {
                "type": "response.function_call_arguments.done",
                "item_id": item_id,
                "name": name,
                "arguments": arguments,
            },
            {"type": "response.output_item.done", "item": item},
        ],
        item,
    )


def response_object(
    status: str = "in_progress",
    output: list[dict[str, Any]] | None = None,
    usage: tuple[int, int, int] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A ``response`` object; ``usage`` is (input, output, of which reasoning) tokens."""
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "model": "o-fake",
        "output": output or [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "usage": None if usage is None else _usage(*usage),
        **fields,
    }


def responses_reply(
    *outputs: StreamedItem, usage: tuple[int, int, int] = (20, 10, 0), end: str | None = "completed"
) -> Reply:
    """A whole Responses stream: created, the outputs' events, then ``response.<end>``
    (``None``: the stream stops before its final event)."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_object()},
        {"type": "response.in_progress", "response": response_object()},
    ]
    for index, output in enumerate(outputs):
        events += [{**event, "output_index": index} for event in output.events]
    if end is not None:
        items = [output.item for output in outputs]
        events.append({"type": f"response.{end}", "response": response_object(end, items, usage)})
    return responses_stream(*events)


def http_error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """An API error: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return Reply(
        status=status,
        chunks=(json.dumps(body).encode(),),
        headers={"content-type": "application/json", **(headers or {})},
    )


class FakeOpenAI:
    """Answers ``/v1/chat/completions`` and ``/v1/responses`` with the next reply of a script."""

    def __init__(self, *script: Reply) -> None:
        self.script = deque(script)
        self.received: list[tuple[str, dict[str, Any]]] = []
        """(path, JSON body) of each request, in order."""
        self.base_url = ""
        """Where the API is served (``http://127.0.0.1:<port>/v1``), once ``serve`` runs."""
        self.disconnected = threading.Event()
        """Set when a client hung up on a stalled reply."""
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._answer, methods=["POST"]),
                Route("/v1/responses", self._answer, methods=["POST"]),
            ]
        )

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, body in self.received]

    async def _answer(self, request: Request) -> Response:
        self.received.append((request.url.path, await request.json()))
        reply = self.script.popleft()
        return CannedStream(
            reply.chunks,
            ending="hold" if reply.stalls else "complete",
            disconnected=self.disconnected,
            status_code=reply.status,
            headers=reply.headers,
        )

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on an ephemeral port until the block ends; yields the base URL (``.../v1``)."""
        with run_app(self.app, name="The fake OpenAI server") as url:
            self.base_url = f"{url}/v1"
            yield self.base_url


def _summary(text: str) -> dict[str, str]:
    return {"type": "summary_text", "text": text}


def _usage(input_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }
