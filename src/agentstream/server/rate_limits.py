"""How much a client may ask of a public chat: guesses per window, runs per minute, and runs
in flight. Refusals are ``TooManyAttempts`` (429) with the seconds to wait.

Windows are the ``limits`` library's moving windows over its in-process storage; its Redis
storage would share them across servers. Runs in flight are the state of live runs, so
they are counted here, by the process that serves them.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence

from limits import RateLimitItem, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter

from agentstream.errors import TooManyAttempts

__all__ = ["InFlight", "Release", "WindowLimiter", "per_minute", "too_many"]

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

    def __init__(self, storage: Storage | None = None) -> None:
        self._limiter = MovingWindowRateLimiter(storage or MemoryStorage())

    async def retry_after(self, item: RateLimitItem, *key: str) -> float:
        """Seconds until the next hit is allowed; 0 if it is allowed now (and counted)."""
        if await self._limiter.hit(item, *key):
            return 0.0
        stats = await self._limiter.get_window_stats(item, *key)
        return max(stats.reset_time - time.time(), 0.0)


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
