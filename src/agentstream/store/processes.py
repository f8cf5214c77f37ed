"""Serving processes and their leases, and the runs a dead process left behind.

A process registers itself with a lease and renews it while it lives. A run names the
process that runs it (``runs.owner``). A run still ``running`` whose owner's lease has run
out (or that has no owner on record) can never finish: whoever finds it ends it
``interrupted``, once, with its terminal event. The same rules on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import delete, func, or_, select, update

from agentstream.events import Event, RunFailed
from agentstream.store.clock import now
from agentstream.store.database import Database
from agentstream.store.runs import event_values, stored_events
from agentstream.store.tables import RunEventRow, RunRow, ServerProcessRow

__all__ = ["Orphan", "ProcessStore"]


class Orphan(NamedTuple):
    run_id: str
    last_seq: int
    """Of its last persisted event."""
    mine: bool
    """Owned by the asking process: an orphan only if that process no longer runs it (its
    end could not be saved)."""


class ProcessStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def register(
        self, process_id: str, *, host: str, pid: int, address: str, lease_until: float
    ) -> None:
        """On record with a new lease, whether or not its row is still there: a process
        taken for dead registers again before the others have swept its row away."""
        row = {"host": host, "pid": pid, "address": address, "lease_until": lease_until}
        registered = (
            self._db.upsert(ServerProcessRow)
            .values(id=process_id, started_at=now(), **row)
            .on_conflict_do_update(index_elements=[ServerProcessRow.id], set_=row)
        )
        async with self._db.write() as db:
            await db.execute(registered)

    async def renew(self, process_id: str, lease_until: float, *, at: float | None) -> bool:
        """Extend the lease, if it has not run out by ``at`` (None: whenever it ran out);
        False if it has, or the process is no longer on record: others may have ended its
        runs."""
        renewed = update(ServerProcessRow).where(ServerProcessRow.id == process_id)
        if at is not None:
            renewed = renewed.where(ServerProcessRow.lease_until >= at)
        async with self._db.write() as db:
            result = await db.execute(renewed.values(lease_until=lease_until))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def leave(self, process_id: str) -> None:
        async with self._db.write() as db:
            await db.execute(delete(ServerProcessRow).where(ServerProcessRow.id == process_id))

    async def orphaned(self, process_id: str, *, at: float, alone: bool) -> list[Orphan]:
        """Runs still ``running`` that no living process owns, and those of this process
        (``mine``: the caller knows which of them it still runs), with the seq of their last
        persisted event. ``alone``: this process knows it is the only one (it holds the
        SQLite database), so every other owner is dead, lease or not."""
        living = select(ServerProcessRow.id).where(ServerProcessRow.lease_until >= at)
        if alone:
            living = living.where(ServerProcessRow.id == process_id)
        query = (
            select(RunRow.id, func.max(RunEventRow.seq), RunRow.owner)
            .outerjoin(RunEventRow, RunEventRow.run_id == RunRow.id)
            .where(
                RunRow.status == "running",
                or_(
                    RunRow.owner.is_(None),
                    RunRow.owner.not_in(living),
                    RunRow.owner == process_id,
                ),
            )
            .group_by(RunRow.id, RunRow.owner)
        )
        async with self._db.session() as db:
            return [
                Orphan(run_id, last or 0, mine=owner == process_id)
                for run_id, last, owner in (await db.execute(query)).all()
            ]

    async def events_between(self, run_id: str, after: int, through: int) -> list[Event]:
        """The run's persisted events with seq past ``after`` up to ``through``: those of a
        dead process's run that its shared live log may not hold."""
        async with self._db.session() as db:
            return await stored_events(db, run_id, after=after, through=through)

    async def interrupt(self, last: RunFailed) -> bool:
        """End an orphaned run with its terminal event ``last``, in one transaction; False
        if it is no longer running (another process got there first)."""
        async with self._db.write() as db:
            result = await db.execute(
                update(RunRow)
                .where(RunRow.id == last.run_id, RunRow.status == "running")
                .values(
                    status=last.status, error=last.message, paused_state=None, finished_at=now()
                )
            )
            if not result.rowcount:  # type: ignore[attr-defined]
                return False
            db.add(RunEventRow(**event_values(last)))
        return True

    async def forget_expired(self, at: float) -> None:
        """Drop the records of processes whose lease ran out (their runs were ended)."""
        async with self._db.write() as db:
            await db.execute(delete(ServerProcessRow).where(ServerProcessRow.lease_until < at))
