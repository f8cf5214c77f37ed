"""A group of rows inserted on PostgreSQL in one statement, on a connection held for it.

A run start inserts rows into three tables (its session, the run, its first events).
Through SQLAlchemy's async engine that was a checkout from the pool, ``BEGIN``, an
``executemany`` for each table and ``COMMIT``: five trips through its greenlet bridge, 1.39
million of a start's 3.88 million instructions (``bench.start_instructions``). Here the
group is one statement, each table's INSERT a data-modifying CTE, whole on its own without
a transaction around it; and it goes out on asyncpg's own connection, one of the pool's
held for these writes, which take turns (``Database.insert``): one trip, no checkout, and
a start costs 2.91 million.

It only ever writes the group or leaves it unwritten: where the driver raises (a row the
database refuses, a lost connection), the group goes SQLAlchemy's way, which raises
SQLAlchemy's errors, as every other statement does.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentstream.telemetry.metrics import STORE_SECONDS

if TYPE_CHECKING:
    from agentstream.store.database import _CompiledInsert

__all__ = ["OneStatement"]

Shape = tuple["_CompiledInsert", ...]
"""A group's INSERTs, each a table's of the columns its rows give, in the order they go."""

_INSERT_SECONDS = STORE_SECONDS.labels("insert")


class OneStatement:
    """Groups of rows inserted in one statement each, on a connection of the engine's pool
    that it holds (from its first write until it fails, or it is closed)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._connection: AsyncConnection | None = None
        self._driver: asyncpg.Connection | None = None

    async def insert(self, shape: Shape, rows: list[list[tuple[Any, ...]]]) -> bool:
        """Insert each INSERT's ``rows`` (the driver's values, as ``_CompiledInsert`` makes
        them), all or none; False where the driver raised: then none went in (or, if the
        connection was lost after the database committed, the rows are there and writing
        them again fails on their keys, as when a ``COMMIT``'s answer is lost)."""
        started = time.perf_counter()
        try:
            driver = self._driver or await self._connect()
            single = tuple(len(table_rows) == 1 for table_rows in rows)
            await driver.execute(_sql(shape, single), *_values(rows))
        except asyncpg.PostgresError:  # refused, or the server ended the connection
            if self._driver is not None and self._driver.is_closed():  # (a restart)
                await self._drop()
            return False
        except (asyncpg.InterfaceError, asyncpg.InternalClientError, OSError):
            await self._drop()  # lost, or in a state the driver cannot go on from
            return False
        _INSERT_SECONDS.observe(time.perf_counter() - started)
        return True

    async def _connect(self) -> asyncpg.Connection:
        """The driver's connection, through the engine (its codecs, its connect options)."""
        self._connection = await self._engine.connect()
        raw = await self._connection.get_raw_connection()
        self._driver = raw.driver_connection
        assert self._driver is not None
        return self._driver

    async def _drop(self) -> None:
        """Forget a connection that failed: the next write opens another."""
        connection, self._connection, self._driver = self._connection, None, None
        if connection is not None:
            await connection.invalidate()
            await connection.close()

    async def close(self) -> None:
        """Give the connection back to the pool."""
        connection, self._connection, self._driver = self._connection, None, None
        if connection is not None:
            await connection.close()


def _values(rows: list[list[tuple[Any, ...]]]) -> list[Any]:
    """The statement's parameters: a table's one row's values, or else its columns'."""
    values: list[Any] = []
    for table_rows in rows:
        if len(table_rows) == 1:
            values += table_rows[0]
        else:
            values += map(list, zip(*table_rows, strict=True))
    return values


@functools.lru_cache(maxsize=256)
def _sql(shape: Shape, single: tuple[bool, ...]) -> str:
    """One statement: an INSERT per table, all but the last as CTEs. A table's one row is
    its values (``VALUES``); its rows, when there are more, each column's values as an
    array (``unnest``), so that the SQL, prepared once, does not change with their number.
    Not arrays for one row: asyncpg checks each array and each of its values against
    ``collections.abc``'s classes, 13,000 instructions an array, 20 of them a run start.
    The foreign keys hold (a run's event refers to the run in the same group): they are
    checked once the whole statement has run."""
    inserts: list[str] = []
    number = 0
    for compiled, one in zip(shape, single, strict=True):
        quote = compiled.dialect.identifier_preparer.quote
        columns = [compiled.table.columns[key] for key in compiled.keys]
        casts = []
        for column in columns:
            number += 1
            casts.append(f"${number}::{column.type.compile(dialect=compiled.dialect)}")
        names = ", ".join(quote(column.name) for column in columns)
        into = f"INSERT INTO {quote(compiled.table.name)} ({names})"
        if one:
            inserts.append(f"{into} VALUES ({', '.join(casts)})")
        else:
            inserts.append(f"{into} SELECT * FROM unnest({'[], '.join(casts)}[])")
    *ctes, last = inserts
    if not ctes:
        return last
    return "WITH " + ", ".join(f"i{i} AS ({cte})" for i, cte in enumerate(ctes)) + " " + last
