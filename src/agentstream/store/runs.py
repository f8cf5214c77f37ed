"""Runs of both kinds (agent runs, workflow executions) and their persisted events: the one
place that writes them.

A run is a row of ``runs`` and its events are rows of ``run_events``, whatever the program
that ran. Writes are few and coarse: the run (with its first events) when it starts, one row
per persisted event (grouped with other runs' events), and the outcome with its last event
in one transaction at the end. Token deltas never come here.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Boolean, Connection, bindparam, case, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from agentstream.events import BaseEvent, Event, EventAdapter, Usage
from agentstream.providers.base import Message
from agentstream.store.clock import now
from agentstream.store.database import Database, NewRow, add
from agentstream.store.paging import Page, newest_first
from agentstream.store.tables import MessageRow, RunEventRow, RunRow, SessionRow

__all__ = ["RunKind", "RunQuery", "RunStore", "event_values", "stored_events"]

logger = logging.getLogger(__name__)

RunKind = Literal["agent", "workflow"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunQuery:
    """Which runs to list: those that match every filter given, a ``page`` at a time."""

    agent_id: str | None = None
    """An agent run's agent."""
    workflow_id: str | None = None
    """An execution's workflow."""
    status: str | None = None
    parent_run_id: str | None = None
    page: Page = field(default_factory=Page)


class RunStore:
    """Create, append, finish, fail, read and interrupt runs, for both kinds alike."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self,
        run: dict[str, Any],
        *,
        first_events: Sequence[BaseEvent] = (),
        session: dict[str, Any] | None = None,
    ) -> None:
        """The run with its first events (and the new session it opens), each given by its
        columns: all or nothing, written with whatever else waits to be written."""
        await self._db.insert(
            (SessionRow, session) if session is not None else None,
            (RunRow, run),
            *(event_row(event) for event in first_events),
        )

    async def append(self, *events: BaseEvent) -> None:
        """Events of a run that came at once: in one write, grouped with other runs' events."""
        await self._db.insert(*(event_row(event) for event in events))

    async def finish(
        self,
        run_id: str,
        *,
        status: str,
        last_event: BaseEvent,
        error: str | None = None,
        content: str | None = None,
        result: Any = None,
        usage: Usage | None = None,
        memory: Sequence[Message] = (),
    ) -> None:
        """Record the outcome with the last event (and an agent's exchange in its session):
        all or nothing. ``usage`` None keeps the counts the run has. A run that is no longer
        ``running`` (ended by another process) is left as it is."""
        counted = usage or Usage()
        outcome = {
            "run_id": run_id,
            "status": status,
            "error": error,
            "content": content,
            "result": result,
            "finished_at": now(),
            "input_tokens": counted.input_tokens,
            "output_tokens": counted.output_tokens,
            "cost_usd": counted.cost_usd,
            "keep_usage": usage is None,
        }
        await self._db.transact(functools.partial(_finish, outcome, last_event, memory))

    async def mark_failed(self, run_id: str, error: str) -> None:
        """Just the status of a running run, when recording its whole outcome failed."""
        async with self._db.write() as db:
            await db.execute(
                update(RunRow)
                .where(RunRow.id == run_id, RunRow.status == "running")
                .values(status="error", error=error, paused_state=None, finished_at=now())
            )

    async def get(self, run_id: str, kind: RunKind) -> RunRow | None:
        """The run, if there is one of this kind."""
        async with self._db.session() as db:
            return await db.scalar(select(RunRow).where(RunRow.id == run_id, RunRow.kind == kind))

    async def page(self, kind: RunKind, query: RunQuery) -> list[RunRow]:
        """A page of the runs of ``kind`` that ``query`` asks for, newest first."""
        chosen = select(RunRow).where(RunRow.kind == kind)
        for column, value in (
            (RunRow.agent_id, query.agent_id),
            (RunRow.workflow_id, query.workflow_id),
            (RunRow.status, query.status),
            (RunRow.parent_run_id, query.parent_run_id),
        ):
            if value is not None:
                chosen = chosen.where(column == value)
        async with self._db.session() as db:
            return list(
                await db.scalars(newest_first(chosen, query.page, RunRow.created_at, RunRow.id))
            )

    async def exists(self, run_id: str) -> bool:
        """Whether a run of either kind has this id."""
        async with self._db.session() as db:
            return await db.scalar(select(RunRow.id).where(RunRow.id == run_id)) is not None

    async def events(self, run_id: str) -> list[Event]:
        """The run's persisted events, in seq order."""
        async with self._db.session() as db:
            return await stored_events(db, run_id)

    async def last_seq(self, run_id: str) -> int:
        async with self._db.session() as db:
            found = await db.scalar(
                select(func.max(RunEventRow.seq)).where(RunEventRow.run_id == run_id)
            )
        return found or 0


async def stored_events(
    db: AsyncSession, run_id: str, *, after: int = 0, through: int | None = None
) -> list[Event]:
    """A run's persisted events with seq past ``after`` (up to ``through``), in seq order."""
    query = select(RunEventRow.payload).where(RunEventRow.run_id == run_id, RunEventRow.seq > after)
    if through is not None:
        query = query.where(RunEventRow.seq <= through)
    rows = await db.scalars(query.order_by(RunEventRow.seq))
    return [EventAdapter.validate_python(payload) for payload in rows]


def event_row(event: BaseEvent) -> NewRow:
    """A persisted event's row, to insert."""
    return RunEventRow, event_values(event)


def event_values(event: BaseEvent) -> dict[str, Any]:
    """The columns of a persisted event's row: the one place an event becomes a row."""
    payload: dict[str, Any] = EventAdapter.dump_python(event, mode="json")  # type: ignore[arg-type]
    return {
        "run_id": event.run_id,
        "seq": event.seq,
        "type": payload["type"],
        "ts": event.ts,
        "payload": payload,
    }


_USAGE: dict[str, Any] = {
    "input_tokens": RunRow.input_tokens,
    "output_tokens": RunRow.output_tokens,
    "cost_usd": RunRow.cost_usd,
}
_ENDED = (
    update(RunRow)
    .where(RunRow.id == bindparam("run_id"), RunRow.status == "running")
    .values(
        {name: bindparam(name) for name in ("status", "error", "content", "result", "finished_at")}
        | {
            name: case((bindparam("keep_usage", type_=Boolean), kept), else_=bindparam(name))
            for name, kept in _USAGE.items()
        }
        | {"paused_state": None}
    )
    .returning(RunRow.session_id)
)
"""A running run's outcome, its usage kept as it is with ``keep_usage``; built once, as
building a statement costs more than running it."""


def _finish(
    outcome: dict[str, Any], last_event: BaseEvent, memory: Sequence[Message], db: Connection
) -> None:
    run_id = outcome["run_id"]
    ended = db.execute(_ENDED, outcome).first()
    if ended is None:  # another process took it for dead and ended it
        found = db.scalar(select(RunRow.status).where(RunRow.id == run_id))
        logger.warning("Run %s was ended already (%s): kept so", run_id, found)
        return
    (session_id,) = ended
    rows: list[NewRow] = [event_row(last_event)]
    if memory:
        assert session_id is not None, "only an agent run has a conversation"
        rows += ((MessageRow, _message_values(session_id, run_id, m)) for m in memory)
    add(db, rows)


def _message_values(session_id: str, run_id: str, message: Message) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "run_id": run_id,
        "role": message.role,
        "content": message.content,
        "tool_calls": [
            {"id": call.id, "name": call.name, "arguments": call.arguments}
            for call in message.tool_calls
        ],
        "tool_call_id": message.tool_call_id,
        "provider_state": message.provider_state,
    }
