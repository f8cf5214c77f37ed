"""What a process has looked up of the definitions (API keys, agents, chat deployments),
kept for as long as none of them changes.

Every run start looks up its key and its agent (a public chat message, its deployment).
On a SQLite file that runs write all the time, each such read finds the reading
connection's pages stale and costs about 150 µs; on PostgreSQL it is a round trip. The
database keeps a counter that every change to those tables moves on, by triggers
(migration 0014), whoever makes the change: this process, another process of a cluster,
the ``agentstream keys`` commands. A lookup reads that counter first, one row, and reads
the definition itself only when the counter has moved since it was kept. So a revoked key
is refused, and an edited agent used, from the very next request, in every process. (On
PostgreSQL, with a pool of more than two, lookups waiting together share a read of the
counter that goes out after they asked, ``Database.read_value``.)

The lookups of one request (``one_request``: the key's, then the agent's) share one read
of the counter, the first one's: on PostgreSQL a run start makes one round trip fewer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from agentstream.store.database import Database
from agentstream.store.tables import DefinitionsRevisionRow

__all__ = ["DefinitionsCache", "one_request"]

V = TypeVar("V")


_REVISION = str(select(DefinitionsRevisionRow.revision))
"""The same SQL on every dialect, for the driver."""


class _RequestReads:
    """The lookups of one request, made by the task that serves it: the counter each
    cache has read for them."""

    __slots__ = ("revisions", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task: asyncio.Task[Any] | None = task
        self.revisions: dict[DefinitionsCache, int] = {}


_REQUEST: ContextVar[_RequestReads | None] = ContextVar("definitions_request", default=None)


@contextmanager
def one_request() -> Iterator[None]:
    """The lookups the current task makes within the block, one request's, read the
    definitions' counter once (each store's): a change committed while the request is
    under way may be seen by its later lookups or not, as if it had come a moment later or
    sooner; the next request sees it. A change made through the store within the block is
    seen by the block's next lookup (``DefinitionsCache.write``). The tasks it starts
    (a run's) are not the request: each of their lookups reads the counter, as any
    lookup outside a block does."""
    task = asyncio.current_task()
    assert task is not None, "a request is served by a task"
    reads = _RequestReads(task)
    token = _REQUEST.set(reads)
    try:
        yield
    finally:
        _REQUEST.reset(token)
        reads.task = None  # a task started within keeps a copy of the variable
        reads.revisions.clear()


class DefinitionsCache:
    """Lookups by key, each kept under the revision of the definitions it was read at."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._revision: int | None = None
        self._kept: dict[Hashable, Any] = {}

    async def get(self, key: Hashable, read: Callable[[], Awaitable[V | None]]) -> V | None:
        """``read()``'s value, kept under ``key`` until a definition changes. None (nothing
        there) is not kept: an unknown key costs a read each time, and no memory.

        The counter is read before the value, so a value kept under a revision was read
        after it: while the counter stays there, nothing changed since. A request's later
        lookup goes on the counter its first one read: where what is kept is of another
        revision (a newer one, read since), it reads the value and leaves what is kept."""
        revision, read_now = await self._counter()
        if revision != self._revision:
            if not read_now:
                return await read()
            self._kept.clear()
            self._revision = revision
        elif key in self._kept:
            return self._kept[key]  # type: ignore[no-any-return]
        value = await read()
        if value is not None and self._revision == revision:  # no newer revision seen since
            self._kept[key] = value
        return value

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """A transaction that changes definitions (``Database.write``): once it is
        committed, the request that made it (``one_request``) reads the counter again at
        its next lookup."""
        async with self._db.write() as db:
            yield db
        reads = _REQUEST.get()
        if reads is not None:
            reads.revisions.pop(self, None)

    async def _counter(self) -> tuple[int, bool]:
        """The definitions' counter, and whether it was read now: in a request that read it
        already, as read then."""
        reads = _REQUEST.get()
        if reads is None or reads.task is not asyncio.current_task():
            return await self._read_counter(), True
        revision = reads.revisions.get(self)
        if revision is not None:
            return revision, False
        revision = reads.revisions[self] = await self._read_counter()
        return revision, True

    async def _read_counter(self) -> int:
        revision = await self._db.read_value(_REVISION)
        assert revision is not None, "migration 0014 makes the one row"
        return revision  # type: ignore[no-any-return]
