"""What one process of a cluster tells the others about runs, over Redis pub/sub.

- ``<prefix>:cancel``: a process asked to cancel a run it does not execute publishes the
  run id and the reason; the one that executes the run stops it. The caller then sees the
  run's end in its live log.
- ``<prefix>:follow``: a process about to follow a run that executes elsewhere publishes
  the run id; the one that executes it mirrors that run's writes every few milliseconds
  from then on, where it mirrors the runs nobody follows elsewhere in slower batches
  (``redis_log.QUIET_GATHER``). A follow is not kept: one published while the run's
  process was not listening (Redis away for a moment, or a process of an earlier version)
  only leaves that viewer's tokens in the slower batches.

Every process listens to both on one connection, its own notices too (a follow of a run it
does not execute is ignored).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import anyio
from redis.asyncio import Redis
from redis.exceptions import RedisError

__all__ = ["Notices"]

logger = logging.getLogger(__name__)


class Notices:
    """This process's end of both channels: it publishes, and ``listen`` hears."""

    def __init__(self, redis: Redis, *, prefix: str, followers: Redis | None = None) -> None:
        """``followers``: the client a follow is published on, the one the viewers use
        (``RedisLog``'s), so that many viewers arriving at once queue for its connections
        instead of taking those the writes need; default ``redis``."""
        self._redis = redis
        self._followers = followers or redis
        self.cancels = f"{prefix}:cancel"
        self.follows = f"{prefix}:follow"

    async def cancel(self, run_id: str, reason: str) -> None:
        await self._redis.publish(self.cancels, json.dumps({"run_id": run_id, "reason": reason}))

    async def follow(self, run_id: str) -> None:
        await self._followers.publish(self.follows, run_id)

    async def listen(
        self,
        cancel: Callable[[str, str], object],
        follow: Callable[[str], object],
        *,
        ready: anyio.Event | None = None,
    ) -> None:
        """Call ``cancel(run_id, reason)`` for every cancel published and ``follow(run_id)``
        for every follow, until cancelled; if Redis goes away, subscribe again once it is
        back (what is published meanwhile is missed). ``ready`` is set once subscribed."""
        pause = 0.05
        follows = self.follows.encode()
        while True:
            try:
                async with self._redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(self.cancels, self.follows)
                    if ready is not None:
                        ready.set()
                    pause = 0.05
                    async for message in pubsub.listen():
                        if message["channel"] == follows:
                            follow(message["data"].decode(errors="replace"))
                            continue
                        try:
                            asked = json.loads(message["data"])
                            run_id, reason = str(asked["run_id"]), str(asked["reason"])
                        except (ValueError, KeyError, TypeError):
                            logger.warning("Ignored a malformed cancel: %r", message["data"])
                            continue
                        cancel(run_id, reason)
            except (RedisError, OSError) as exc:
                logger.warning(
                    "Redis is unreachable (%s); notices from other processes are missed", exc
                )
                await anyio.sleep(pause)
                pause = min(pause * 2, 2.0)
