"""An SSE response that streams, keeps alive and notices disconnects, whichever comes first;
and the ASGI layer that streams it from outside the app's middleware.

Starlette's StreamingResponse cannot send a keepalive while its iterator waits, nor tell
us the client left; this response can. Headers follow what proxies need to not buffer.
"""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Awaitable, Callable, Generator, Mapping
from contextvars import Context, copy_context
from typing import Any, Protocol, TypeVar

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agentstream import sse
from agentstream.telemetry.metrics import LIVE_STREAMS

__all__ = ["SENDS_IN_ANY_TASK", "SSE_HEADERS", "EventStreamResponse", "Frames", "StreamsOutside"]

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
}

B = TypeVar("B")

_KEEPALIVE = sse.comment("keepalive").encode()

_RAW_SSE_HEADERS = tuple(Headers(SSE_HEADERS).raw)
_CONTENT_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")

SENDS_IN_ANY_TASK: tuple[str, ...] = ("uvicorn.protocols.http.",)
"""The modules of the servers' ``send`` functions that wait on nothing bound to the task
they run in (uvicorn's waits only for its flow control's drain, an ``asyncio.Event``): a
frame's send may start in the run's task and, where the client is slow, be finished in the
response's. Frames are written through only to those."""

_OUTSIDE = "agentstream.streams_outside"
"""The scope's key under which ``StreamsOutside`` takes the streams a request answers with,
each with the context it started in."""


class Frames(Protocol[B]):
    """A stream's frames as they come: each batch ``next_batch`` waits for, written by
    ``encode``, until ``over``; ``close`` once the response is over, however it ended. The
    response awaits ``next_batch`` itself (a subscription's own method, or that method with
    its ``take``): no coroutine of a wrapper that waits, then writes."""

    over: bool

    def next_batch(self) -> Awaitable[B]: ...

    def encode(self, batch: B) -> bytes: ...

    def write_through(self, write: Callable[[bytes], bool]) -> None:
        """From now on, frames may go out as they come, while the response waits for
        ``next_batch``, in the task that makes them, by ``write``: True if the chunk went out
        whole; else the response finishes sending it before anything else (and the batch it
        wakes to must not hold the chunk's frames again)."""
        ...

    def close(self) -> None: ...


class EventStreamResponse(Response):
    """Send ``first``, then what ``frames`` write until they are over.

    Beside the stream, one task watches the client: it sends a keepalive comment once the
    stream has been silent for ``keepalive`` seconds, and on the client's disconnect it
    cancels the stream and calls ``on_disconnect``. Once the response is over, however it
    ended, the frames are closed and ``on_end`` is called. Plain asyncio tasks: a task
    group per response costs a live stream several tasks' worth of memory. ``headers``
    come beside ``SSE_HEADERS``.
    """

    def __init__(
        self,
        frames: Frames[Any] | None,
        *,
        first: bytes = b"",
        keepalive: float,
        on_disconnect: Callable[[], object] | None = None,
        on_end: Callable[[], object] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._frames = frames
        self._first = first
        self._keepalive = keepalive
        self._on_disconnect = on_disconnect
        self._on_end = on_end
        self._last_sent = 0.0
        self._send: Send | None = None
        """The server's ``send``, where frames are written through to it."""
        self._unfinished: tuple[Generator[Any, Any, None], object] | Exception | None = None
        """A frame written through whose send did not finish in the run's task: the send and
        what it waits on, or what it raised."""
        self.status_code = 200
        self.background = None
        self.raw_headers = [  # the shared pairs, not a copy of each a live stream: 400 bytes
            *_RAW_SSE_HEADERS,
            *(Headers(headers).raw if headers else ()),
            _CONTENT_TYPE,
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Start the response here, within the middleware (which adds its headers, and logs
        the access line in the request's context); the body goes out from
        ``StreamsOutside`` if the app runs within it, else from here."""
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        except BaseException:
            self._ended()
            raise
        outside: list[tuple[EventStreamResponse, Context]] | None = scope.get(_OUTSIDE)
        if outside is None:
            await self.send_body(receive, send)
        else:
            outside.append((self, copy_context()))

    async def send_body(self, receive: Receive, send: Send) -> None:
        LIVE_STREAMS.inc()
        try:
            self._last_sent = time.monotonic()
            streaming = asyncio.current_task()
            assert streaming is not None
            client_left = False

            def leave() -> None:
                """The client disconnected: stop the stream where it waits, if it still does."""
                nonlocal client_left
                if not over:
                    client_left = True
                    streaming.cancel()

            over = False
            frames = self._frames
            if frames is not None and _sends_in_any_task(send):
                self._send = send
                frames.write_through(self._write_now)
            watcher = asyncio.create_task(self._watch(receive, send, leave))
            try:
                chunk, self._first = self._first, b""
                while True:
                    if self._unfinished is not None:
                        await self._finish()
                    if chunk:
                        self._last_sent = time.monotonic()
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        chunk = b""  # not kept while the next batch comes (a replay, maybe)
                    if frames is None or frames.over:
                        break
                    chunk = frames.encode(await frames.next_batch())
            except asyncio.CancelledError:
                if not client_left or streaming.uncancel():  # also cancelled from outside
                    raise
                if self._on_disconnect is not None:
                    self._on_disconnect()
                return
            finally:
                over = True
                watcher.cancel()
                if isinstance(self._unfinished, tuple):  # cancelled before it finished
                    self._unfinished[0].close()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            LIVE_STREAMS.dec()
            self._send = self._unfinished = None  # cycles through the frames (``_take``)
            self._ended()

    def _write_now(self, chunk: bytes) -> bool:
        """``chunk``'s send started in the task at hand (the run's, which appended its
        event): True once it went out; False where the send has to wait (the client is
        slow: flow control) or failed, for ``_finish`` in the response's task. A paced token
        then wakes one task, not two: the second was the most a token's frame cost."""
        assert self._send is not None
        self._last_sent = time.monotonic()
        try:
            message = {"type": "http.response.body", "body": chunk, "more_body": True}
            sending = self._send(message).__await__()
            # Stepped by ``for``, a send that goes out at once ends the loop; by ``send``, it
            # raised a StopIteration, made and caught: 1,300 of a paced token's instructions.
            for waiting_on in sending:
                self._unfinished = (sending, waiting_on)
                return False
        except Exception as error:  # raised in the response's task, not in the run's
            self._unfinished = error
            return False
        return True

    async def _finish(self) -> None:
        """Finish the send a frame written through started, before anything else is sent."""
        unfinished, self._unfinished = self._unfinished, None
        if isinstance(unfinished, Exception):
            raise unfinished
        assert unfinished is not None
        await _go_on(*unfinished)

    def abandon(self) -> None:
        """The body will not be sent (the app failed after the start): as if the client had
        left."""
        if self._on_disconnect is not None:
            self._on_disconnect()
        self._ended()

    def _ended(self) -> None:
        if self._frames is not None:
            self._frames.close()
        if self._on_end is not None:
            self._on_end()

    async def _watch(self, receive: Receive, send: Send, leave: Callable[[], None]) -> None:
        """Keepalives while the stream is silent, until the client disconnects: then
        ``leave``. One timer for the whole stream, not one per frame: frames are the hot
        path."""
        while True:
            silent_for = time.monotonic() - self._last_sent
            if silent_for >= self._keepalive:
                self._last_sent = time.monotonic()
                await send({"type": "http.response.body", "body": _KEEPALIVE, "more_body": True})
                silent_for = 0.0
            try:
                async with asyncio.timeout(self._keepalive - silent_for):
                    message = await receive()
            except TimeoutError:
                continue
            if message["type"] == "http.disconnect":
                leave()
                return


def _sends_in_any_task(send: Send) -> bool:
    """``send`` is a server's that ``SENDS_IN_ANY_TASK`` names."""
    return (getattr(send, "__module__", None) or "").startswith(SENDS_IN_ANY_TASK)


@types.coroutine
def _go_on(sending: Generator[Any, Any, None], waiting_on: object) -> Generator[Any, Any, None]:
    """Finish ``sending``, an awaitable's steps that another task started and that wait on
    ``waiting_on``: what ``await`` would have gone on doing in that task (a cancel is thrown
    into it)."""
    while True:
        try:
            sent = yield waiting_on
        except BaseException as error:
            try:
                waiting_on = sending.throw(error)
            except StopIteration:
                return
        else:
            try:
                waiting_on = sending.send(sent)
            except StopIteration:
                return


class StreamsOutside:
    """The outermost ASGI layer of the app: a request answered with an
    ``EventStreamResponse`` returns through the middleware and routing once the response
    has started, and its body is sent from here, to the server's own ``send``, in the
    context the response started in (the request's log fields). A live stream then keeps
    none of the stack's coroutines, exit stacks and closures alive, and its frames skip
    the middleware's ``send`` wrappers, which only look at a response's start.

    So the stack must be done with a stream once it has started: middleware that changes
    or ends a body would break it (``BaseHTTPMiddleware`` ends its response when the stack
    returns: the app is served without this layer if one was added), and FastAPI closes
    ``yield`` dependencies before the body (no stream route has one). Compressing an event
    stream would hold its frames back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        streams: list[tuple[EventStreamResponse, Context]] = []
        try:
            # A copy: what the stack keeps in it (exit stacks, the route, the request's
            # state) goes with the stack, not with the connection, which keeps its scope.
            await self.app({**scope, _OUTSIDE: streams}, receive, send)
        except BaseException:
            for response, _ in streams:
                response.abandon()
            raise
        for response, context in streams:  # one at most
            restored = [(var, var.set(value)) for var, value in context.items()]
            try:
                await response.send_body(receive, send)
            finally:
                for var, token in reversed(restored):
                    var.reset(token)
