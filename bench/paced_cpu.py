"""The CPU of a paced token inside one process, without sockets: ``python -m bench.paced_cpu
[STREAMS] [ROUNDS]``.

Scenario 2's load (``STREAMS`` streams at 30 tokens/s) driven straight through each app's
ASGI interface, in this process, on uvloop: each stream's ``send`` only counts frames. With
no sockets, no load generator and no second process, what is left is what the app itself
spends per token, and it moves less from run to run than scenario 2's server CPU does.
Each round runs every variant once, in a fresh process; the table gives the median:

- ``baseline``: the bare Starlette response of scenario 2 (``bench.servers``);
- ``agentstream``: the real app, the ``words`` agent's native stream;
- ``agentstream, no frames``: the same with the view and the encoder replaced by one
  constant frame per event: what turning events into SSE text costs;
- ``agentstream, no live log``: the same with the run's tokens dropped at the live log
  (counted there, never read): what the log, the response's task and its frames cost.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bench.concurrency import RATE
from bench.tables import text_table

VARIANTS = ("baseline", "agentstream", "agentstream, no frames", "agentstream, no live log")
CLUSTER_VARIANTS = (
    "agentstream, cluster",
    "agentstream, cluster, tokens not mirrored",
    "agentstream, cluster, mirrored, not sent",
)
"""Run with a cluster's settings (``bench.services.cluster_environment``): the app in cluster
mode, then with its tokens dropped at the mirror (``RedisLog.append``), then queued and
framed but not sent (``RedisLog._send``): what a cluster process adds, and where."""
TOKENS = 100_000
"""Per stream: more than the warm-up and any window take, so none ends during one."""
WARM_UP = 2.0
WINDOW = 4.0

Receive = Callable[[], Awaitable[dict[str, Any]]]


async def request(
    app: Any,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    on_body: Callable[[bytes], None],
) -> None:
    """One POST through ``app``; ``on_body`` takes each piece of the response's body."""
    left = asyncio.Event()
    pending = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            on_body(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            *((name.encode(), value.encode()) for name, value in headers.items()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    try:
        await app(scope, receive, send)
    finally:
        left.set()


def _knock_out(variant: str, frames: list[int]) -> None:
    """Replace one part of the token's path (see the module's docstring)."""
    if variant == "agentstream, no frames":
        from agentstream.server import streams

        def one_frame_each(events: Sequence[Any], _render: Any, *, ids: bool = False) -> bytes:
            return b"x\n\n" * len(events)

        setattr(streams, "encode_events", one_frame_each)  # noqa: B010 (replaced)
    elif variant == "agentstream, no live log":
        from agentstream.events import TextDelta
        from agentstream.runlog import RunLog

        append = RunLog.append

        def dropping_tokens(log: RunLog, event: Any) -> None:
            if type(event) is TextDelta:
                frames[0] += 1
            else:
                append(log, event)

        setattr(RunLog, "append", dropping_tokens)  # noqa: B010 (a method, replaced)
    elif variant == "agentstream, cluster, tokens not mirrored":
        from agentstream.cluster.redis_log import RedisLog
        from agentstream.events import TextDelta

        mirror = RedisLog.append

        def mirroring_no_tokens(log: RedisLog, change: Any) -> None:
            if type(change) is not TextDelta:
                mirror(log, change)

        setattr(RedisLog, "append", mirroring_no_tokens)  # noqa: B010 (a method, replaced)
    elif variant == "agentstream, cluster, mirrored, not sent":
        from agentstream.cluster.redis_log import RedisLog

        async def not_sent(_log: RedisLog, _framed: list[bytes]) -> None:
            return None

        setattr(RedisLog, "_send", not_sent)  # noqa: B010 (a method, replaced)


@asynccontextmanager
async def paced(variant: str, streams: int, rate: float = RATE) -> AsyncIterator[list[int]]:
    """``streams`` streams of ``variant`` at ``rate`` tokens/s each, running in this process
    for the block, past the warm-up: the count of frames sent so far, in a list. The streams
    are cancelled after the block; the app is not shut down (the callers' process ends)."""
    os.environ["AGENTSTREAM_OFFLINE_TOKEN_DELAY"] = str(1 / rate)
    from agentstream.server import streaming
    from bench.servers import agentstream_app, baseline_app

    sending = getattr(streaming, "SENDS_IN_ANY_TASK", None)  # None before ``write_through``
    if sending is not None and __name__ not in sending:
        # This module's ``send`` never waits, in any task: frames are written through to
        # it, as to uvicorn's.
        streaming.SENDS_IN_ANY_TASK = (*sending, __name__)

    frames = [0]
    _knock_out(variant, frames)
    with tempfile.TemporaryDirectory() as data_dir:
        if variant == "baseline":
            app: Any = baseline_app([])
            path, headers = "/paced", {}
            body: dict[str, Any] = {"tokens": TOKENS, "delay": 1 / rate}
        else:
            app = agentstream_app(Path(data_dir))
            running = app.router.lifespan_context(app)  # kept: dropped, it would end
            await running.__aenter__()
            key = (Path(data_dir) / "demo-key").read_text().strip()
            path, headers = "/api/agents/words/run/stream", {"apikey": key}
            body = {"message": f"Write {TOKENS} words", "reasoning": False}

        def count(chunk: bytes) -> None:
            frames[0] += chunk.count(b"\n\n")

        requests = []
        for _ in range(streams):
            requests.append(asyncio.create_task(request(app, path, body, headers, count)))
            await asyncio.sleep(1 / 250)
        await asyncio.sleep(WARM_UP)
        try:
            yield frames
        finally:
            for started in requests:
                started.cancel()


async def _measure(variant: str, streams: int) -> float:
    """CPU µs per frame of ``streams`` paced streams of ``variant``, in this process."""
    async with paced(variant, streams) as frames:
        cpu, counted = time.process_time(), frames[0]
        await asyncio.sleep(WINDOW)
        cpu, counted = time.process_time() - cpu, frames[0] - counted
    if not counted:
        raise RuntimeError(f"{variant}: no frame in the window")
    return 1e6 * cpu / counted


async def _one(variant: str, streams: int) -> None:
    print(await _measure(variant, streams), flush=True)
    os._exit(0)  # here: ending the app and its streams is not what is measured


def measure(streams: int = 200, rounds: int = 5) -> dict[str, list[float]]:
    """Each variant once a round, each time in a process of its own."""
    results: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            out = subprocess.run(
                [sys.executable, "-m", "bench.paced_cpu", "--one", variant, str(streams)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            results[variant].append(float(out.split()[-1]))
    return results


def report(results: dict[str, list[float]], streams: int) -> str:
    base = statistics.median(results["baseline"])
    rows = [
        (
            variant,
            f"{statistics.median(values):.1f}",
            f"{statistics.median(values) / base:.2f}x",
            " ".join(f"{value:.1f}" for value in values),
        )
        for variant, values in results.items()
    ]
    title = f"CPU µs per paced token in-process, {streams} streams at {RATE:.0f} tokens/s"
    return title + "\n" + text_table(("variant", "median", "ratio", "rounds"), rows)


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        import uvloop

        uvloop.run(_one(sys.argv[2], int(sys.argv[3])))
    streams = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    print(report(measure(streams, rounds), streams))


if __name__ == "__main__":
    main()
