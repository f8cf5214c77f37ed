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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from sqlalchemy import select

from agentstream.store.database import Database
from agentstream.store.tables import DefinitionsRevisionRow

__all__ = ["DefinitionsCache"]

V = TypeVar("V")


_REVISION = str(select(DefinitionsRevisionRow.revision))
"""The same SQL on every dialect, for the driver."""


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
        after it: while the counter stays there, nothing changed since."""
        revision = await self._db.read_value(_REVISION)
        assert revision is not None, "migration 0014 makes the one row"
        if revision != self._revision:
            self._kept.clear()
            self._revision = revision
        elif key in self._kept:
            return self._kept[key]  # type: ignore[no-any-return]
        value = await read()
        if value is not None and self._revision == revision:  # no newer revision seen since
            self._kept[key] = value
        return value
