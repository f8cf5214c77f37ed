"""Console sign-ins: an API key exchanged for a session cookie, kept in the database (as a
digest) so that every process knows it and sign-out ends it everywhere at once."""

from __future__ import annotations

import secrets
import time

from sqlalchemy import bindparam, delete, select

from agentstream.store.clock import now
from agentstream.store.database import Database
from agentstream.store.tables import ApiKeyRow, ConsoleSessionRow, digest

__all__ = ["ConsoleSessions"]

_IS_KEY = select(ApiKeyRow.id).where(ApiKeyRow.digest == bindparam("digest"))
_KEY_OF_SESSION = (
    select(ApiKeyRow.name)
    .join(ConsoleSessionRow, ConsoleSessionRow.key_digest == ApiKeyRow.digest)
    .where(
        ConsoleSessionRow.digest == bindparam("digest"),
        ConsoleSessionRow.expires_at > bindparam("moment"),
    )
)


class ConsoleSessions:
    """Sessions that last ``ttl`` seconds, or until sign-out, or until their key is revoked
    (its row deleted: the sessions go with it, by the foreign key's cascade)."""

    def __init__(self, db: Database, *, ttl: float = 12 * 3600) -> None:
        self._db = db
        self.ttl = ttl

    async def open(self, key: str) -> str | None:
        """A new session for the API key ``key``: its token, the one time it can be read;
        None if ``key`` is not a key of this server (found by a read: a wrong key never
        waits for the database's writes). Expired sessions are dropped on the way."""
        key_digest = digest(key)
        if await self._db.read(lambda db: db.scalar(_IS_KEY, {"digest": key_digest})) is None:
            return None
        token = "cs_" + secrets.token_urlsafe(32)
        moment = time.time()
        async with self._db.write() as db:
            await db.execute(
                delete(ConsoleSessionRow).where(ConsoleSessionRow.expires_at <= moment)
            )
            db.add(
                ConsoleSessionRow(
                    digest=digest(token),
                    key_digest=key_digest,
                    created_at=now(),
                    expires_at=moment + self.ttl,
                )
            )
        return token

    async def key_name(self, token: str) -> str | None:
        """The name of the key the live session ``token`` was opened with, or None."""
        values = {"digest": digest(token), "moment": time.time()}
        return await self._db.read(lambda db: db.scalar(_KEY_OF_SESSION, values))

    async def close(self, token: str) -> None:
        async with self._db.write() as db:
            await db.execute(
                delete(ConsoleSessionRow).where(ConsoleSessionRow.digest == digest(token))
            )
