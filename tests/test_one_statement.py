"""A group of rows written on PostgreSQL in one statement, on a connection the store holds
(``agentstream.store.one_statement``): the rows SQLAlchemy's INSERTs would write, and no
write lost when that connection is."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import asyncpg
import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, OperationalError

from agentstream.store import Store
from agentstream.store.database import NewRow, add
from agentstream.store.tables import Base, MessageRow, RunEventRow, RunRow, SessionRow
from conftest import through_sqlalchemy

pytestmark = pytest.mark.anyio

OWNER = "key_test"

HELD = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE $1"
"""The backends whose last statement was one of the held connection's."""
MARKER = "WITH i0 AS (INSERT INTO sessions%"
"""How a group's statement begins: a session's INSERT first."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def a_group(tag: str, count: int) -> list[NewRow]:
    """Sessions, their runs (JSON, a time with its zone, a flag, a float, columns left to
    their defaults), the runs' events and messages (whose keys the database makes)."""
    at = datetime(2026, 12, 6, 9, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))
    rows: list[NewRow] = []
    for n in range(count):
        run, session = f"run_{tag}_{n}", f"ses_{tag}_{n}"
        rows += [
            (SessionRow, {"id": session, "agent_id": "a", "created_at": at}),
            (
                RunRow,
                {
                    "id": run,
                    "kind": "agent",
                    "agent_id": "a",
                    "status": "running",
                    "owner": OWNER,
                    "session_id": session,
                    "created_at": at,
                    "input": {"text": "Grüße ☃", "n": [1.5, None]},
                    "reasoning_requested": True,
                    "cost_usd": 0.25,
                },
            ),
            (RunEventRow, {"run_id": run, "seq": 1, "type": "a", "ts": 1.5, "payload": {}}),
            (RunEventRow, {"run_id": run, "seq": 2, "type": "b", "ts": 2.5, "payload": None}),
            (
                MessageRow,
                {
                    "session_id": session,
                    "run_id": run,
                    "role": "user",
                    "content": "hi",
                    "tool_calls": [{"id": "call_1"}],
                    "provider_state": None,
                },
            ),
        ]
    return rows


async def written(store: Store, tag: str) -> list[tuple[Any, ...]]:
    """Every row of the group ``tag`` (but the keys the database makes), by table, its ids
    made the same for every tag."""
    found: list[tuple[Any, ...]] = []
    async with store.db.session() as db:
        for table in (SessionRow, RunRow, RunEventRow, MessageRow):
            columns = Base.metadata.tables[table.__tablename__].columns
            given = sorted(
                (c for c in columns if c is not columns.get("id") or table is not MessageRow),
                key=lambda c: c.name,
            )
            key = columns["session_id"] if table is MessageRow else columns[0]
            query = select(*given).where(key.like(f"%\\_{tag}\\_%"))
            for row in (await db.execute(query)).all():
                values = [v.replace(tag, "TAG") if isinstance(v, str) else v for v in row]
                found.append((table.__tablename__, *values))
    return sorted(found, key=repr)


@pytest.mark.parametrize("count", [1, 3])
async def test_a_group_is_one_statement_that_writes_what_sqlalchemys_inserts_write(
    postgres_url: str, count: int
) -> None:
    """A group goes to the driver as one statement (none of it through SQLAlchemy's
    execution), a table's one row as its values, several as arrays; read back, every row
    and column is what Core's INSERTs of the same rows write (the keys the database makes
    aside)."""
    store = await Store.open(postgres_url)
    ours, core = uuid.uuid4().hex, uuid.uuid4().hex
    try:
        with through_sqlalchemy("INSERT") as sent:
            await store.db.insert(*a_group(ours, count))
        assert sent == []
        admin = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
        try:
            [statement] = await admin.fetch(HELD.replace("pid", "query"), MARKER)
        finally:
            await admin.close()
        forms = statement["query"].count("VALUES"), statement["query"].count("unnest")
        assert forms == ((3, 1) if count == 1 else (0, 4))  # a run's two events: an array
        async with store.db.engine.begin() as connection:
            await connection.run_sync(add, a_group(core, count))
        by_us = await written(store, ours)
        assert len(by_us) == 5 * count
        assert by_us == await written(store, core)
    finally:
        await store.close()


async def test_a_held_connection_the_server_ended_is_replaced_before_the_next_write(
    postgres_url: str,
) -> None:
    """The held connection's backend is terminated (a restart, a proxy's idle timeout):
    the next write goes in on a new held connection, none of it through the pool."""
    store = await Store.open(postgres_url)
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    admin = await asyncpg.connect(postgres_url.replace("+asyncpg", ""))
    try:
        await store.db.insert(*a_group(first, 1))
        [held] = [row["pid"] for row in await admin.fetch(HELD, MARKER)]
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", held)
        for _ in range(100):  # until the backend is gone, and its connection closed here
            await asyncio.sleep(0.05)
            if held not in [row["pid"] for row in await admin.fetch(HELD, MARKER)]:
                break
        await asyncio.sleep(0.2)

        with through_sqlalchemy("INSERT") as sent:
            await store.db.insert(*a_group(second, 1))
        assert sent == []
        now_held = [row["pid"] for row in await admin.fetch(HELD, MARKER)]
        assert now_held
        assert held not in now_held
        assert len(await written(store, first)) == len(await written(store, second)) == 5
    finally:
        await admin.close()
        await store.close()


async def test_a_connection_lost_under_the_statement_fails_the_write_and_it_is_not_made_again(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement went in, and the connection was lost before its answer came: the
    write fails as a lost pooled connection's does (``OperationalError``, a 503), and is
    not written again through the pool (its rows' keys would refuse it, a 409 for a run
    that was made)."""
    store = await Store.open(postgres_url)
    tag = uuid.uuid4().hex
    execute = asyncpg.Connection.execute

    async def lost_after(connection: asyncpg.Connection, *args: Any, **kwargs: Any) -> str:
        await execute(connection, *args, **kwargs)
        raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle")

    try:
        monkeypatch.setattr(asyncpg.Connection, "execute", lost_after)
        with through_sqlalchemy("INSERT") as sent, pytest.raises(OperationalError) as failed:
            await store.db.insert(*a_group(tag, 1))
        monkeypatch.undo()
        assert failed.value.connection_invalidated
        assert sent == []
        assert len(await written(store, tag)) == 5
    finally:
        await store.close()


@pytest.mark.parametrize("count", [1, 3])
async def test_a_value_longer_than_its_column_is_refused_not_cut_short(
    postgres_url: str, count: int
) -> None:
    """A session's agent id of 101 characters, where the column takes 100: refused, as
    SQLAlchemy's INSERT has it refused (a cast to ``VARCHAR(100)`` would cut it short and
    write it), and nothing of the group goes in."""
    store = await Store.open(postgres_url)
    tag = uuid.uuid4().hex
    rows = [
        (table, values | {"agent_id": "a" * 101}) if table is SessionRow else (table, values)
        for table, values in a_group(tag, count)
    ]
    try:
        with pytest.raises(DBAPIError, match="too long"):
            await store.db.insert(*rows)
        assert await written(store, tag) == []
    finally:
        await store.close()


async def test_a_pool_of_one_connection_is_not_held_and_writes_go_through_it(
    postgres_url: str,
) -> None:
    """Held, the pool's only connection would leave none for reads: then writes go
    SQLAlchemy's way, and reads still find a connection."""
    store = await Store.open(postgres_url, pool_size=1)
    tag = uuid.uuid4().hex
    try:
        with through_sqlalchemy("INSERT") as sent:
            await store.db.insert(*a_group(tag, 2))
        assert len(sent) == 4
        assert len(await written(store, tag)) == 10
        async with store.db.engine.connect() as connection:
            assert (await connection.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await store.close()


async def test_a_group_with_two_inserts_into_one_table_goes_in_their_order(
    postgres_url: str,
) -> None:
    """An agent run's row and a workflow execution's are two INSERTs into ``runs``; in one
    statement they would run in no set order: the group goes SQLAlchemy's way, in order."""
    store = await Store.open(postgres_url)
    tag = uuid.uuid4().hex
    execution = {
        "id": f"run_{tag}_w",
        "kind": "workflow",
        "workflow_id": "f",
        "draft": True,
        "status": "running",
        "created_at": datetime.now(UTC),
        "owner": OWNER,
    }
    try:
        with through_sqlalchemy("INSERT") as sent:
            await store.db.insert(*a_group(tag, 1), (RunRow, execution))
        assert [statement.split()[2] for statement in sent].count("runs") == 2
        assert await store.runs.exists(f"run_{tag}_w")
        assert len(await written(store, tag)) == 6
    finally:
        await store.close()
