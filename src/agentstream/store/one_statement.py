"""A group of rows inserted on PostgreSQL in one statement, on a connection held for it.

A run start inserts rows into three tables (its session, the run, its first events).
Through SQLAlchemy's async engine that was a checkout from the pool, ``BEGIN``, an
``executemany`` for each table and ``COMMIT``: five trips through its greenlet bridge, 1.39
million of a start's 3.88 million instructions (``bench.start_instructions``). Here the
group is one statement, each table's INSERT a data-modifying CTE, whole on its own without
a transaction around it; and it goes out on asyncpg's own connection, one the store holds
for it (``HeldConnection``): one trip, no checkout (a start cost 2.93 million then).

Where the database answers the statement with an error (a row's fault), nothing went in
and the group goes SQLAlchemy's way, which raises SQLAlchemy's errors, as every other
statement does (a refused row, the callers one by one). A connection lost under the
statement with no answer raises what a lost pooled connection raises: the rows may have
gone in or not, so they are not written again.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy import Column, Dialect, String
from sqlalchemy.exc import OperationalError

from agentstream.store.held_connection import LOST, Closed, HeldConnection
from agentstream.telemetry.metrics import STORE_SECONDS

if TYPE_CHECKING:
    from agentstream.store.database import _CompiledInsert

__all__ = ["OneStatement"]

Shape = tuple["_CompiledInsert", ...]
"""A group's INSERTs, each a table's of the columns its rows give, in the order they go."""

_INSERT_SECONDS = STORE_SECONDS.labels("insert")


class OneStatement:
    """Groups of rows inserted in one statement each, on a connection held for them."""

    def __init__(self, held: HeldConnection) -> None:
        self._held = held

    async def close(self) -> None:
        """Once the write under way is over, give the connection back to the pool."""
        await self._held.close()

    async def insert(self, shape: Shape, rows: list[list[tuple[Any, ...]]]) -> bool:
        """Insert each INSERT's ``rows`` (the driver's values, as ``_CompiledInsert`` makes
        them), all or none. False where nothing went in and SQLAlchemy's way is to write
        them: the database answered the statement with an error (a row's fault; or it
        ended the connection, a restart's ``AdminShutdownError``), or the held connection
        was given back. Where the connection was lost under the statement with no answer,
        it may have gone in or not, as when a ``COMMIT``'s answer is lost: SQLAlchemy's
        ``OperationalError``, as a lost pooled connection raises (a ``503``), and it is not
        written again."""
        async with self._held.turn:
            try:
                driver = await self._held.driver()
            except Closed:
                return False
            sql = _sql(shape, tuple(len(table_rows) == 1 for table_rows in rows))
            started = time.perf_counter()
            try:
                await driver.execute(sql, *_values(rows))
            except LOST as exc:  # it may have gone in
                await self._held.drop()
                raise OperationalError(sql, None, exc, connection_invalidated=True) from exc
            except asyncpg.PostgresError:  # the server's answer: nothing went in
                return False
            _INSERT_SECONDS.observe(time.perf_counter() - started)
            return True


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
    its values (``VALUES``), whose types the database takes from the columns; its rows,
    when there are more, each column's values as an array (``unnest``), so that the SQL,
    prepared once, does not change with their number. Not arrays for one row: asyncpg
    checks each array and each of its values against ``collections.abc``'s classes, 12,800
    instructions an array, 21 of them a run start. The foreign keys hold (a run's event
    refers to the run in the same group): they are checked once the whole statement has
    run."""
    inserts: list[str] = []
    number = 0
    for compiled, one in zip(shape, single, strict=True):
        preparer = compiled.dialect.identifier_preparer
        columns = [compiled.table.columns[key] for key in compiled.keys]
        names = ", ".join(preparer.quote(column.name) for column in columns)
        into = f"INSERT INTO {preparer.format_table(compiled.table)} ({names})"
        first, number = number + 1, number + len(columns)
        if one:
            inserts.append(
                f"{into} VALUES ({', '.join(f'${n}' for n in range(first, number + 1))})"
            )
        else:
            arrays = (
                f"${n}::{_array_of(column, compiled.dialect)}"
                for n, column in enumerate(columns, first)
            )
            inserts.append(f"{into} SELECT * FROM unnest({', '.join(arrays)})")
    *ctes, last = inserts
    if not ctes:
        return last
    return "WITH " + ", ".join(f"i{i} AS ({cte})" for i, cte in enumerate(ctes)) + " " + last


def _array_of(column: Column[Any], dialect: Dialect) -> str:
    """The type of an array of the column's values. A string's without its length: a cast
    to ``VARCHAR(40)`` cuts a longer value short, where the column refuses it."""
    type_ = column.type
    if isinstance(type_, String) and type_.length is not None:
        type_ = String(collation=type_.collation)
    return f"{type_.compile(dialect=dialect)}[]"
