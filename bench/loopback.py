"""Server processes and a client that is never the bottleneck: raw sockets, no parsing
while reading (bytes are counted and timed, frames found afterwards)."""

from __future__ import annotations

import bisect
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_CLOCK_DELTA = re.compile(rb'"delta":" (\d+)"')


@dataclass(frozen=True)
class Server:
    port: int
    pid: int


@dataclass(frozen=True)
class Timing:
    first_byte: float
    """Seconds from sending the request to the first byte of the body."""
    total: float
    """Seconds from sending the request to the end of the stream."""
    frames: int
    body: bytes
    """The raw (chunked) body."""
    arrivals: list[tuple[float, int]]
    """(Unix time, end offset in ``body``) of each read."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def server_process(*args: str, env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """Start ``python -m bench.servers ARGS`` on a free port; yield it once it listens."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.servers", args[0], str(port), *args[1:]],
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server {args} exited with {process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"server {args} did not start")
        yield Server(port, process.pid)
    finally:
        process.terminate()
        process.wait(10)


def request_bytes(method: str, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n"
    ).encode() + body


def post_stream(
    port: int, path: str, body: bytes, headers: Mapping[str, str], *, method: str = "POST"
) -> Timing:
    """Send the request and read the whole response; count SSE frames by their ``data:``."""
    request = request_bytes(method, path, body, headers)
    chunks: list[bytes] = []
    arrivals: list[tuple[float, int]] = []
    received = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        started, started_at = time.perf_counter(), time.time()
        sock.sendall(request)
        while chunk := sock.recv(1 << 20):
            chunks.append(chunk)
            received += len(chunk)
            arrivals.append((time.time(), received))
        total = time.perf_counter() - started
    raw = b"".join(chunks)
    status = raw.split(b"\r\n", 1)[0]
    if b" 200 " not in status:
        raise RuntimeError(f"{path}: {status.decode()}")
    head_len = raw.index(b"\r\n\r\n") + 4
    first = bisect.bisect_left([end for _, end in arrivals], head_len + 1)
    first_byte = arrivals[first][0] - started_at
    body_arrivals = [(t, end - head_len) for t, end in arrivals[first:]]
    body_bytes = raw[head_len:]
    return Timing(first_byte, total, body_bytes.count(b"data: "), body_bytes, body_arrivals)


def clock_latencies(timing: Timing) -> list[float]:
    """Seconds from each clock frame's stamp (its delta: the Unix time in ns at which the
    model yielded it) to the read that completed it."""
    ends = [end for _, end in timing.arrivals]
    latencies = []
    for match in _CLOCK_DELTA.finditer(timing.body):
        read = bisect.bisect_left(ends, match.end())
        latencies.append(timing.arrivals[read][0] - int(match.group(1)) / 1e9)
    return latencies


def dechunk(body: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body."""
    out, rest = [], body
    while rest:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2 :]
    return b"".join(out)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from ``/proc``."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; 0.0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
