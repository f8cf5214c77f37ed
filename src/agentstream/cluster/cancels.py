"""Cancels across the processes of a cluster: one Redis pub/sub channel.

A process asked to cancel a run it does not execute publishes the run id and the reason;
every process listens, and the one that executes the run stops it. The caller then sees
the run's end in its live log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import anyio
from redis.asyncio import Redis
from redis.exceptions import RedisError

__all__ = ["CancelChannel"]

logger = logging.getLogger(__name__)


class CancelChannel:
    def __init__(self, redis: Redis, *, prefix: str) -> None:
        self._redis = redis
        self.channel = f"{prefix}:cancel"

    async def publish(self, run_id: str, reason: str) -> None:
        await self._redis.publish(self.channel, json.dumps({"run_id": run_id, "reason": reason}))

    async def listen(
        self, cancel: Callable[[str, str], object], *, ready: anyio.Event | None = None
    ) -> None:
        """Call ``cancel(run_id, reason)`` for every cancel published, until cancelled; if
        Redis goes away, subscribe again once it is back. ``ready`` is set once subscribed."""
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
                            asked = json.loads(message["data"])
                            run_id, reason = str(asked["run_id"]), str(asked["reason"])
                        except (ValueError, KeyError, TypeError):
                            logger.warning("Ignored a malformed cancel: %r", message["data"])
                            continue
                        cancel(run_id, reason)
            except (RedisError, OSError) as exc:
                logger.warning("Redis is unreachable (%s); cancels from other processes wait", exc)
                await anyio.sleep(pause)
                pause = min(pause * 2, 2.0)
