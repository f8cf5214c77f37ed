"""Reads of one value on PostgreSQL through the connection the store holds
(``agentstream.store.held_connection``): shared by the callers waiting as a read goes out,
never by one who asked after it went, and read again through the pool where the held
connection fails."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import pytest
from sqlalchemy import Pool, event

from agentstream.store import Store, held_connection
from agentstream.store.clock import now
from agentstream.store.tables import SessionRow
from conftest import through_sqlalchemy

pytestmark = pytest.mark.anyio

COUNTER = "SELECT definitions_revision.revision FROM definitions_revision"
MOVE_ON = "UPDATE definitions_revision SET revision = revision + 1"
HELD = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    " AND query = $1 AND pid <> pg_backend_pid()"
)
"""The backends whose last statement was this one: the held connection's."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextmanager
def pool_use(pool: Pool) -> Iterator[list[str]]:
    """The pool's connections taken and given back while the block runs, in order."""
    used: list[str] = []

    def taken(*_: Any) -> None:
        used.append("checkout")

    def given_back(*_: Any) -> None:
        used.append("checkin")

    event.listen(pool, "checkout", taken)
    event.listen(pool, "checkin", given_back)
    try:
        yield used
    finally:
        event.remove(pool, "checkout", taken)
        event.remove(pool, "checkin", given_back)


@contextmanager
def held_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[list[Any], asyncio.Event, asyncio.Event]]:
    """The values the held connection's reads got, an event set when one has its answer,
    and one that, set, lets them give it: until then each read is held back."""
    got: list[Any] = []
    answered, answer = asyncio.Event(), asyncio.Event()
    fetchval = asyncpg.Connection.fetchval

    async def held_back(connection: asyncpg.Connection, *args: Any, **kwargs: Any) -> Any:
        value = await fetchval(connection, *args, **kwargs)
        got.append(value)
        answered.set()
        await answer.wait()
        return value

    monkeypatch.setattr(asyncpg.Connection, "fetchval", held_back)
    yield got, answered, answer
    monkeypatch.undo()


async def test_callers_waiting_as_a_read_goes_out_share_it_and_later_ones_read_again(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read goes out; the counter moves on; then three callers ask while the first read
    is still under way. The first caller gets what it read; the three share one read that
    went out after they asked, and see the change (a revoked key is refused from the very
    next request); none of it goes through SQLAlchemy's execution."""
    store = await Store.open(postgres_url)
    admin = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
    try:
        before = await admin.fetchval(COUNTER)
        with through_sqlalchemy() as sent, held_reads(monkeypatch) as (got, answered, answer):
            first = asyncio.create_task(store.db.read_value(COUNTER))
            await asyncio.wait_for(answered.wait(), 10)
            await admin.execute(MOVE_ON)
            later = [asyncio.create_task(store.db.read_value(COUNTER)) for _ in range(3)]
            await asyncio.sleep(0.1)
            answer.set()
            assert await first == before
            assert await asyncio.gather(*later) == [before + 1] * 3
        assert got == [before, before + 1]
        assert sent == []
    finally:
        await admin.close()
        await store.close()


async def test_a_cancelled_caller_leaves_the_others_their_shared_read(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller whose ask sent the read is cancelled (its client went away): the callers
    sharing the read still get its value."""
    store = await Store.open(postgres_url)
    try:
        expected = await store.db.read_value(COUNTER)
        with held_reads(monkeypatch) as (got, answered, answer):
            leaving, staying = (asyncio.create_task(store.db.read_value(COUNTER)) for _ in "ab")
            await asyncio.wait_for(answered.wait(), 10)
            leaving.cancel()
            answer.set()
            assert await staying == expected
            with pytest.raises(asyncio.CancelledError):
                await leaving
        assert got == [expected]
    finally:
        await store.close()


async def test_a_reads_callers_resume_in_the_next_turn_and_the_next_read_goes_at_once(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn of the event loop a lookup waits more is tens of milliseconds once the
    process is at a whole core. A read's callers resume in the turn after its answer, and
    the callers that asked meanwhile have theirs sent in the very turn of that answer."""
    store = await Store.open(postgres_url)
    happened: list[str] = []
    sent, release = asyncio.Event(), asyncio.Event()
    fetchval = asyncpg.Connection.fetchval

    async def recorded(connection: asyncpg.Connection, *args: Any, **kwargs: Any) -> Any:
        first = not sent.is_set()
        happened.append("sent")
        sent.set()
        value = await fetchval(connection, *args, **kwargs)
        if first:  # until the others have asked
            await release.wait()
        happened.append("answered")
        return value

    async def tick() -> None:
        while True:
            await asyncio.sleep(0)
            happened.append("tick")

    async def read() -> None:
        await store.db.read_value(COUNTER)
        happened.append("resumed")

    try:
        await store.db.read_value(COUNTER)  # the held connection, connected
        monkeypatch.setattr(asyncpg.Connection, "fetchval", recorded)
        ticking = asyncio.create_task(tick())
        try:
            first = asyncio.create_task(read())
            await asyncio.wait_for(sent.wait(), 10)
            meanwhile = [asyncio.create_task(read()) for _ in range(3)]
            await asyncio.sleep(0)  # they ask
            release.set()
            await asyncio.wait_for(asyncio.gather(first, *meanwhile), 10)
        finally:
            ticking.cancel()
        answered = happened.index("answered")
        assert happened[answered : answered + 4] == ["answered", "sent", "tick", "resumed"]
        answered = happened.index("answered", answered + 1)
        assert happened[answered : answered + 5] == ["answered", "tick"] + ["resumed"] * 3
    finally:
        monkeypatch.undo()
        await store.close()


async def test_a_reader_cancelled_before_it_ran_is_replaced_by_the_next_caller(
    postgres_url: str,
) -> None:
    """The task that reads for the callers waiting is cancelled before its first step (a
    shutdown that cancels every task), so none of its code runs: the next caller starts
    another, which reads for both."""
    store = await Store.open(postgres_url)
    try:
        expected = await store.db.read_value(COUNTER)
        held = store.db._held_reads
        assert held is not None
        first = asyncio.create_task(store.db.read_value(COUNTER))
        await asyncio.sleep(0)  # it asked, and started a reader, which has not run
        held._readers[COUNTER].cancel()
        await asyncio.sleep(0)
        second = store.db.read_value(COUNTER)
        assert list(await asyncio.wait_for(asyncio.gather(first, second), 10)) == [expected] * 2
    finally:
        await store.close()


async def test_callers_that_ask_while_the_connection_is_busy_share_the_read_that_waits(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another statement holds the connection: the callers that ask meanwhile, before and
    after the read waiting for it is under way, all get that one read."""
    store = await Store.open(postgres_url)
    try:
        expected = await store.db.read_value(COUNTER)
        held = store.db._held_reads
        assert held is not None
        reads = 0
        fetchval = asyncpg.Connection.fetchval

        async def counted(connection: asyncpg.Connection, *args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await fetchval(connection, *args, **kwargs)

        monkeypatch.setattr(asyncpg.Connection, "fetchval", counted)
        async with held.turn:
            callers = []
            for _ in range(3):
                callers.append(asyncio.create_task(store.db.read_value(COUNTER)))
                await asyncio.sleep(0.01)  # the reader waits for the turn
        assert list(await asyncio.wait_for(asyncio.gather(*callers), 10)) == [expected] * 3
        assert reads == 1
    finally:
        monkeypatch.undo()
        await store.close()


async def test_a_read_whose_held_connection_was_lost_is_read_again_through_the_pool(
    postgres_url: str,
) -> None:
    """The held connection's backend is terminated under a read: that read goes again on a
    connection of the pool and gets the value; the next read holds a new connection."""
    store = await Store.open(postgres_url)
    admin = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
    try:
        expected = await store.db.read_value(COUNTER)
        [held] = await admin.fetch(HELD, COUNTER)
        sleeping = "SELECT revision FROM definitions_revision, pg_sleep(1)"
        reading = asyncio.create_task(store.db.read_value(sleeping))
        running = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query = $2"
        for _ in range(500):  # until it is under way there
            if await admin.fetchval(running, held["pid"], sleeping):
                break
            await asyncio.sleep(0.01)
        pool = store.db.engine.sync_engine.pool
        with pool_use(pool) as used:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", held["pid"])
            assert await reading == expected
        assert used[-2:] == ["checkout", "checkin"]  # read on one of the pool's, given back
        with through_sqlalchemy() as sent:
            assert await store.db.read_value(COUNTER) == expected
        assert sent == []
        [now_held] = await admin.fetch(HELD, COUNTER)
        assert now_held["pid"] != held["pid"]
    finally:
        await admin.close()
        await store.close()


async def test_a_read_with_no_answer_in_time_is_read_again_through_the_pool(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held connection's read has no answer within ``READ_TIMEOUT`` (a connection a
    proxy dropped without a word would never answer): it goes again on one of the pool's,
    and the held connection is replaced."""
    store = await Store.open(postgres_url)
    admin = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
    monkeypatch.setattr(held_connection, "READ_TIMEOUT", 0.2)
    try:
        expected = await store.db.read_value(COUNTER)
        [held] = await admin.fetch(HELD, COUNTER)
        with pool_use(store.db.engine.sync_engine.pool) as used:
            slow = "SELECT revision FROM definitions_revision, pg_sleep(0.5)"
            assert await store.db.read_value(slow) == expected
        assert used[-2:] == ["checkout", "checkin"]
        await store.db.read_value(COUNTER)
        [now_held] = await admin.fetch(HELD, COUNTER)
        assert now_held["pid"] != held["pid"]
    finally:
        await admin.close()
        await store.close()


async def test_a_read_does_not_wait_for_an_insert_held_up_by_a_lock(
    postgres_url: str,
) -> None:
    """Another connection holds a lock on ``sessions`` (a migration, a long transaction):
    a session's INSERT waits for it, on the connection held for writes; the counter's read,
    on its own, answers meanwhile (lookups, so every request, would wait too)."""
    store = await Store.open(postgres_url)
    admin = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
    session = (SessionRow, {"id": f"ses_{uuid.uuid4().hex}", "agent_id": "a", "created_at": now()})
    try:
        expected = await admin.fetchval(COUNTER)
        locking = admin.transaction()
        await locking.start()
        await admin.execute("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE")
        inserting = asyncio.create_task(store.db.insert(session))
        await asyncio.sleep(0.3)
        assert not inserting.done()
        assert await asyncio.wait_for(store.db.read_value(COUNTER), 5) == expected
        await locking.rollback()
        await inserting
    finally:
        await admin.close()
        await store.close()
