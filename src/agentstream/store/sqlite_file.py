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
  comes meanwhile finds the lock taken and waits for it in the thread too; the
  checkpoint, for its part, waits at most ``CHECKPOINT_WAIT_MS`` for a write in progress
  or a reader still in the WAL (a backup), and otherwise tries again later.

Reads by key run on the loop too, on the same connection: a WAL reader never waits for a
lock, and the pages that connection keeps stay good while it is the one that writes.
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

    CHECKPOINT_WAIT_MS = 10
    """How long a checkpoint waits for a write in progress, or for a reader to leave the WAL
    so that it can start it over; it holds the lock to write meanwhile."""

    def __init__(self, url: URL) -> None:
        self.engine: Engine = create_engine(
            url.set(drivername="sqlite+pysqlite"), pool_reset_on_return=None
        )
        event.listen(self.engine, "connect", sqlite_pragmas)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="agentstream-sqlite")
        self._on_loop: Connection | None = None
        """Never waits for a lock, never checkpoints."""
        self._in_thread: Connection | None = None
        """Waits for a lock as long as SQLite's busy timeout allows (5 s)."""
        self._checkpointing: Connection | None = None
        """Waits for a lock ``CHECKPOINT_WAIT_MS`` at most: writes wait for a checkpoint."""
        self._writes = 0
        self._closed = False

    def read(self, work: Callable[[Connection], T]) -> T:
        """``work``'s reads, on the loop's connection: the pages it keeps stay good while it
        is the one that writes, where any other connection finds its own stale after each of
        those writes and reads them again (twice the time of a read by key). ``work`` reads
        its results whole (``scalar``, ``first``, ``all``): a result left open would keep the
        connection on its snapshot, and hold the WAL's checkpoints up."""
        connection = self._loop_connection()
        try:
            return work(connection)
        finally:
            connection.rollback()  # SQLAlchemy's own transaction: the next write begins one

    async def write(self, work: Callable[[Connection], T]) -> T:
        """``work`` in one write transaction, committed if it returns: on the loop, or in
        this file's thread if another process holds the lock."""
        connection = self._loop_connection()
        try:
            written = _transact(connection, work)
        except OperationalError as exc:
            if not _busy(exc):
                raise
            done = asyncio.get_running_loop().run_in_executor(self._thread, self._in_turn, work)
            with anyio.CancelScope(shield=True):  # begun, a write ends
                written = await done
        self._writes += 1
        if self._writes % self.CHECKPOINT_EVERY == 0:
            self._thread.submit(self._checkpoint)
        return written

    def _loop_connection(self) -> Connection:
        if self._closed:
            raise RuntimeError("The SQLite file is closed")
        self._on_loop = self._connection(
            self._on_loop, "PRAGMA busy_timeout = 0", "PRAGMA wal_autocheckpoint = 0"
        )
        return self._on_loop

    def _in_turn(self, work: Callable[[Connection], T]) -> T:
        """In this file's thread."""
        self._in_thread = self._connection(self._in_thread)
        return _transact(self._in_thread, work)

    def _checkpoint(self) -> None:
        """In this file's thread: copy the WAL into the file, and have the next write start
        it over instead of growing it."""
        try:
            self._checkpointing = self._connection(
                self._checkpointing, f"PRAGMA busy_timeout = {self.CHECKPOINT_WAIT_MS}"
            )
            with self._checkpointing.begin():
                checkpoint = "PRAGMA wal_checkpoint(RESTART)"
                blocked, _, _ = self._checkpointing.exec_driver_sql(checkpoint).one()
        except Exception:
            logger.exception("Could not checkpoint the SQLite file's WAL")
            return
        if blocked:
            logger.warning(
                "The SQLite file's WAL could not be started over (another connection is "
                "reading it or writing); trying again in %d writes",
                self.CHECKPOINT_EVERY,
            )

    def _connection(self, held: Connection | None, *pragmas: str) -> Connection:
        """``held``, or a new connection with ``pragmas`` in its place if there is none or
        it was lost."""
        if held is not None and not held.invalidated:
            return held
        if held is not None:
            held.close()
        connection = self.engine.connect()
        raw = connection.connection.dbapi_connection
        assert raw is not None
        for pragma in pragmas:
            raw.execute(pragma)
        return connection

    async def close(self) -> None:
        """After the writes and checkpoints under way (the thread takes them in turn)."""
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close_in_thread)
        self._thread.shutdown(wait=False)
        if self._on_loop is not None:
            self._on_loop.close()
            self._on_loop = None
        self.engine.dispose()

    def _close_in_thread(self) -> None:
        for connection in (self._in_thread, self._checkpointing):
            if connection is not None:
                connection.close()
        self._in_thread = self._checkpointing = None


def _transact(connection: Connection, work: Callable[[Connection], T]) -> T:
    with connection.begin():
        return work(connection)


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
