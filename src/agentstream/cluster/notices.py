"""What one process of a cluster tells the others about runs: one Redis pub/sub channel.

- A cancel: a process asked to cancel a run it does not execute publishes the run id and
  the reason; the one that executes the run stops it. The caller then sees the run's end
  in its live log.
- A follow: a process about to follow a run that executes elsewhere publishes the run id;
  the one that executes it mirrors its writes every few milliseconds from then on, where
  it mirrors the runs nobody follows elsewhere in slower batches
  (``redis_log.QUIET_GATHER``). A follow that is lost (Redis away for a moment) only makes
  that viewer's tokens come in those slower batches.

Every process listens, its own notices too (a run it does not execute is ignored).
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
    def __init__(self, redis: Redis, *, prefix: str) -> None:
        self._redis = redis
        self.channel = f"{prefix}:cancel"
        """Named for its first notice, cancels: processes of an earlier version still
        cancel through it (and ignore a follow, as a malformed cancel)."""

    async def cancel(self, run_id: str, reason: str) -> None:
        await self._redis.publish(self.channel, json.dumps({"run_id": run_id, "reason": reason}))

    async def follow(self, run_id: str) -> None:
        await self._redis.publish(self.channel, json.dumps({"run_id": run_id, "follow": True}))

    async def listen(
        self,
        cancel: Callable[[str, str], object],
        follow: Callable[[str], object],
        *,
        ready: anyio.Event | None = None,
    ) -> None:
        """Call ``cancel(run_id, reason)`` or ``follow(run_id)`` for every notice published,
        until cancelled; if Redis goes away, subscribe again once it is back. ``ready`` is
        set once subscribed."""
        pause = 0.05
        while True:
            try:
                async with self._redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(self.channel)
                    if ready is not None:
                        ready.set()
                    pause = 0.05
                    async for message in pubsub.listen():
                        try:
                            notice = json.loads(message["data"])
                            run_id = str(notice["run_id"])
                            reason = None if notice.get("follow") else str(notice["reason"])
                        except (ValueError, KeyError, TypeError, AttributeError):
                            logger.warning("Ignored a malformed notice: %r", message["data"])
                            continue
                        if reason is None:
                            follow(run_id)
                        else:
                            cancel(run_id, reason)
            except (RedisError, OSError) as exc:
                logger.warning("Redis is unreachable (%s); notices from other processes wait", exc)
                await anyio.sleep(pause)
                pause = min(pause * 2, 2.0)
