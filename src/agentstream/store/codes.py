"""One-time sign-in codes in the database, so that every process redeems the codes any
process mailed, and each code at most once.

Only digests are kept. Each rule is one conditional statement, decided by the database:
a new code replaces the last one for the address (an upsert); a match deletes the code
only if it is still the one compared, still valid and still has tries, so of two processes
redeeming it at once exactly one deletes it; a miss takes one try off, in place.
"""

from __future__ import annotations

import hmac
import time

from sqlalchemy import delete, or_, select, update

from agentstream.store.database import Database
from agentstream.store.tables import ChatCodeRow

__all__ = ["CodeStore"]


class CodeStore:
    """The live code of each (deployment, address), by digest."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def put(self, slug: str, email: str, digest: str, *, ttl: float, tries: int) -> None:
        """Make ``digest`` the code of ``email`` at ``slug`` for ``ttl`` seconds and
        ``tries`` guesses, replacing any code before it; codes past use are dropped."""
        moment = time.time()
        fresh = {"digest": digest, "expires_at": moment + ttl, "tries_left": tries}
        statement = (
            self._db.upsert(ChatCodeRow)
            .values(slug=slug, email=email, **fresh)
            .on_conflict_do_update(index_elements=[ChatCodeRow.slug, ChatCodeRow.email], set_=fresh)
        )
        async with self._db.write() as db:
            await db.execute(
                delete(ChatCodeRow).where(
                    or_(ChatCodeRow.expires_at <= moment, ChatCodeRow.tries_left <= 0)
                )
            )
            await db.execute(statement)

    async def redeem(self, slug: str, email: str, digest: str) -> bool:
        """True if ``digest`` is the live code of ``email`` at ``slug``, which is then gone:
        true once, whichever processes ask. A wrong digest uses up one of its tries."""
        async with self._db.write() as db:
            live = (
                ChatCodeRow.slug == slug,
                ChatCodeRow.email == email,
                ChatCodeRow.expires_at > time.time(),
                ChatCodeRow.tries_left > 0,
            )
            issued = await db.scalar(select(ChatCodeRow.digest).where(*live))
            if issued is None:
                return False
            compared = (*live, ChatCodeRow.digest == issued)
            if hmac.compare_digest(issued, digest):
                taken = await db.execute(delete(ChatCodeRow).where(*compared))
                return bool(taken.rowcount)  # type: ignore[attr-defined]
            await db.execute(
                update(ChatCodeRow).where(*compared).values(tries_left=ChatCodeRow.tries_left - 1)
            )
            return False
