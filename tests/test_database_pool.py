"""A process's PostgreSQL connections: a fixed pool, reused under load, and a query that
cannot get one in time answered 503, never 500."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg
import pytest

from agentstream.store import store
from conftest import (
    POSTGRES_ADMIN_URL,
    LiveServer,
    make_settings,
    on_its_own_loop,
    run_events,
    serve,
)


def _connections(database: str) -> set[tuple[int, str]]:
    """The connections open to ``database`` now: their server process and start."""

    async def read() -> set[tuple[int, str]]:
        connection = await asyncpg.connect(POSTGRES_ADMIN_URL)
        try:
            query = "SELECT pid, backend_start::text FROM pg_stat_activity WHERE datname = $1"
            return {(row[0], row[1]) for row in await connection.fetch(query, database)}
        finally:
            await connection.close()

    return on_its_own_loop(read)


def _wave(live: LiveServer, runs: int) -> None:
    with ThreadPoolExecutor(runs) as clients:
        answers = list(
            clients.map(lambda i: run_events(live, "demo", {"message": f"hi {i}"}), range(runs))
        )
    assert all(events[-1].json()["event"] == "complete" for events in answers)


def test_a_busy_process_reuses_its_connections_and_opens_no_more_than_its_pool(
    tmp_path: Path, cluster_database: str
) -> None:
    """Twelve runs at once on a pool of three: the second burst finds the connections the
    first opened (a pool that opens connections for a burst and closes them after costs
    every run of a busy process a new connection)."""
    database = cluster_database.rsplit("/", 1)[1]
    settings = make_settings(tmp_path, database_url=cluster_database, database_pool_size=3)
    with serve(settings) as live:
        _wave(live, 12)  # the pool filled
        _wave(live, 12)
        after_first = _connections(database)
        _wave(live, 12)
        after_second = _connections(database)

    assert 1 <= len(after_first) <= 3
    assert after_second == after_first, "the same connections, none closed or opened"


def test_a_request_that_waits_too_long_for_a_connection_is_a_503_busy(
    tmp_path: Path, cluster_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's one connection is held by a request stuck behind a lock: the next request
    waits ``POOL_WAIT`` for a connection, then gets a 503 that says so; the stuck one then
    ends as it should."""
    monkeypatch.setattr(store, "POOL_WAIT", 0.5)
    database = cluster_database.rsplit("/", 1)[1]
    locked, release = threading.Event(), threading.Event()

    async def hold_lock() -> None:
        connection = await asyncpg.connect(cluster_database.replace("+asyncpg", ""))
        try:
            async with connection.transaction():
                await connection.execute("LOCK TABLE agents IN ACCESS EXCLUSIVE MODE")
                locked.set()
                await asyncio.get_running_loop().run_in_executor(None, release.wait)
        finally:
            await connection.close()

    async def waiting_on_lock() -> int:
        connection = await asyncpg.connect(POSTGRES_ADMIN_URL)
        try:
            query = (
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = $2"
            )
            return int(await connection.fetchval(query, database, "Lock"))
        finally:
            await connection.close()

    settings = make_settings(tmp_path, database_url=cluster_database, database_pool_size=1)
    with serve(settings) as live, live.client() as client, ThreadPoolExecutor(2) as threads:
        holder = threads.submit(on_its_own_loop, hold_lock)
        assert locked.wait(10)
        stuck = threads.submit(client.get, "/api/agents")
        for _ in range(200):
            if on_its_own_loop(waiting_on_lock):
                break
            threading.Event().wait(0.05)
        else:
            raise AssertionError("the first request never waited on the lock")
        busy = client.get("/api/agents")
        release.set()
        holder.result(10)
        unstuck = stuck.result(10)

    assert busy.status_code == 503
    assert busy.headers["Retry-After"] == "5"
    assert busy.json()["error"] == {
        "code": "unavailable",
        "message": "The database is busy; try again shortly",
        "field": None,
    }
    assert unstuck.status_code == 200
    assert "demo" in [agent["agent"]["id"] for agent in unstuck.json()]
