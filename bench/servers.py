"""Benchmark servers, each in its own process: ``python -m bench.servers KIND PORT ...``.

- ``agentstream PORT DATA_DIR``: the real app, demo agent, unpaced offline model.
- ``baseline PORT FRAMES_FILE``: a bare Starlette StreamingResponse yielding the given
  pre-encoded SSE frames one by one, which is what a hand-rolled endpoint would do.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from agentstream.config import Settings
from agentstream.server import create_app


def baseline_app(frames: list[bytes]) -> Starlette:
    async def stream(_request: Request) -> StreamingResponse:
        async def frames_() -> AsyncIterator[bytes]:
            for frame in frames:
                yield frame

        return StreamingResponse(frames_(), media_type="text/event-stream")

    return Starlette(routes=[Route("/stream", stream, methods=["POST"])])


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "agentstream":
        settings = Settings(data_dir=Path(sys.argv[3]), demo=True, offline_token_delay=0.0)
        app = create_app(settings)
    else:
        raw = Path(sys.argv[3]).read_bytes()
        app = baseline_app([frame + b"\n\n" for frame in raw.split(b"\n\n") if frame])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
