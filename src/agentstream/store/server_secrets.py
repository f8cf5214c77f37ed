"""Secrets that every process over one database must hold alike, made once by whichever
process needs one first."""

from __future__ import annotations

from sqlalchemy import select

from agentstream.store.clock import now
from agentstream.store.database import Database
from agentstream.store.tables import ServerSecretRow

__all__ = ["ServerSecrets"]


class ServerSecrets:
    """Named secrets in the database (the key that signs chat cookies)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def get_or_create(self, name: str, candidate: str) -> str:
        """The secret called ``name``; ``candidate`` becomes it if there is none yet. Of
        processes starting together, the first insert wins and all read what it wrote."""
        async with self._db.write() as db:
            await db.execute(
                self._db.upsert(ServerSecretRow)
                .values(name=name, value=candidate, created_at=now())
                .on_conflict_do_nothing(index_elements=[ServerSecretRow.name])
            )
            kept = await db.execute(
                select(ServerSecretRow.value).where(ServerSecretRow.name == name)
            )
            return kept.scalar_one()
