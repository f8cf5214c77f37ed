"""Whether a model server that needs no key (Ollama, vLLM, LM Studio) is up: no key can say
so, so connecting does. A short timeout keeps a listing quick, and each answer is kept
briefly, so listing many models of one server connects once.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import anyio

__all__ = ["Reachability"]


class Reachability:
    """Connects to a server's host and port; remembers the answer for ``ttl`` seconds."""

    def __init__(self, *, timeout: float = 0.5, ttl: float = 5.0) -> None:
        self.timeout = timeout
        self.ttl = ttl
        self._seen: dict[tuple[str, int], tuple[float, bool]] = {}
        """(host, port) -> (when it was tried, whether it accepted the connection)."""

    async def answers(self, url: str) -> bool:
        """True if something accepts a TCP connection where ``url`` points."""
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        address = (host, parts.port or (443 if parts.scheme == "https" else 80))
        seen = self._seen.get(address)
        if seen is not None and time.monotonic() - seen[0] < self.ttl:
            return seen[1]
        up = await self._connect(*address)
        self._seen[address] = (time.monotonic(), up)
        return up

    async def _connect(self, host: str, port: int) -> bool:
        with anyio.move_on_after(self.timeout):
            try:
                stream = await anyio.connect_tcp(host, port)
            except OSError:
                return False
            await stream.aclose()
            return True
        return False
