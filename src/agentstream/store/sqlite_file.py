"""A store's SQLite file, written from the event loop itself.

A run's write transaction (its creation, its grouped events, its outcome) takes SQLite
tens of µs in WAL mode, where a commit syncs nothing; a trip to a thread and back costs
three times that (``python -m bench.store_writes``). So it runs right on the loop, on a
connection of its own that never waits there:

- for a lock another process holds (the ``agentstream keys`` commands): with a busy
  timeout of 0 that write fails at once, is rolled back, and is done again in this file's
  thread, which waits for the lock as long as SQLite's busy timeout allows;
- for a checkpoint, which syncs the file: that connection never checkpoints; every
  ``CHECKPOINT_EVERY`` writes the thread does, and starts the WAL over (``RESTART``: a
  passive checkpoint never gets to start it over while writes keep coming). A write that
  comes meanwhile finds the lock taken and waits for it in the thread too.

Reads by key run on the loop too: a WAL reader never waits for a lock.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import anyio
from sqlalchemy import URL, Connection, Engine, create_engine, event
from sqlalchemy.exc import OperationalError

__all__ = ["SQLiteFile", "sqlite_pragmas"]

T = TypeVar("T")

logger = logging.getLogger(__name__)


class SQLiteFile:
    """One SQLite file through the standard library's driver."""

    CHECKPOINT_EVERY = 500
    """Writes between two checkpoints: with rows of a few hundred bytes, a WAL of a few MB,
    about what SQLite's own default (1,000 pages) lets it grow to."""

    def __init__(self, url: URL) -> None:
        self.engine: Engine = create_engine(
            url.set(drivername="sqlite+pysqlite"), pool_reset_on_return=None
        )
        event.listen(self.engine, "connect", sqlite_pragmas)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="agentstream-sqlite")
        self._on_loop: Connection | None = None
        self._in_thread: Connection | None = None
        self._writes = 0

    def read(self, work: Callable[[Connection], T]) -> T:
        with self.engine.connect() as connection:
            return work(connection)

    async def write(self, work: Callable[[Connection], T]) -> T:
        """``work`` in one write transaction, committed if it returns: on the loop, or in
        this file's thread if another process holds the lock."""
        if self._on_loop is None or self._on_loop.invalidated:
            self._on_loop = self.engine.connect()
            _never_waiting(self._on_loop)
        try:
            written = _transact(self._on_loop, work)
        except OperationalError as exc:
            if not _busy(exc):
                raise
            done = asyncio.get_running_loop().run_in_executor(self._thread, self._in_turn, work)
            with anyio.CancelScope(shield=True):  # begun, a write ends
                return await done
        self._writes += 1
        if self._writes % self.CHECKPOINT_EVERY == 0:
            self._thread.submit(self._checkpoint)
        return written

    def _in_turn(self, work: Callable[[Connection], T]) -> T:
        """In this file's thread."""
        return _transact(self._thread_connection(), work)

    def _checkpoint(self) -> None:
        """In this file's thread: copy the WAL into the file, and have the next write start
        it over instead of growing it."""
        try:
            connection = self._thread_connection()
            connection.exec_driver_sql("PRAGMA wal_checkpoint(RESTART)").close()
            connection.commit()
        except Exception:
            logger.exception("Could not checkpoint the SQLite file's WAL")

    def _thread_connection(self) -> Connection:
        if self._in_thread is None or self._in_thread.invalidated:
            self._in_thread = self.engine.connect()
        return self._in_thread

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close_in_thread)
        self._thread.shutdown()
        if self._on_loop is not None:
            self._on_loop.close()
        self.engine.dispose()

    def _close_in_thread(self) -> None:
        if self._in_thread is not None:
            self._in_thread.close()


def _transact(connection: Connection, work: Callable[[Connection], T]) -> T:
    with connection.begin():
        return work(connection)


def _never_waiting(connection: Connection) -> None:
    """Fail at once on a lock another process holds, and leave checkpoints to others."""
    raw = connection.connection.dbapi_connection
    assert raw is not None
    raw.execute("PRAGMA busy_timeout = 0")
    raw.execute("PRAGMA wal_autocheckpoint = 0")


def _busy(exc: OperationalError) -> bool:
    """SQLITE_BUSY, or one of its extended codes (a WAL snapshot gone stale)."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


def sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """Every SQLite connection: write-ahead log (readers do not wait for the writer),
    synced at checkpoints, and foreign keys enforced."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
