"""A fake Anthropic Messages API (``POST /v1/messages``) on a real port: it answers each request
with the next canned reply, in the documented SSE format (``event: <type>``/``data: <json>``),
and records the request bodies so tests can assert what was sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fakes.server import CannedStream, Ending, run_app

__all__ = [
    "FakeAnthropic",
    "Reply",
    "error_reply",
    "frame",
    "message_start",
    "redacted_thinking_block",
    "run_fake",
    "text_block",
    "thinking_block",
    "tool_use_block",
    "turn",
]


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One canned HTTP response."""

    status: int = 200
    frames: Sequence[str] = ()
    """The SSE body of a 200 reply, frame by frame (each sent as its own chunk)."""
    error: Mapping[str, Any] | None = None
    """The JSON body of an error reply."""
    headers: Mapping[str, str] = field(default_factory=dict)
    ending: Ending = "complete"
    """complete: end the body normally; cut: drop the connection mid-body; hold: send nothing
    more until the client disconnects."""


def frame(event: str, data: Mapping[str, Any] | str) -> str:
    """One server-sent event; ``data`` as given if it is already text (e.g. malformed JSON)."""
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"event: {event}\ndata: {payload}\n\n"


def _event(data: Mapping[str, Any]) -> str:
    return frame(data["type"], data)


def message_start(input_tokens: int = 12, **cache_tokens: int) -> list[str]:
    """``message_start`` (then a ``ping``, as the API sends); ``cache_tokens`` such as
    ``cache_read_input_tokens=100`` join the usage."""
    message: dict[str, Any] = {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude-sonnet-4-5",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1, **cache_tokens},
    }
    return [_event({"type": "message_start", "message": message}), _event({"type": "ping"})]


def _block(index: int, block: Mapping[str, Any], deltas: Sequence[Mapping[str, Any]]) -> list[str]:
    return [
        _event({"type": "content_block_start", "index": index, "content_block": block}),
        *(_event({"type": "content_block_delta", "index": index, "delta": d}) for d in deltas),
        _event({"type": "content_block_stop", "index": index}),
    ]


def text_block(index: int, *pieces: str) -> list[str]:
    return _block(
        index, {"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in pieces]
    )


def thinking_block(index: int, *pieces: str, signature: str) -> list[str]:
    """Thinking deltas, then the signature in a ``signature_delta`` just before the stop."""
    deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces]
    deltas.append({"type": "signature_delta", "signature": signature})
    return _block(index, {"type": "thinking", "thinking": "", "signature": ""}, deltas)


def redacted_thinking_block(index: int, data: str) -> list[str]:
    return _block(index, {"type": "redacted_thinking", "data": data}, [])


def tool_use_block(index: int, call_id: str, name: str, *pieces: str) -> list[str]:
    """A tool call whose input JSON arrives in ``pieces`` (the API starts with an empty one)."""
    deltas = [{"type": "input_json_delta", "partial_json": p} for p in ("", *pieces)]
    return _block(index, {"type": "tool_use", "id": call_id, "name": name, "input": {}}, deltas)


def turn(
    *blocks: list[str],
    stop_reason: str = "end_turn",
    input_tokens: int = 12,
    output_tokens: int = 9,
    **cache_tokens: int,
) -> Reply:
    """A whole streamed message: start, the content blocks, the stop reason and usage, stop."""
    end = [
        _event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            }
        ),
        _event({"type": "message_stop"}),
    ]
    start = message_start(input_tokens, **cache_tokens)
    return Reply(frames=[*start, *(f for b in blocks for f in b), *end])


def error_reply(
    status: int, error_type: str, message: str, headers: Mapping[str, str] | None = None
) -> Reply:
    """An HTTP error with the API's error body."""
    body = {"type": "error", "error": {"type": error_type, "message": message}}
    return Reply(status=status, error=body, headers=headers or {})


class FakeAnthropic:
    """The fake API's state: the replies still to give and the request bodies received."""

    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.disconnected = threading.Event()
        """Set when a client hung up on a ``hold`` reply."""
        self.url = ""
        self.app = Starlette(routes=[Route("/v1/messages", self._messages, methods=["POST"])])

    async def _messages(self, request: Request) -> Response:
        self.requests.append(await request.json())
        if not self.replies:
            return JSONResponse(
                {"type": "error", "error": {"type": "api_error", "message": "fake: no reply left"}},
                status_code=500,
            )
        reply = self.replies.pop(0)
        if reply.status != 200:
            return JSONResponse(reply.error, status_code=reply.status, headers=dict(reply.headers))
        return CannedStream(
            (piece.encode() for piece in reply.frames),
            ending=reply.ending,
            disconnected=self.disconnected,
            headers=reply.headers,
            media_type="text/event-stream",
        )


@contextmanager
def run_fake(*replies: Reply) -> Iterator[FakeAnthropic]:
    """Serve a fake with these replies on 127.0.0.1 until the block ends."""
    fake = FakeAnthropic(replies)
    with run_app(
        fake.app, name="The fake Anthropic API", log_level="critical", timeout_graceful_shutdown=5
    ) as url:
        fake.url = url
        yield fake
