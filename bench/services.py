"""PostgreSQL and Redis for agentstream in cluster mode: this machine's (``.ci/run`` starts
PostgreSQL), with a fresh database and a Redis prefix of its own for every cluster started,
so no measurement finds another's runs, leases or streams."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg
import redis

POSTGRES_URL = os.environ.get(
    "AGENTSTREAM_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
"""A database of the server that the bench may create databases on."""
REDIS_URL = os.environ.get("AGENTSTREAM_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PROCESSES = ("postgres", "redis-server")
"""The services' process names (``loopback.cpu_seconds_named``)."""


def unavailable(*, cluster: bool = True) -> str | None:
    """Why agentstream in cluster mode (PostgreSQL and Redis), or with ``cluster`` False on
    PostgreSQL alone, cannot be measured here (a service not answering), or None."""
    try:
        asyncio.run(_execute("SELECT 1"))
    except (OSError, asyncpg.PostgresError) as exc:
        return f"PostgreSQL ({POSTGRES_URL}) needed: {exc}"
    if not cluster:
        return None
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except (OSError, redis.RedisError) as exc:
        return f"Redis ({REDIS_URL}) needed: {exc}"
    return None


@contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a database made for one measurement, dropped afterwards."""
    name = f"agentstream_bench_{uuid.uuid4().hex[:12]}"
    asyncio.run(_execute(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        asyncio.run(_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def cluster_environment() -> Iterator[dict[str, str]]:
    """The ``AGENTSTREAM_*`` settings of the processes of one cluster: a database made for
    it (dropped afterwards) and a Redis prefix of its own (its keys expire by themselves)."""
    with postgres_database() as url:
        yield {
            "AGENTSTREAM_DATABASE_URL": url,
            "AGENTSTREAM_REDIS_URL": REDIS_URL,
            "AGENTSTREAM_REDIS_PREFIX": url.rsplit("/", 1)[1],
        }


async def _execute(statement: str) -> None:
    connection = await asyncpg.connect(POSTGRES_URL)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()
