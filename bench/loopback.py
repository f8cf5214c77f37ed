"""A client that is never the bottleneck: raw sockets, bytes counted in C, no parsing."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    first_byte: float
    """Seconds from sending the request to the first byte of the body."""
    total: float
    """Seconds from sending the request to the end of the stream."""
    frames: int
    body: bytes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def server_process(*args: str) -> Iterator[int]:
    """Start ``python -m bench.servers ARGS`` on a free port; yield the port once it listens."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.servers", args[0], str(port), *args[1:]]
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"server {args} did not start")
        yield port
    finally:
        process.terminate()
        process.wait(10)


def post_stream(port: int, path: str, body: dict[str, object], headers: dict[str, str]) -> Timing:
    """POST and read the whole response; count SSE frames by their ``data:`` lines."""
    payload = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n{head}\r\n"
    ).encode() + payload
    chunks: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        started = time.perf_counter()
        sock.sendall(request)
        first_byte = 0.0
        seen = b""
        while chunk := sock.recv(1 << 20):
            chunks.append(chunk)
            if not first_byte:
                seen += chunk
                if b"\r\n\r\n" in seen and seen.split(b"\r\n\r\n", 1)[1]:
                    first_byte = time.perf_counter() - started
        total = time.perf_counter() - started
    raw = b"".join(chunks)
    status = raw.split(b"\r\n", 1)[0]
    if b" 200 " not in status:
        raise RuntimeError(f"{path}: {status.decode()}")
    body_bytes = raw.split(b"\r\n\r\n", 1)[1]
    return Timing(first_byte, total, body_bytes.count(b"data: "), body_bytes)
