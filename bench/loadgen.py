"""A load generator in its own process: ``python -m bench.loadgen CONFIG_JSON``.

It opens ``streams`` connections spread evenly over ``ramp`` seconds (round-robin over
the server processes when there are several), each asking for as
many tokens (at ``rate`` per second) as keep it streaming until ``ramp + hold + 1``
seconds: so every stream is live during the hold window ``[ramp, ramp + hold]``. Reads are
timed and their token frames counted in C (``bytes.count``) on uvloop; nothing is
parsed. In the hold window it records the gaps between one stream's tokens (inter-token
latency),
the servers' CPU time and peak resident memory (from ``/proc``), its own CPU use, which
is how a run shows its generator was not the bottleneck, and the whole machine's, with the
share of the services the servers use (``services``: process names, e.g. ``postgres``).
Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import math
import resource
import subprocess
import sys
import time
from array import array
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import uvloop

from bench.loopback import (
    busy_seconds,
    cpu_seconds,
    cpu_seconds_named,
    quantile,
    request_bytes,
    rss_bytes,
)
from bench.targets import Target

_DELTA = b'"delta":'
"""In every token frame of every system measured, and in no other frame."""
_ERROR = b'"error"'
"""In the error frames of every system measured (``"event"``/``"type": "error"``)."""
TAIL = 1.0
"""Seconds every stream goes on after the hold window, so none ends inside it."""


@dataclass(frozen=True)
class Config:
    ports: list[int]
    """The server processes' ports; stream ``i`` goes to ``ports[i % len(ports)]``."""
    path: str
    body: str
    """The request body, with ``{tokens}`` standing for the stream's token count."""
    headers: dict[str, str]
    streams: int
    ramp: float
    hold: float
    rate: float
    server_pids: list[int]
    services: list[str]
    """Names of the processes of the services the servers use (``cpu_seconds_named``)."""


class Stream(asyncio.Protocol):
    def __init__(self, window: tuple[float, float], gaps: array[float]) -> None:
        self.window = window
        self.gaps = gaps
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.head = b""
        self.tail = b""
        self.opened = time.monotonic()
        self.first_token = 0.0
        """Seconds from connecting to the first token."""
        self.last_token = 0.0
        self.failed = False
        self.status_ok = False
        self.ended = False

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if not self.status_ok:
            self.head += data
            if b"\r\n" not in self.head:
                return
            if b" 200 " not in self.head.split(b"\r\n", 1)[0]:
                self._finish("status " + self.head.split(b" ", 2)[1].decode())
                return
            self.status_ok = True
            data, self.head = self.head, b""
        seen = self.tail + data
        tokens = seen.count(_DELTA)
        self.failed = self.failed or _ERROR in seen
        self.tail = data[1 - len(_DELTA) :]
        if tokens:
            if self.last_token and self.window[0] <= self.last_token and now <= self.window[1]:
                self.gaps.append(now - self.last_token)
                self.gaps.extend([0.0] * (tokens - 1))
            if not self.last_token:
                self.first_token = now - self.opened
            self.last_token = now
        self.ended = data.endswith(b"0\r\n\r\n")

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish("error frame" if self.failed else "ok" if self.ended else "cut off")

    def _finish(self, outcome: str) -> None:
        if not self.done.done():
            self.done.set_result(outcome)


async def one_stream(
    config: Config, port: int, start: float, window: tuple[float, float], gaps: array[float]
) -> tuple[str, float]:
    """The stream's outcome and its time to first token."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    tokens = math.ceil((window[1] + TAIL - time.monotonic()) * config.rate)
    body = config.body.replace("{tokens}", str(tokens)).encode()
    try:
        transport, stream = await loop.create_connection(
            lambda: Stream(window, gaps), "127.0.0.1", port
        )
    except OSError as error:
        return f"connect: {error.strerror}", 0.0
    transport.write(request_bytes("POST", config.path, body, config.headers))
    deadline = window[1] + TAIL + 30 - time.monotonic()
    try:
        outcome = await asyncio.wait_for(asyncio.shield(stream.done), deadline)
    except TimeoutError:
        outcome = "stalled"
    finally:
        transport.close()
    return outcome, stream.first_token


async def watch(config: Config, window: tuple[float, float]) -> dict[str, Any]:
    """CPU time over the window (the servers', each and in all, the generator's, the
    services' and the machine's), and the servers' resident memory before and in it."""
    pids = config.server_pids
    idle_rss = sum(rss_bytes(pid) for pid in pids)
    await asyncio.sleep(window[0] - time.monotonic())
    cpu_start = [cpu_seconds(pid) for pid in pids]
    own_start, busy_start = time.process_time(), busy_seconds()
    services_start = cpu_seconds_named(config.services)
    rss_peak = 0
    while time.monotonic() < window[1]:
        rss_peak = max(rss_peak, sum(rss_bytes(pid) for pid in pids))
        await asyncio.sleep(min(0.25, max(0.0, window[1] - time.monotonic())))
    each = [cpu_seconds(pid) - start for pid, start in zip(pids, cpu_start, strict=True)]
    services = cpu_seconds_named(config.services)
    return {
        "server_cpu_s": sum(each),
        "server_cpu_s_each": each,
        "loadgen_cpu_s": time.process_time() - own_start,
        "services_cpu_s": sum(cpu - services_start.get(pid, 0.0) for pid, cpu in services.items()),
        "machine_busy_s": busy_seconds() - busy_start,
        "server_rss_idle": idle_rss,
        "server_rss_peak": rss_peak,
    }


async def run(config: Config) -> dict[str, Any]:
    begin = time.monotonic()
    window = (begin + config.ramp, begin + config.ramp + config.hold)
    gaps: array[float] = array("d")
    starts = [begin + config.ramp * i / config.streams for i in range(config.streams)]
    watcher = asyncio.create_task(watch(config, window))
    ports = config.ports
    outcomes = await asyncio.gather(
        *(one_stream(config, ports[i % len(ports)], s, window, gaps) for i, s in enumerate(starts))
    )
    measured = await watcher
    errors = Counter(outcome for outcome, _ in outcomes if outcome != "ok")
    first_tokens = [first for _, first in outcomes if first]
    samples = list(gaps)
    return {
        "streams": config.streams,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "itl_p50_ms": round(quantile(samples, 0.5) * 1000, 1),
        "itl_p99_ms": round(quantile(samples, 0.99) * 1000, 1),
        "ttft_p50_ms": round(quantile(first_tokens, 0.5) * 1000, 1),
        "ttft_p99_ms": round(quantile(first_tokens, 0.99) * 1000, 1),
        "ttft_p50_ms_by_quarter": _by_quarter(outcomes),
        "delivered": round(len(samples) / (config.streams * config.rate * config.hold), 3),
        "window_s": config.hold,
        **measured,
    }


def _by_quarter(outcomes: list[tuple[str, float]]) -> list[float | None]:
    """The time to first token's median (ms) of the streams opened in each quarter of the
    ramp (``outcomes`` in the order they were opened; None where none of them got a token):
    where in it a server ran out of core, which the whole step's median does not tell."""
    count = len(outcomes)
    quarters = [outcomes[count * q // 4 : count * (q + 1) // 4] for q in range(4)]
    firsts = [[first for _, first in quarter if first] for quarter in quarters]
    return [round(quantile(each, 0.5) * 1000, 1) if each else None for each in firsts]


def load(
    *targets: Target,
    streams: int,
    ramp: float,
    hold: float,
    rate: float,
    services: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run a generator process against a target (or the processes of one system, which
    take the same request) and return what it measured."""
    first = targets[0]
    assert all(
        (t.path, t.body, t.headers) == (first.path, first.body, first.headers) for t in targets
    )
    config = Config(
        ports=[target.server.port for target in targets],
        path=first.path,
        body=first.body,
        headers=first.headers,
        streams=streams,
        ramp=ramp,
        hold=hold,
        rate=rate,
        server_pids=[target.server.pid for target in targets],
        services=list(services),
    )
    done = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", json.dumps(asdict(config))],
        capture_output=True,
        check=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    config = Config(**json.loads(sys.argv[1]))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(json.dumps(uvloop.run(run(config))))


if __name__ == "__main__":
    main()
