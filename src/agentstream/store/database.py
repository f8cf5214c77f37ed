"""Sessions on the store's engine, with writes that queue instead of fighting over a lock.

SQLite lets one connection write at a time; the others retry on a timer and, under load,
give up with "database is locked" after seconds. So on SQLite this process's writes take
turns on one lock, shared by every store over the engine. And the events that runs
persist one by one are written in groups: whoever holds the turn writes every event that
is waiting, in one transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import TypeVar

import anyio
from sqlalchemy import inspect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agentstream.store.tables import Base

__all__ = ["Database"]


class Database:
    """One per engine: every store over the engine shares it (and its turn to write)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.session = async_sessionmaker(engine, expire_on_commit=False)
        """For reads."""
        self._turn = anyio.Lock() if engine.dialect.name == "sqlite" else None
        self._insert = sqlite.insert if engine.dialect.name == "sqlite" else postgresql.insert
        self._grouping = anyio.Lock()
        self._waiting: list[_Insert] = []

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """A transaction that writes: committed when the block ends, rolled back on error."""
        turn: AbstractAsyncContextManager[object] = self._turn or nullcontext()
        async with turn, self.session.begin() as db:
            yield db

    def upsert(self, table: type[Base]) -> sqlite.Insert | postgresql.Insert:
        """An INSERT that says what becomes of a row that is already there
        (``on_conflict_do_nothing`` / ``on_conflict_do_update``), decided by the database
        in the one statement, so processes racing to write it cannot both win."""
        return self._insert(table)

    async def insert_or_lock(self, db: AsyncSession, row: _Row) -> tuple[_Row, bool]:
        """``row`` inserted, or else the row already there with its key, locked until ``db``'s
        transaction ends; and whether ``row`` went in. A read-then-insert instead lets two
        processes that create the same thing at once both insert, and one of them fail."""
        mapper = inspect(type(row))
        given = inspect(row).dict
        values = {a.columns[0]: given[a.key] for a in mapper.column_attrs if a.key in given}
        inserted = await db.execute(self._insert(type(row)).values(values).on_conflict_do_nothing())
        key = mapper.primary_key_from_instance(row)
        stored = await db.get_one(type(row), key, with_for_update=True, populate_existing=True)
        return stored, bool(inserted.rowcount)  # type: ignore[attr-defined]

    async def insert(self, *rows: Base | None) -> None:
        """Insert ``rows`` together, with the rows that others wait to insert (group commit).

        Rows go in the given order, each position flushed for the whole group before the
        next, so a row may refer to an earlier one (a run to its new session); None keeps a
        position empty.
        """
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((rows, written))
        async with self._grouping:
            if written.done():
                return written.result()
            group, self._waiting = self._waiting, []
            try:
                await self._insert_group(group)
            except Exception as exc:
                for _, unwritten in group:
                    if not unwritten.done():
                        unwritten.set_exception(exc)
            except BaseException:
                # Cancelled while writing: the others' rows go back for their owners.
                self._waiting[:0] = [item for item in group if item[1] is not written]
                raise
        return written.result()

    async def _insert_group(self, group: list[_Insert]) -> None:
        try:
            async with self.write() as db:
                await _add_in_order(db, [rows for rows, _ in group])
        except Exception:
            if len(group) == 1:
                raise
            await self._insert_each(group)  # one bad row must not fail the others
        else:
            for _, written in group:
                written.set_result(None)

    async def _insert_each(self, group: list[_Insert]) -> None:
        for rows, written in group:
            try:
                async with self.write() as db:
                    await _add_in_order(db, [rows])
            except Exception as exc:
                written.set_exception(exc)
            else:
                written.set_result(None)


_Row = TypeVar("_Row", bound=Base)
_Insert = tuple[tuple[Base | None, ...], asyncio.Future[None]]


async def _add_in_order(db: AsyncSession, inserts: list[tuple[Base | None, ...]]) -> None:
    """Position by position: one flush (a few statements) for each, whatever the count."""
    for position in range(max(len(rows) for rows in inserts)):
        db.add_all(row for rows in inserts if position < len(rows) and (row := rows[position]))
        await db.flush()
