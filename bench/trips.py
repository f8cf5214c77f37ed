"""Trips through the event loop a run start takes: ``python -m bench.trips [REV ...]``.

Each time a run's way waits for the event loop, it waits behind every task that is ready:
under load, the count of those waits multiplies the loop's busy time into the time to first
token. Counted on an idle loop by a callback that schedules itself again at every iteration,
it is the same from run to run. A one-token run of the bench's ``words`` agent (no token
delay), through the app's ASGI interface in this process, on uvloop; printed, for the
working tree and each ``REV`` (``git archive`` of its ``src``, run from the repository):
the iterations from the request to each piece of the response's body, with the events of
its frames.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.loopback import BENCH_ROOT
from bench.paced_cpu import request
from bench.revisions import checked_out
from bench.tables import text_table

WARM_UP = 20
"""Runs before the one counted: the first request's imports and caches."""

_EVENT = re.compile(rb'"event":"(\w+)"')


async def _count() -> None:
    """In a process of its own: one line a piece of the body, its iteration and events."""
    from bench.servers import agentstream_app

    loop = asyncio.get_running_loop()
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        loop.call_soon(tick)

    with tempfile.TemporaryDirectory() as data_dir:
        app = agentstream_app(Path(data_dir))
        async with app.router.lifespan_context(app):
            key = (Path(data_dir) / "demo-key").read_text().strip()
            pieces: list[tuple[int, bytes]] = []

            def seen(chunk: bytes) -> None:
                if chunk:
                    pieces.append((ticks, b",".join(_EVENT.findall(chunk)) or b"-"))

            body = {"message": "Write 1 words", "reasoning": False}
            path, headers = "/api/agents/words/run/stream", {"apikey": key}
            loop.call_soon(tick)
            for _ in range(WARM_UP):
                await request(app, path, body, headers, lambda _chunk: None)
            await asyncio.sleep(0.05)  # the warm-up's writes and timers settle
            start = ticks
            await request(app, path, body, headers, seen)
            for at, event in pieces:
                print(at - start, event.decode(), flush=True)
    os._exit(0)  # the app's background tasks are not what is counted


def trips(source: Path) -> list[tuple[int, str]]:
    """The counted run's pieces of body with agentstream imported from ``source``."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(source / "src"), str(BENCH_ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "bench.trips", "--one"], env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"{source}: nothing counted\n{done.stderr[-2000:]}")
    return [(int(at), events) for at, events in (line.split() for line in done.stdout.splitlines())]


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        import uvloop

        uvloop.run(_count())
        return
    columns: list[tuple[str, list[tuple[int, str]]]] = [("working tree", trips(BENCH_ROOT))]
    for revision in sys.argv[1:]:
        with checked_out(revision) as source:
            columns.append((revision, trips(source)))
    print("Event loop iterations from a one-token run's request to each piece of its body")
    for name, pieces in columns:
        print(f"\n{name}")
        print(text_table(("iteration", "events"), [(str(at), e) for at, e in pieces]))


if __name__ == "__main__":
    main()
