"""One of the PostgreSQL pool's connections, held for single statements sent through
asyncpg's own API, which take turns on it.

A checkout from SQLAlchemy's pool and a statement through its greenlet bridge cost about
300,000 instructions each; asyncpg's own call on a connection already at hand, a tenth of
that (``bench.start_instructions``). A run start makes two statements that are whole on
their own, outside any transaction: the definitions' counter, read once for the request's
lookups (``DefinitionsCache``), and its rows, inserted in one statement (``OneStatement``).
They go on two held connections, one for reads and one for writes: a lookup does not wait
for an INSERT (which a lock taken elsewhere may hold up), nor an INSERT for the reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentstream.store.waiters import tell

__all__ = ["LOST", "READ_TIMEOUT", "Closed", "HeldConnection"]

LOST = (
    asyncpg.PostgresConnectionError,  # ``ConnectionDoesNotExistError``: gone mid-statement
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
)
"""What the driver raises where the connection was lost, or left in a state it cannot go
on from, with no answer to the statement. (A ``PostgresConnectionError`` is a
``PostgresError`` too, which is an answer.)"""


READ_TIMEOUT = 10.0
"""Seconds a read of one value waits for its answer on the held connection before it goes
through the pool: a read by key answers in well under a millisecond, and a connection lost
without a word (a proxy's, a NAT's) would hold every lookup of the process until TCP gives
up, some fifteen minutes."""


_THROUGH_THE_POOL = object()
"""A read the held connection could not make: ``again()`` makes it."""


async def _outcome(read: Awaitable[Any]) -> Any:
    """What ``read`` gives, or the error it raises."""
    try:
        return await read
    except Exception as exc:
        return exc


class Closed(Exception):
    """The connection was given back (``HeldConnection.close``)."""


class HeldConnection:
    """A connection of the engine's pool, held from its first statement until it is lost,
    or this is closed. Statements take turns on it (``turn``)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._connection: AsyncConnection | None = None
        self._driver: asyncpg.Connection | None = None
        self.turn = asyncio.Lock()
        """Held by a statement, and by ``close``, which waits for it."""
        self._closed = False
        self._waiting: dict[str, list[asyncio.Future[Any]]] = {}
        """By statement, the callers waiting for a read that has not gone out yet."""
        self._readers: dict[str, asyncio.Task[None]] = {}
        """By statement, the task reading for them (``value``)."""

    async def driver(self) -> asyncpg.Connection:
        """The connection, once it is this caller's ``turn``: a new one of the pool's where
        the server closed the one held (a restart, a proxy's idle timeout). Raises
        ``Closed`` once this is."""
        assert self.turn.locked()
        if self._closed:
            raise Closed
        if self._driver is None or self._driver.is_closed():
            await self.drop()
            self._connection = await self._engine.connect()
            self._driver = (await self._connection.get_raw_connection()).driver_connection
        assert self._driver is not None
        return self._driver

    async def value(self, sql: str, again: Callable[[], Awaitable[Any]]) -> Any:
        """The one value of ``sql``, a read without parameters, read once for every caller
        waiting as it goes out: they all asked before it did, so it sees what was committed
        before any of them asked. Under load a process's run starts share a read of the
        definitions' counter, each asking while the one before was under way. Where the
        driver fails (the connection lost: dropped; no answer in ``READ_TIMEOUT``) or this
        is closed, ``again()`` reads it, once for them all (through the pool, which raises
        SQLAlchemy's errors).

        A caller waits on a future of its own (``store.waiters``), told by the task that
        reads (``_reads``): a caller cancelled leaves the read to the others, who resume in
        the turn of the event loop after the answer."""
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(sql, []).append(waiter)
        reader = self._readers.get(sql)
        # Done: cancelled before its first step (a shutdown cancelling every task), so none
        # of its code ran; those waiting for it wait for the next caller's.
        if reader is None or reader.done():
            self._readers[sql] = asyncio.create_task(self._reads(sql, again))
        return await waiter

    async def _reads(self, sql: str, again: Callable[[], Awaitable[Any]]) -> None:
        """Reads for the callers waiting, one after the other, each sent in the turn the
        one before has its answer, until none waits."""
        waiting: list[asyncio.Future[Any]] = []
        try:
            while True:
                async with self.turn:
                    # From here on a caller waits for the next read; a caller cancelled, for none.
                    waiting = [waiter for waiter in self._waiting.pop(sql, ()) if not waiter.done()]
                    if not waiting:
                        return
                    outcome = await _outcome(self._read(sql))
                if outcome is _THROUGH_THE_POOL:  # off the connection's turn
                    outcome = await _outcome(again())
                for waiter in waiting:
                    tell(waiter, outcome)
        finally:
            del self._readers[sql]
            for waiter in (*waiting, *self._waiting.pop(sql, ())):  # cancelled: the loop closing
                waiter.cancel()

    async def _read(self, sql: str) -> Any:
        """On the reader's ``turn``: the value, or ``_THROUGH_THE_POOL`` where the driver
        failed (the connection lost: dropped; no answer in ``READ_TIMEOUT``) or this is
        closed. A checkout that fails (the pool busy for ``POOL_WAIT``, the database gone)
        fails the read: through the pool it would wait as long again."""
        try:
            driver = await self.driver()
            return await driver.fetchval(sql, timeout=READ_TIMEOUT)
        except LOST:  # ``TimeoutError`` too: a connection a proxy dropped without a word
            await self.drop()
        except (asyncpg.PostgresError, Closed):
            pass
        return _THROUGH_THE_POOL

    async def drop(self) -> None:
        """Forget the connection (lost, or in a state the driver cannot go on from): the
        next statement holds another."""
        connection, self._connection, self._driver = self._connection, None, None
        if connection is not None:
            try:
                await connection.invalidate()
            finally:  # back to the pool, whatever became of it
                await connection.close()

    async def close(self) -> None:
        """Once the statement under way is over, give the connection back to the pool."""
        async with self.turn:
            self._closed = True
            connection, self._connection, self._driver = self._connection, None, None
            if connection is not None:
                await connection.close()
