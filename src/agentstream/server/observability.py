"""The server's side of observability: a request id for every request, and ``/metrics``.

``RequestIdMiddleware`` is pure ASGI (no task or queue per message, unlike
``BaseHTTPMiddleware``): it takes the client's ``X-Request-Id`` if it is a sensible one,
else makes one, sends it back on the response, and sets it for the request's log lines
(and those of the runs the request starts, whose tasks inherit it, and of its stream's
body, which ``server.streaming.StreamsOutside`` sends in the context it started in).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable

from fastapi import FastAPI
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentstream import telemetry
from agentstream.config import Settings
from agentstream.telemetry import logs, metrics

__all__ = ["REQUEST_ID", "RequestIdMiddleware", "install_observability"]

REQUEST_ID = "X-Request-Id"

_ACCEPTED = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,128}")
"""A request id from the client is kept if it is this: what a proxy or a client makes (a
UUID, a trace id), never something that could break a log line."""


def install_observability(app: FastAPI, settings: Settings) -> None:
    """Request ids on every request, ``/metrics`` unless turned off, and tracing if on."""
    app.add_middleware(RequestIdMiddleware)
    if settings.metrics:
        app.add_api_route("/metrics", _metrics, methods=["GET"], include_in_schema=False)
    if settings.tracing != "off":
        telemetry.use_tracing(settings.tracing)


async def _metrics() -> Response:
    """The Prometheus text format; no authentication (``AGENTSTREAM_METRICS``)."""
    return Response(metrics.render(), media_type=metrics.CONTENT_TYPE_LATEST)


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")
        request_id = given.decode() if _ACCEPTED.fullmatch(given) else secrets.token_hex(16)
        header = (b"x-request-id", request_id.encode())

        def send_with_id(message: Message) -> Awaitable[None]:
            # Not a coroutine of its own: a frame costs one call, not one more coroutine.
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            return send(message)

        token = logs.request_id.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            logs.request_id.reset(token)
