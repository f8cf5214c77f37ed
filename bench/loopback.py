"""Server processes and a client that is never the bottleneck: raw sockets, no parsing
while reading (bytes are counted and timed, frames found afterwards)."""

from __future__ import annotations

import asyncio
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
BENCH_ROOT = Path(__file__).resolve().parent.parent
"""The checkout this bench is in: its ``bench`` package is what every server runs."""


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
def server_process(
    *args: str, env: Mapping[str, str] | None = None, source: Path | None = None
) -> Iterator[Server]:
    """Start ``python -m bench.servers ARGS`` on a free port; yield it once it answers.
    ``source``: a checkout whose ``src`` the server imports agentstream from (another
    revision, to compare with); default: the agentstream this bench imports."""
    port = free_port()
    environment = {**os.environ, **(env or {})}
    if source is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(source / "src"), str(BENCH_ROOT)])
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.servers", args[0], str(port), *args[1:]],
        env=environment,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server {args} exited with {process.returncode}")
            if _answers(port):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"server {args} did not start")
        yield Server(port, process.pid)
    finally:
        process.terminate()
        process.wait(10)


def _answers(port: int) -> bool:
    """The server on ``port`` answers a request: its app has started (agentstream's listens
    before, and accepts once it has)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(request_bytes("GET", "/", b"", {}))
            return sock.recv(16).startswith(b"HTTP/")
    except OSError:
        return False


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
    return _timing(path, b"".join(chunks), arrivals, started_at, total)


class LiveResponse(asyncio.Protocol):
    """A response read as it arrives on an event loop, each read stamped as ``post_stream``
    stamps them: for a client that acts in the middle of streams (opens a viewer once the
    run id is out, cancels a run) while it reads several at once."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.raw = bytearray()
        self.arrivals: list[tuple[float, int]] = []
        self.started_at = time.time()
        self._grew = asyncio.Event()
        self._closed = False

    @classmethod
    async def open(
        cls, port: int, method: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> LiveResponse:
        """Connect and send the request; the response is read from then on."""
        loop = asyncio.get_running_loop()
        transport, response = await loop.create_connection(lambda: cls(path), "127.0.0.1", port)
        response.started_at = time.time()
        transport.write(request_bytes(method, path, body, headers))
        return response

    def data_received(self, data: bytes) -> None:
        self.raw += data
        self.arrivals.append((time.time(), len(self.raw)))
        self._grew.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._grew.set()

    async def until(self, pattern: re.Pattern[bytes]) -> tuple[re.Match[bytes], float]:
        """Wait for ``pattern`` in the response: its first match, and the Unix time of the
        read that completed it."""
        while (match := pattern.search(self.raw)) is None:
            if self._closed:
                raise RuntimeError(f"{self.path}: ended without {pattern.pattern!r}")
            self._grew.clear()
            await self._grew.wait()
        ends = [end for _, end in self.arrivals]
        return match, self.arrivals[bisect.bisect_left(ends, match.end())][0]

    async def finish(self) -> Timing:
        """Read to the end of the response (the server closes the connection)."""
        while not self._closed:
            self._grew.clear()
            await self._grew.wait()
        total = (self.arrivals[-1][0] if self.arrivals else time.time()) - self.started_at
        return _timing(self.path, bytes(self.raw), self.arrivals, self.started_at, total)


def _timing(
    path: str, raw: bytes, arrivals: list[tuple[float, int]], started_at: float, total: float
) -> Timing:
    """The ``Timing`` of a whole response, from its reads ((Unix time, bytes so far))."""
    status = raw.split(b"\r\n", 1)[0]
    if b" 200 " not in status:
        raise RuntimeError(f"{path}: {status.decode()}")
    head_len = raw.index(b"\r\n\r\n") + 4
    first = bisect.bisect_left([end for _, end in arrivals], head_len + 1)
    first_byte = arrivals[first][0] - started_at if first < len(arrivals) else total
    body_arrivals = [(t, end - head_len) for t, end in arrivals[first:]]
    body_bytes = raw[head_len:]
    return Timing(first_byte, total, body_bytes.count(b"data: "), body_bytes, body_arrivals)


def clock_latencies(timing: Timing) -> list[float]:
    """Seconds from each clock frame's stamp to the read that completed it."""
    return [arrived - yielded for yielded, arrived in clock_arrivals(timing)]


def clock_arrivals(timing: Timing) -> list[tuple[float, float]]:
    """Each clock frame's stamp (its delta: the Unix time in ns at which the model yielded
    it), in seconds, and the Unix time of the read that completed it."""
    ends = [end for _, end in timing.arrivals]
    return [
        (int(match.group(1)) / 1e9, timing.arrivals[bisect.bisect_left(ends, match.end())][0])
        for match in _CLOCK_DELTA.finditer(timing.body)
    ]


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


def busy_seconds() -> float:
    """CPU time the whole machine has spent not idle so far, all cores, from ``/proc``."""
    fields = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest time is in user's


def cpu_seconds_named(names: list[str]) -> dict[int, float]:
    """``cpu_seconds`` of every process whose command (``/proc/PID/comm``) is one of
    ``names``, by pid: a service's processes, however many it has started."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in names:
                    found[int(entry.name)] = cpu_seconds(int(entry.name))
            except OSError:  # it ended meanwhile
                continue
    return found


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; 0.0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
