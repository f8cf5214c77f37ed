"""What the cluster tests share (a pytest plugin, registered in ``conftest``): the Redis
and a PostgreSQL database of each test's own, two server processes over them, and reading
their streams a few frames at a time."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from agentstream.sse import ServerSentEvent, SSEDecoder
from conftest import postgres_admin
from processes import TAKEOVER_LEASE, ServerProcess, cluster

__all__ = [
    "REDIS_URL",
    "Posted",
    "cluster_database",
    "events",
    "posted",
    "redis_url",
    "rest",
    "two",
    "until",
]

REDIS_URL = os.environ.get("AGENTSTREAM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def redis_url() -> str:
    """This machine's Redis; skipped when none answers, except in CI."""
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.RedisError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"Redis not reachable at {REDIS_URL}: {exc}")
    return REDIS_URL


@pytest.fixture
def cluster_database(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL database of this test's own: the leases of other tests' processes are
    none of its business."""
    name = f"agentstream_cluster_{uuid.uuid4().hex[:12]}"
    postgres_admin(f'CREATE DATABASE "{name}"')
    try:
        yield postgres_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        postgres_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def two(tmp_path: Path, cluster_database: str, redis_url: str) -> Iterator[list[ServerProcess]]:
    with cluster(tmp_path, cluster_database, redis_url, lease_seconds=TAKEOVER_LEASE) as processes:
        yield processes


@dataclass
class Posted:
    """A run started by a POST stream to one process of two, with a client of each."""

    on_a: httpx.Client
    on_b: httpx.Client
    events: Iterator[ServerSentEvent]
    """The POST stream's, held open: a stream let go of is closed, and its run cancelled."""


@contextmanager
def posted(a: ServerProcess, b: ServerProcess, path: str, body: dict[str, Any]) -> Iterator[Posted]:
    """POST ``body`` to ``path`` on ``a`` and hold its stream open until the block ends."""
    with (
        a.live.client() as on_a,
        b.live.client() as on_b,
        on_a.stream("POST", path, json=body) as response,
    ):
        yield Posted(on_a, on_b, events(response))


def events(response: httpx.Response) -> Iterator[ServerSentEvent]:
    """A stream's events as they come: read some, then the rest, from one iterator."""
    decoder = SSEDecoder()
    for chunk in response.iter_bytes():
        yield from decoder.feed(chunk)


def until(stream: Iterator[ServerSentEvent], stop: str) -> list[dict[str, Any]]:
    """The next frames, up to and with the first whose ``event`` is ``stop``."""
    frames = []
    for event in stream:
        frames.append(event.json())
        if frames[-1]["event"] == stop:
            break
    return frames


def rest(stream: Iterator[ServerSentEvent]) -> list[dict[str, Any]]:
    return [event.json() for event in stream]
