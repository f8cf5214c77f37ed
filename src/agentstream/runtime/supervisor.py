"""Every live run of this process, agent runs and workflow executions alike.

A run is a *program* (the agent loop, or the DAG engine) launched as a task of its own,
independent of the request that started it. The supervisor gives each the same life: a
timeout, a cancel from anywhere, exactly one ending that its program's ``finish`` records
(so every viewer gets a terminal event), and, when the server stops, an interruption that
is recorded like any other ending.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self, TypeVar

import anyio
from anyio.lowlevel import checkpoint_if_cancelled

from agentstream import telemetry
from agentstream.errors import ShuttingDown
from agentstream.events import INTERRUPTED, BaseEvent, FailureStatus
from agentstream.runlog import RunLog, Subscription
from agentstream.runtime.ports import Peers
from agentstream.telemetry import RunAbout

__all__ = ["LiveRun", "Stopped", "Supervisor", "internal_error"]

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE = 5.0
"""Seconds the runs still going at shutdown get to record how they ended."""

_AN_AGENT_RUN = RunAbout("agent")

Ending = TypeVar("Ending")
"""What a program returns to its ``finish`` when it ends by itself."""


def internal_error(run_id: str) -> str:
    """What viewers read of an unexpected failure (a public chat may be watching); the
    details go to the log."""
    return f"Internal error; the server log has the details of run {run_id}"


@dataclass(frozen=True, slots=True)
class Stopped:
    """A run ended before its program did: who stopped it, and why, for a person."""

    status: FailureStatus
    message: str


@dataclass(slots=True)
class LiveRun:
    run_id: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stopped: Stopped | None = None
    """Why it is being stopped, if it is: the first stop wins (its timeout is one)."""
    recorded: bool = False
    """Its ending is recorded."""
    _done: anyio.Event | None = None

    @property
    def done(self) -> anyio.Event:
        """Set once the ending is recorded. Made when first asked for: most runs end with
        nobody waiting, and an event keeps a queue for its waiters, 760 bytes a live run."""
        if self._done is None:
            self._done = anyio.Event()
            if self.recorded:
                self._done.set()
        return self._done

    def stop(self, status: FailureStatus, message: str) -> None:
        self.stopped = self.stopped or Stopped(status, message)
        self.scope.cancel()

    def time_out(self, seconds: float) -> None:
        """Its ``seconds`` are up (its message made then: a live run would keep it)."""
        self.stop("timeout", f"Execution timed out after {seconds:g}s")

    def record_ended(self) -> None:
        self.recorded = True
        if self._done is not None:
            self._done.set()


class Supervisor:
    """Launches programs as runs and ends them. Use as an async context manager: leaving it
    interrupts the runs still going and gives them ``SHUTDOWN_GRACE`` seconds to record it."""

    def __init__(self, log: RunLog, *, peers: Peers | None = None) -> None:
        """``peers``: the other processes serving the same runs, in cluster mode."""
        self.log = log
        self.peers = peers
        self.process_id = f"prc_{secrets.token_hex(16)}"
        """This process, as the owner of the runs it executes (leases)."""
        self._live: dict[str, LiveRun] = {}
        self._tasks: set[asyncio.Task[None]] | None = None
        """The runs' tasks, while running: plain asyncio tasks, each lighter to keep than
        one of a task group, which a live run would carry for its whole life."""
        self._draining = False

    async def __aenter__(self) -> Self:
        self._tasks = set()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._tasks is not None
        await self.interrupt_all()
        tasks, self._tasks = self._tasks, None
        for task in tasks:  # what did not end in the grace period
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def admit(self) -> None:
        """Before recording a new run: ``ShuttingDown`` if this process is draining."""
        if self._tasks is None:
            raise RuntimeError("The supervisor is not running")
        if self._draining:
            raise ShuttingDown

    async def drain(self, grace: float) -> None:
        """Stop taking runs (``admit`` refuses), give the live ones ``grace`` seconds to
        finish by themselves, then interrupt the rest, while their viewers are connected:
        each ends with its terminal event."""
        self._draining = True
        with anyio.move_on_after(grace):
            while self._live:
                await next(iter(self._live.values())).done.wait()
        await self.interrupt_all()

    async def interrupt_all(self) -> None:
        """End every live run ``interrupted``, giving them ``SHUTDOWN_GRACE`` seconds to
        record it."""
        live = list(self._live.values())
        for each in live:
            each.stop("interrupted", INTERRUPTED)
        with anyio.move_on_after(SHUTDOWN_GRACE):
            for each in live:
                await each.done.wait()

    def launch(
        self,
        run_id: str,
        program: Callable[[], Awaitable[Ending]],
        finish: Callable[[Ending | Stopped], Awaitable[BaseEvent | None]],
        *,
        timeout: float,
        about: RunAbout = _AN_AGENT_RUN,
    ) -> LiveRun:
        """Run ``program`` as the task of run ``run_id``, within ``timeout`` seconds, then
        hand what it returned (or why it was stopped) to ``finish``, shielded: ``finish``
        records the ending and publishes the run's terminal event, which it returns.
        ``program`` turns its own failures into what it returns; one that escapes is
        logged, and ``finish`` gets an ``error`` ending. The task is observed as a run
        (``telemetry.run``): ``about`` says what it runs."""
        if self._tasks is None:
            raise RuntimeError("The supervisor is not running")
        live = self._live[run_id] = LiveRun(run_id)

        async def execute() -> None:
            with telemetry.run(run_id, about) as observed:
                ending: Ending | Stopped = Stopped("interrupted", INTERRUPTED)
                # A timeout is a stop like any other: a timer, not a cancel scope of its own
                # within the run's, which a live run would keep for its whole life.
                timer = asyncio.get_running_loop().call_later(timeout, live.time_out, timeout)
                try:
                    with live.scope:
                        ending = await program()
                    if live.scope.cancelled_caught and live.stopped is not None:
                        ending = live.stopped
                except Exception:
                    logger.exception("Run %s failed", run_id)
                    ending = Stopped("error", internal_error(run_id))
                finally:
                    timer.cancel()
                    with anyio.CancelScope(shield=True):
                        try:
                            observed.ended(await finish(ending))
                        finally:
                            if self._live.get(run_id) is live:
                                del self._live[run_id]
                            live.record_ended()

        task = asyncio.create_task(execute(), name=run_id)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return live

    async def followable(self, run_id: str) -> None:
        """Once a run is launched: wait until it can be followed from any process. If the
        caller is cancelled meanwhile, so is the run (nobody would know of it)."""
        try:
            with telemetry.timed("sync"):
                await self.log.sync(run_id)
            await checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            self.cancel(run_id, "The request that started the run was cancelled")
            raise

    def cancel(self, run_id: str, reason: str) -> anyio.Event | None:
        """Stop a live run: it ends ``cancelled`` with ``reason``. The event set once it has
        ended, or None if the run is not live here."""
        live = self._live.get(run_id)
        if live is None:
            return None
        live.stop("cancelled", reason)
        return live.done

    def get(self, run_id: str) -> LiveRun | None:
        return self._live.get(run_id)

    async def subscribe(self, run_id: str, *, after: int = 0) -> Subscription | None:
        """Follow a run's events (deltas included) from the first with ``seq > after``,
        whichever process executes it; None if it is in no live log (it ended a while ago):
        its persisted events are in the store."""
        if self.peers is not None and run_id not in self._live:
            # The shared log: this process's copy of a run it no longer executes may be
            # behind (a paused run continued elsewhere).
            return await self.peers.subscribe(run_id, after=after)
        if run_id in self.log:
            return self.log.subscribe(run_id, after=after)
        return None

    async def stop(self, run_id: str, reason: str, *, wait: float) -> bool:
        """Cancel a running run wherever it executes, and wait (up to ``wait`` seconds)
        until it has recorded its ending; False if it is live nowhere. (Without its shared
        log, which expired or went with a Redis restart, the cancel is sent unwatched.)"""
        done = self.cancel(run_id, reason)
        if done is not None:
            with anyio.move_on_after(wait):
                await done.wait()
            return True
        if self.peers is None:
            return False
        last = await self.peers.last_seq(run_id)
        subscription = await self.peers.subscribe(run_id, after=last)
        if subscription is None:  # going (the caller knows), but its shared log is gone
            await self.peers.cancel(run_id, reason)
            return True
        if subscription.ended:
            return False
        try:
            await self.peers.cancel(run_id, reason)
            with anyio.move_on_after(wait):
                while await subscription.next_batch():
                    pass
        finally:
            subscription.close()
        return True
