"""A fake Gemini API (``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``) on a real
port: it answers each request with the next canned reply in the documented SSE format (one
``data: <GenerateContentResponse JSON>`` per event, camelCase fields) and records the requests.
"""

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
    "FakeGemini",
    "Received",
    "Reply",
    "chunk",
    "error_body",
    "error_reply",
    "function_call",
    "run_fake",
    "text",
    "thought",
    "usage",
]


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One canned HTTP response."""

    status: int = 200
    events: Sequence[Mapping[str, Any] | str] = ()
    """The events of a 200 reply: chunks sent as JSON, or text sent as is (e.g. broken JSON)."""
    error: Mapping[str, Any] | None = None
    """The JSON body of an error reply."""
    headers: Mapping[str, str] = field(default_factory=dict)
    ending: Ending = "complete"
    """complete: end the body normally; cut: drop the connection mid-body; hold: send nothing
    more until the client disconnects."""


@dataclass(frozen=True)
class Received:
    """A request the fake got: the model in its path, and its JSON body."""

    model: str
    body: dict[str, Any]


def text(value: str, *, signature: str | None = None) -> dict[str, Any]:
    return _signed({"text": value}, signature)


def thought(value: str, *, signature: str | None = None) -> dict[str, Any]:
    """A thought summary part (sent when the request asks for ``includeThoughts``)."""
    return _signed({"text": value, "thought": True}, signature)


def function_call(
    name: str, args: Mapping[str, Any], *, call_id: str | None = None, signature: str | None = None
) -> dict[str, Any]:
    """A whole function call part; Gemini sends no ``id`` unless it has one."""
    call: dict[str, Any] = {"name": name, "args": dict(args)}
    if call_id is not None:
        call["id"] = call_id
    return _signed({"functionCall": call}, signature)


def _signed(part: dict[str, Any], signature: str | None) -> dict[str, Any]:
    return part if signature is None else {**part, "thoughtSignature": signature}


def usage(prompt: int, candidates: int, thoughts: int = 0) -> dict[str, Any]:
    counts = {"promptTokenCount": prompt, "candidatesTokenCount": candidates}
    if thoughts:
        counts["thoughtsTokenCount"] = thoughts
    return {**counts, "totalTokenCount": prompt + candidates + thoughts}


def chunk(
    *parts: Mapping[str, Any],
    finish: str | None = None,
    usage_metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``GenerateContentResponse`` of the stream: the parts generated since the last one,
    and on the last chunk the finish reason and the usage."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    response: dict[str, Any] = {
        "candidates": [candidate],
        "modelVersion": "gemini-2.5-flash",
        "responseId": "mF3vaKXHC9-vz7IPp9iJ4Ag",
    }
    if usage_metadata is not None:
        response["usageMetadata"] = dict(usage_metadata)
    return response


def error_body(code: int, status: str, message: str, *details: Any) -> dict[str, Any]:
    """The API's error body (google.rpc.Status), as an HTTP error body or a mid-stream event."""
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = list(details)
    return {"error": error}


def error_reply(
    code: int, status: str, message: str, *details: Any, headers: Mapping[str, str] | None = None
) -> Reply:
    return Reply(
        status=code, error=error_body(code, status, message, *details), headers=headers or {}
    )


class FakeGemini:
    """The fake API's state: the replies still to give and the requests received."""

    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[Received] = []
        self.disconnected = threading.Event()
        """Set when a client hung up on a ``hold`` reply."""
        self.url = ""
        route = Route(
            "/v1beta/models/{model}:streamGenerateContent", self._stream, methods=["POST"]
        )
        self.app = Starlette(routes=[route])

    async def _stream(self, request: Request) -> Response:
        if request.query_params.get("alt") != "sse":
            return JSONResponse(error_body(400, "INVALID_ARGUMENT", "fake: alt=sse only"), 400)
        self.requests.append(Received(request.path_params["model"], await request.json()))
        if not self.replies:
            return JSONResponse(error_body(500, "INTERNAL", "fake: no reply left"), 500)
        reply = self.replies.pop(0)
        if reply.status != 200:
            return JSONResponse(reply.error, status_code=reply.status, headers=dict(reply.headers))
        data = [e if isinstance(e, str) else json.dumps(e) for e in reply.events]
        return CannedStream(
            (f"data: {d}\r\n\r\n".encode() for d in data),
            ending=reply.ending,
            disconnected=self.disconnected,
            headers=reply.headers,
            media_type="text/event-stream",
        )


@contextmanager
def run_fake(*replies: Reply) -> Iterator[FakeGemini]:
    """Serve a fake with these replies on 127.0.0.1 until the block ends."""
    fake = FakeGemini(replies)
    with run_app(
        fake.app, name="The fake Gemini API", log_level="critical", timeout_graceful_shutdown=5
    ) as url:
        fake.url = url
        yield fake
