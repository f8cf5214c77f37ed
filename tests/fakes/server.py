"""What the fakes and the live-server fixtures share: uvicorn serving an app on an ephemeral
port in a thread, and a response that streams canned chunks then ends one of three ways."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Literal

import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["CannedStream", "Ending", "run_app"]

Ending = Literal["complete", "cut", "hold"]
"""complete: end the body normally; cut: drop the connection mid-body; hold: send nothing more
until the client disconnects."""


@contextmanager
def run_app(
    app: ASGIApp,
    *,
    name: str,
    log_level: str = "warning",
    lifespan: Literal["auto", "on", "off"] = "off",
    timeout_graceful_shutdown: int | None = None,
) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1, on a port the OS picks, in a daemon thread until the block
    ends; yields the base URL (``http://127.0.0.1:<port>``). ``name`` is what failed to start,
    in the error if the server does not come up within 10 s."""
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level=log_level,
            lifespan=lifespan,
            timeout_graceful_shutdown=timeout_graceful_shutdown,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


class CannedStream(Response):
    """Sends the status and headers, then each chunk as its own piece of the body, then ends
    the way ``ending`` says; ``disconnected`` is set when a client hangs up on a ``hold``."""

    def __init__(
        self,
        chunks: Iterable[bytes],
        *,
        ending: Ending,
        disconnected: threading.Event,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        super().__init__(status_code=status_code, headers=headers, media_type=media_type)
        # Streamed, so without the "content-length: 0" Response sets for an empty body.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.chunks = list(chunks)
        self.ending = ending
        self.disconnected = disconnected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if self.ending == "complete":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif self.ending == "hold":
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
        # "cut": returning mid-body makes uvicorn drop the connection (and log an error, so
        # apps that cut run with log_level "critical").
