"""Cluster mode: what the processes serving the same runs share through Redis (the live log,
cancels and follows), as one ``Cluster`` per process. PostgreSQL holds the rest (runs, events,
leases). The embedded default has no cluster: one process, all in memory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager

import anyio
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

from agentstream.cluster.notices import Notices
from agentstream.cluster.redis_log import RedisLog, RedisSubscription
from agentstream.config import Settings
from agentstream.errors import ConfigError, Unavailable
from agentstream.events import Event

__all__ = ["Cluster"]

logger = logging.getLogger(__name__)

FOLLOWER_CONNECTIONS = 1000
"""Connections to Redis for the viewers this process serves of runs executing elsewhere
(each waits on one while it waits for events); more viewers queue for a connection (a
``max_connections`` in the URL sets another number)."""

FINAL_FLUSH = 5.0
"""Seconds a stopping process gives its last log writes."""


class Cluster:
    """This process's link to the others: follow a run wherever it executes, cancel it
    there, and end the streams of runs whose process died (``runtime.ports.Peers``)."""

    def __init__(self, settings: Settings) -> None:
        assert settings.redis_url is not None
        self.redis = Redis.from_url(settings.redis_url)
        self.followers = Redis(
            connection_pool=BlockingConnectionPool.from_url(
                settings.redis_url, max_connections=FOLLOWER_CONNECTIONS, timeout=None
            )
        )
        self.log = RedisLog(
            self.redis,
            prefix=settings.redis_prefix,
            retention=settings.run_retention_seconds,
            max_events=settings.log_max_events,
            followers=self.followers,
        )
        self.notices = Notices(self.redis, prefix=settings.redis_prefix, followers=self.followers)

    @asynccontextmanager
    async def connected(self, cancel: Callable[[str, str], object]) -> AsyncIterator[None]:
        """Mirror the log, take cancels (``cancel(run_id, reason)``) and hear of follows
        while the block runs; then send the last writes. ``ConfigError`` if Redis does not
        answer."""
        try:
            try:
                await self.redis.ping()
            except (RedisError, OSError) as exc:
                raise ConfigError(f"AGENTSTREAM_REDIS_URL: Redis does not answer ({exc})") from None
            async with anyio.create_task_group() as tasks:
                listening = anyio.Event()
                tasks.start_soon(self.log.run)
                tasks.start_soon(
                    lambda: self.notices.listen(cancel, self.log.followed, ready=listening)
                )
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
            await self.followers.aclose()
            await self.redis.aclose()

    async def subscribe(self, run_id: str, *, after: int) -> RedisSubscription | None:
        """None while Redis is away, too: the viewer gets the stored events meanwhile. The
        run's process is told first, so that it mirrors the run's writes without waiting
        long (``Notices``)."""
        try:
            await self.notices.follow(run_id)
            return await self.log.subscribe(run_id, after=after)
        except (RedisError, OSError) as exc:
            logger.warning("Redis is away (%s): %s is followed from the store", exc, run_id)
            return None

    async def cancel(self, run_id: str, reason: str) -> None:
        with _unavailable("cancel a run in another process"):
            await self.notices.cancel(run_id, reason)

    async def last_seq(self, run_id: str) -> int:
        with _unavailable("reach the live log"):
            return await self.log.last_seq(run_id)

    async def seal(self, events: Sequence[Event]) -> None:
        with _unavailable("reach the live log"):
            await self.log.seal(events)


@contextmanager
def _unavailable(action: str) -> Iterator[None]:
    """Redis away: ``Unavailable`` (503, try again shortly), not an internal error."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise Unavailable(f"Cannot {action} right now (Redis is away: {exc})") from None
