"""How much a client may ask of a public chat: guesses per window, runs per minute, and runs
in flight. Refusals are ``TooManyAttempts`` (429) with the seconds to wait.

Windows are the ``limits`` library's moving windows: in this process's memory, or in
cluster mode in its Redis storage, so that every process counts against the same window.
Runs in flight are the state of live runs, so they are counted here, by the process that
serves them.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from limits import RateLimitItem, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.errors import StorageError
from redis.asyncio import ConnectionPool

from agentstream.errors import TooManyAttempts, Unavailable

__all__ = ["InFlight", "Release", "WindowLimiter", "per_minute", "too_many", "window_storage"]

Key = tuple[str, ...]
Release = Callable[[], None]
"""Gives back what ``InFlight.acquire`` took; safe to call more than once."""


def too_many(message: str, wait: float, field: str | None = None) -> TooManyAttempts:
    """A 429 whose ``Retry-After`` is ``wait`` rounded up to whole seconds (at least 1)."""
    seconds = str(max(1, math.ceil(wait)))
    return TooManyAttempts(
        message.format(seconds=seconds), field=field, headers={"Retry-After": seconds}
    )


class WindowLimiter:
    """At most ``item.amount`` hits per key in any window of the item's length."""

    def __init__(self, storage: Storage) -> None:
        self._limiter = MovingWindowRateLimiter(storage)

    async def retry_after(self, item: RateLimitItem, *key: str) -> float:
        """Seconds until the next hit is allowed; 0 if it is allowed now (and counted).
        ``Unavailable`` while the windows cannot be counted (Redis is away): no guess goes
        uncounted."""
        try:
            if await self._limiter.hit(item, *key):
                return 0.0
            stats = await self._limiter.get_window_stats(item, *key)
        except StorageError:
            raise Unavailable("Cannot count attempts right now; try again shortly") from None
        return max(stats.reset_time - time.time(), 0.0)


@asynccontextmanager
async def window_storage(redis_url: str | None, prefix: str) -> AsyncIterator[Storage]:
    """Where windows are counted: this process's memory, or the Redis at ``redis_url``
    under keys that start with ``prefix``, shared by every process that uses both. The
    connections to Redis are named ``prefix`` (``CLIENT LIST``) and closed when the block
    ends."""
    if redis_url is None:
        yield MemoryStorage()
        return
    pool = ConnectionPool.from_url(redis_url, client_name=prefix)
    try:
        yield RedisStorage(
            _async_uri(redis_url),
            implementation="redispy",
            key_prefix=prefix,
            wrap_exceptions=True,  # StorageError, whichever the cause
            connection_pool=pool,  # type: ignore[arg-type]  # documented; the hint is narrower
        )
    finally:
        await pool.aclose()


def _async_uri(redis_url: str) -> str:
    """The URI ``limits`` takes for its asyncio Redis storage: ``async+redis://…``,
    ``async+rediss://…``, ``async+redis+unix://…``."""
    scheme, separator, rest = redis_url.partition("://")
    return f"async+{'redis+unix' if scheme == 'unix' else scheme}{separator}{rest}"


def per_minute(amount: int, minutes: int = 1, *, name: str) -> RateLimitItem:
    """``amount`` hits per ``minutes``, counted apart from every other limit's."""
    return RateLimitItemPerMinute(amount, minutes, namespace=name)


class InFlight:
    """Runs going now, per key (a client of a deployment, a deployment)."""

    def __init__(self) -> None:
        self._held: Counter[Key] = Counter()

    def acquire(self, limits: Sequence[tuple[Key, int]]) -> Release | None:
        """Count one more run under each key if every key is below its limit; the release
        (safe to call more than once), or None if some key is full."""
        if any(self._held[key] >= limit for key, limit in limits):
            return None
        for key, _ in limits:
            self._held[key] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                for key, _ in limits:
                    self._held[key] -= 1
                    if not self._held[key]:
                        del self._held[key]

        return release
