"""What the runtime needs of the outside world, as small protocols: of persistence (the store
satisfies them) and, for delegating, of the run manager.

So the runtime imports neither the store (nor SQLAlchemy) nor, from delegation, the manager
that delegation is part of; ``tests/test_layers.py`` holds it to that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from agentstream.agents import StoredAgent
from agentstream.events import BaseEvent, Event, RunFailed, Usage
from agentstream.providers.base import Message
from agentstream.runlog import LogSubscription, Subscription
from agentstream.workflows.definition import Workflow

__all__ = [
    "AgentLookup",
    "AgentRunStore",
    "Approval",
    "EventStore",
    "ExecutionStore",
    "LeaseStore",
    "PausedRun",
    "Peers",
    "Runs",
    "StartedRun",
]


class EventStore(Protocol):
    """What a run's emitter needs of the store: its persisted events, and a last resort
    when recording its outcome failed."""

    async def append_events(self, *events: BaseEvent) -> None:
        """Persist events that came at once, in one write: all or none."""
        ...

    async def mark_failed(self, run_id: str, error: str) -> None: ...


class AgentLookup(Protocol):
    """Saved agents by id: an orchestration's coordinator and entities."""

    async def get_agent(self, agent_id: str) -> StoredAgent | None: ...


class Approval(Protocol):
    """A tool call's approval as recorded, as far as continuing its run needs it."""

    @property
    def call_id(self) -> str: ...

    @property
    def decision(self) -> str:
        """pending, approved or denied."""
        ...

    @property
    def reason(self) -> str | None: ...

    @property
    def decided_by(self) -> str | None: ...


class PausedRun(Protocol):
    """A paused run just claimed for continuing: what it saved, and where it stands."""

    @property
    def usage(self) -> Usage: ...

    @property
    def last_seq(self) -> int: ...

    @property
    def session_id(self) -> str: ...


class AgentRunStore(EventStore, AgentLookup, Protocol):
    """What agent runs need of the store: sessions, the run's record and its outcome,
    approvals and the state a paused run continues from."""

    async def session_agent(self, session_id: str) -> str | None: ...

    async def session_paused(self, session_id: str) -> bool: ...

    async def history(self, session_id: str) -> Sequence[Message]: ...

    async def delete_session(self, session_id: str) -> bool: ...

    async def create_run(
        self,
        *,
        run_id: str,
        agent: StoredAgent,
        session_id: str,
        new_session: bool,
        input: str,
        reasoning_requested: bool,
        first_events: Sequence[BaseEvent],
        owner: str,
        parent_run_id: str | None = None,
    ) -> None:
        """The run, its first events (and its new session): all or nothing. ``owner`` is
        the process that runs it. ``Conflict`` if the session has a live run already."""
        ...

    async def finish_run(
        self,
        run_id: str,
        *,
        status: str,
        content: str | None,
        error: str | None,
        usage: Usage,
        memory: Sequence[Message],
        last_event: BaseEvent,
    ) -> None:
        """The outcome, its last event and the run's exchange in its session: all or
        nothing."""
        ...

    async def last_seq(self, run_id: str) -> int: ...

    async def pause_run(
        self,
        run_id: str,
        *,
        state: dict[str, Any],
        usage: Usage,
        approvals: Sequence[tuple[str, str, dict[str, Any]]],
        last_event: BaseEvent,
    ) -> None: ...

    async def approvals(self, run_id: str) -> Sequence[Approval]: ...

    async def paused_state(self, run_id: str) -> dict[str, Any] | None: ...

    async def claim_paused_run(self, run_id: str, owner: str) -> PausedRun | None: ...

    async def cancel_paused_run(self, run_id: str, last_event: BaseEvent) -> bool: ...

    async def decided_paused_runs(self) -> list[str]: ...


class ExecutionStore(EventStore, Protocol):
    """What workflow executions need of the store: the execution's record and outcome."""

    async def create_execution(
        self,
        execution_id: str,
        workflow: Workflow,
        *,
        version: int | None,
        draft: bool,
        input: Any,
        owner: str,
    ) -> None: ...

    async def finish_execution(
        self,
        execution_id: str,
        *,
        status: str,
        result: Any,
        error: str | None,
        last_event: BaseEvent,
    ) -> None:
        """The outcome with the terminal event: all or nothing."""
        ...


@dataclass(frozen=True, slots=True)
class StartedRun:
    run_id: str
    session_id: str


class LeaseStore(Protocol):
    """What leases need of the store (``store.processes.ProcessStore``)."""

    async def register(
        self, process_id: str, *, host: str, pid: int, address: str, lease_until: float
    ) -> None: ...

    async def renew(self, process_id: str, lease_until: float, *, at: float | None) -> bool: ...

    async def leave(self, process_id: str) -> None: ...

    async def orphaned(
        self, process_id: str, *, at: float, alone: bool
    ) -> Sequence[tuple[str, int, bool]]:
        """Runs going that no living process owns, and this one's: (run id, last stored
        seq, this process's)."""
        ...

    async def events_between(self, run_id: str, after: int, through: int) -> Sequence[Event]: ...

    async def interrupt(self, last: RunFailed) -> bool: ...

    async def forget_expired(self, at: float) -> None: ...


class Peers(Protocol):
    """The other processes serving the same runs (cluster mode), as the supervisor needs
    them."""

    async def subscribe(self, run_id: str, *, after: int) -> Subscription | None:
        """Follow a run that executes in another process; None if none has it."""
        ...

    async def cancel(self, run_id: str, reason: str) -> None:
        """Ask whichever process executes the run to stop it."""
        ...

    async def last_seq(self, run_id: str) -> int:
        """The last seq the run's shared live log holds (0 if none)."""
        ...

    async def seal(self, events: Sequence[Event]) -> None:
        """End the shared live log of a run whose process died: the persisted events it
        lacks, then the run's terminal event (the last of ``events``), then its end."""
        ...


class Runs(Protocol):
    """What delegating to an agent (an orchestration's entity, an orchestration block's
    coordinator) needs of the run manager: start its run, follow it, stop it."""

    async def start(
        self, agent: StoredAgent, message: str, *, parent_run_id: str | None = None
    ) -> StartedRun: ...

    def subscribe(self, run_id: str) -> LogSubscription:
        """Follow a run just started from its first event."""
        ...

    def cancel(self, run_id: str, reason: str) -> anyio.Event | None: ...

    async def cancel_paused(self, run_id: str) -> bool: ...
