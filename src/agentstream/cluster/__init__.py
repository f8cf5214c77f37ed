"""Cluster mode: what the processes serving the same runs share through Redis (the live log
and cancels), as one ``Cluster`` per process. PostgreSQL holds the rest (runs, events,
leases). The embedded default has no cluster: one process, all in memory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
from redis.asyncio import Redis
from redis.exceptions import RedisError

from agentstream.cluster.cancels import CancelChannel
from agentstream.cluster.redis_log import RedisLog, RedisSubscription
from agentstream.config import Settings
from agentstream.errors import ConfigError
from agentstream.events import Event

__all__ = ["Cluster"]

logger = logging.getLogger(__name__)

FINAL_FLUSH = 5.0
"""Seconds a stopping process gives its last log writes."""


class Cluster:
    """This process's link to the others: follow a run wherever it executes, cancel it
    there, and end the streams of runs whose process died (``runtime.ports.Peers``)."""

    def __init__(self, settings: Settings) -> None:
        assert settings.redis_url is not None
        self.redis = Redis.from_url(settings.redis_url)
        self.log = RedisLog(
            self.redis,
            prefix=settings.redis_prefix,
            retention=settings.run_retention_seconds,
            max_events=settings.log_max_events,
        )
        self.cancels = CancelChannel(self.redis, prefix=settings.redis_prefix)

    @asynccontextmanager
    async def connected(self, cancel: Callable[[str, str], object]) -> AsyncIterator[None]:
        """Mirror the log and take cancels (``cancel(run_id, reason)``) while the block
        runs; then send the last writes. ``ConfigError`` if Redis does not answer."""
        try:
            await self.redis.ping()
        except (RedisError, OSError) as exc:
            await self.redis.aclose()
            raise ConfigError(f"AGENTSTREAM_REDIS_URL: Redis does not answer ({exc})") from None
        try:
            async with anyio.create_task_group() as tasks:
                listening = anyio.Event()
                tasks.start_soon(self.log.run)
                tasks.start_soon(lambda: self.cancels.listen(cancel, ready=listening))
                await listening.wait()
                try:
                    yield
                finally:
                    tasks.cancel_scope.cancel()
            with anyio.move_on_after(FINAL_FLUSH, shield=True):
                try:
                    await self.log.flush()  # what the runs wrote as they ended
                except (RedisError, OSError) as exc:
                    logger.error("The last live log writes were lost: %s", exc)
        finally:
            await self.redis.aclose()

    async def subscribe(self, run_id: str, *, after: int) -> RedisSubscription | None:
        return await self.log.subscribe(run_id, after=after)

    async def cancel(self, run_id: str, reason: str) -> None:
        await self.cancels.publish(run_id, reason)

    async def last_seq(self, run_id: str) -> int:
        return await self.log.last_seq(run_id)

    async def seal(self, last: Event) -> None:
        await self.log.seal(last)
