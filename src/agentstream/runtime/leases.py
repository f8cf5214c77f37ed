"""This process's lease on the runs it executes, and the end of runs whose process died.

Every ``lease_seconds / 3`` the process renews its lease and looks for orphaned runs: still
``running``, owned by a process whose lease ran out (killed, its host gone). Each is ended
``interrupted`` with its terminal event, stored once whoever finds it, and put in the shared
live log so its viewers in any process see it end. Its seq comes after anything the run
sent, live-only deltas included, so a viewer resuming from its last seq still gets it.
Paused runs whose approvals were all decided (by a request to a process that was stopping,
say) are continued here too.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence

import anyio

from agentstream.events import INTERRUPTED, Event, RunFailed
from agentstream.runtime.ports import LeaseStore
from agentstream.runtime.supervisor import Supervisor

__all__ = ["SEAL_COPY_MOST", "SEAL_GAP", "Leases"]

SEAL_GAP = 1000
"""How far past the last seq on record an orphaned run's terminal event goes: a process
that died had sent its own viewers events the shared log did not have yet (a batch on its
way, a queue while Redis was away), and whoever resumes from one of them must still find
the end after it."""

SEAL_COPY_MOST = 1000
"""Seqs past the shared log's last at most that an orphaned run's persisted events are
copied over (a dead process's last quiet batch holds about a second of a run's events);
further behind (its stream expired, Redis restarted), the log is ended with the terminal
event alone, and viewers get the rest from the store."""

logger = logging.getLogger(__name__)


class Leases:
    def __init__(
        self,
        store: LeaseStore,
        supervisor: Supervisor,
        *,
        lease_seconds: float,
        each_round: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``each_round`` runs after every renewal (continuing decided paused runs)."""
        self.store = store
        self.supervisor = supervisor
        self.process_id = supervisor.process_id
        self.lease_seconds = lease_seconds
        self.each_round = each_round
        self.address = ""
        self._suspects: set[str] = set()
        """This process's runs that it no longer ran at the last sweep."""
        self._alone = False

    async def join(self, address: str, *, alone: bool) -> int:
        """Register this process (listening on ``address``), then end the runs dead
        processes left; how many. ``alone``: no other process can be alive (this one holds
        the SQLite database)."""
        self.address = address
        self._alone = alone
        await self._register()
        return await self.sweep(alone=alone)

    async def _register(self) -> None:
        await self.store.register(
            self.process_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            address=self.address,
            lease_until=time.time() + self.lease_seconds,
        )

    async def keep(self) -> None:
        """A round every third of a lease, until cancelled."""
        while True:
            await anyio.sleep(self.lease_seconds / 3)
            try:
                await self.round()
            except Exception:
                logger.exception("Lease round failed; trying again")

    async def round(self) -> None:
        """Renew the lease, sweep, then ``each_round``. A lease found taken means the
        others took this process for dead and ended its runs: it stops them too."""
        now = time.time()
        # Alone, no one else can have taken this process for dead: a late round (a busy or
        # suspended machine) still renews, and its runs go on.
        at = None if self._alone else now
        if not await self.store.renew(self.process_id, now + self.lease_seconds, at=at):
            logger.error(
                "This process (%s) was taken for dead (is its clock or database slow?):"
                " its runs were ended by another, so it stops them too",
                self.process_id,
            )
            await self.supervisor.interrupt_all()
            await self._register()
        try:
            await self.sweep()
        finally:
            if self.each_round is not None:
                await self.each_round()

    async def sweep(self, *, alone: bool = False) -> int:
        """End the runs no process runs: those of dead processes, and this one's that it
        has not run for two sweeps (their end could not be saved); how many it ended."""
        at = time.time()
        ended = 0
        found = await self.store.orphaned(self.process_id, at=at, alone=alone)
        gone = {run_id for run_id, _, mine in found if mine and not self.supervisor.get(run_id)}
        for run_id, last_stored, mine in found:
            if mine and run_id not in gone & self._suspects:
                continue  # it runs here, or has just stopped running: next time
            try:
                ended += await self._interrupt(run_id, last_stored)
            except Exception:  # the next round tries again; the others go on now
                logger.exception("Could not end run %s", run_id)
        self._suspects = gone
        await self.store.forget_expired(at)
        if ended:
            logger.warning("Ended %d run(s) left running by a stopped process", ended)
        return ended

    async def _interrupt(self, run_id: str, last_stored: int) -> bool:
        """End an orphaned run with its terminal event, past anything it sent its viewers
        (``SEAL_GAP``); False if another process ended it first. In cluster mode its shared
        live log gets the persisted events it lacks first (those the dead process had not
        sent there yet, ``SEAL_COPY_MOST``), so that a viewer who reads it later misses none
        of them."""
        peers = self.supervisor.peers
        last_live = await peers.last_seq(run_id) if peers is not None else 0
        last = RunFailed(
            run_id=run_id,
            seq=max(last_stored, last_live) + SEAL_GAP,
            ts=time.time(),
            status="interrupted",
            message=INTERRUPTED,
        )
        if not await self.store.interrupt(last):
            return False
        if peers is not None:
            try:
                await peers.seal([*await self._missed(run_id, last_live, last_stored), last])
            except Exception:  # stored: its viewers elsewhere resume to find it
                logger.exception("Could not end the live log of run %s", run_id)
        return True

    async def _missed(self, run_id: str, last_live: int, last_stored: int) -> Sequence[Event]:
        """The run's persisted events its shared live log lacks, if not too many; none if
        they cannot be read (the terminal event goes regardless)."""
        if not 0 < last_stored - last_live <= SEAL_COPY_MOST:
            return []
        try:
            return await self.store.events_between(run_id, last_live, last_stored)
        except Exception:
            logger.exception("Could not read the events of run %s to copy", run_id)
            return []

    async def leave(self) -> None:
        """Give the lease back (every run of this process has ended); if the database is
        away, the lease runs out by itself."""
        try:
            await self.store.leave(self.process_id)
        except Exception as exc:
            logger.warning("Could not give the lease back (%s); it runs out by itself", exc)
