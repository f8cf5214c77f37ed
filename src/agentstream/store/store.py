"""The store: a few async methods over SQLAlchemy, the same for SQLite and PostgreSQL.

Agents, API keys, chat deployments, sessions with their messages, and agent runs, which
are written by the one run path (``agentstream.store.runs``) that workflow executions
share.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Row, bindparam, delete, event, func, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agentstream.agents import AgentSpec, StoredAgent
from agentstream.datadir import make_private, open_private
from agentstream.deployments import DeploymentSettings
from agentstream.errors import Conflict
from agentstream.events import BaseEvent, Event, Usage
from agentstream.providers.base import Message, RequestedToolCall
from agentstream.store.clock import now, utc
from agentstream.store.console_sessions import ConsoleSessions
from agentstream.store.database import Database
from agentstream.store.definitions_cache import DefinitionsCache
from agentstream.store.paging import Page, newest_first
from agentstream.store.runs import RunQuery, RunStore, event_values
from agentstream.store.sqlite_file import sqlite_pragmas
from agentstream.store.tables import (
    AgentRow,
    ApiKeyRow,
    ApprovalRow,
    DeploymentRow,
    MessageRow,
    RunEventRow,
    RunRow,
    SessionRow,
    digest,
)

__all__ = [
    "ApiKey",
    "ApprovalRecord",
    "DeployedWorkflow",
    "PausedRun",
    "RunRecord",
    "Store",
    "StoredDeployment",
    "sqlite_file",
]

_MIGRATIONS = Path(__file__).with_name("migrations")

# The reads of every run start, built once: building a statement costs more than running it.
_KEY_NAME = select(ApiKeyRow.name).where(ApiKeyRow.digest == bindparam("digest"))
_AGENT = select(AgentRow.__table__).where(AgentRow.id == bindparam("id"))
_SESSION_AGENT = select(SessionRow.agent_id).where(SessionRow.id == bindparam("id"))
_SESSION_PAUSED = select(RunRow.id).where(
    RunRow.session_id == bindparam("id"), RunRow.status == "awaiting_approval"
)


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key as it can be shown: never the key itself (only its digest is kept)."""

    id: int
    name: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class DeployedWorkflow:
    """A workflow as a deployment pinned it."""

    definition: dict[str, Any]
    """As clients write it (``agentstream.workflows.parse_workflow`` reads it)."""
    version: int


@dataclass(frozen=True, slots=True)
class StoredDeployment:
    settings: DeploymentSettings
    password_hash: str | None
    target: StoredAgent | DeployedWorkflow
    """The agent or workflow snapshot this deployment serves (its times are the
    deployment's)."""
    entities: dict[str, StoredAgent] | None
    """For an orchestration, its entities as deployed (None: deployed before they were
    pinned, so they are looked up at each run)."""
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A conversation as a list shows it."""

    id: str
    agent_id: str
    created_at: datetime
    runs: int
    last_run_at: datetime | None


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    run_id: str
    call_id: str
    tool_name: str
    tool_input: dict[str, Any]
    decision: str
    """pending, approved or denied."""
    reason: str | None
    decided_by: str | None
    requested_at: datetime
    decided_at: datetime | None


@dataclass(frozen=True, slots=True)
class PausedRun:
    """A paused run just claimed for continuing: what it saved, and where its seqs stand."""

    state: dict[str, Any]
    usage: Usage
    last_seq: int
    session_id: str


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    agent_id: str
    agent_version: int
    session_id: str
    status: str
    input: str
    content: str | None
    error: str | None
    usage: Usage
    reasoning_requested: bool
    created_at: datetime
    finished_at: datetime | None
    parent_run_id: str | None = None
    """The run that started this one (``RunRow.parent_run_id``)."""


POOL_WAIT = 30.0
"""Seconds a query waits for one of the pool's connections before it fails (a 503)."""


class Store:
    """Agents, API keys, sessions with their messages, runs and their persisted events."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.db = Database(engine)
        """Shared with the other stores over this engine (``KnowledgeStore``, ...)."""
        self.runs = RunStore(self.db)
        """Runs of both kinds: agent runs here, workflow executions in ``WorkflowStore``."""
        self.console_sessions = ConsoleSessions(self.db)
        self._definitions = DefinitionsCache(self.db)
        """API keys, agents and deployments as looked up, while none of them changes."""

    @classmethod
    async def open(cls, url: str, *, pool_size: int = 15) -> Store:
        """Connect and bring the schema to the latest migration. On PostgreSQL, the engine
        keeps ``pool_size`` connections and opens no more: connections opened for a burst
        and closed after it (SQLAlchemy's default overflow) cost each run of a busy process
        a new connection, its TLS attempt and its statements prepared again."""
        if (database := sqlite_file(url)) is not None:
            _private_database(database)
        pool: dict[str, Any] = {}
        if make_url(url).get_backend_name() != "sqlite":
            pool = {"pool_size": pool_size, "max_overflow": 0, "pool_timeout": POOL_WAIT}
        engine = create_async_engine(url, pool_reset_on_return=None, **pool)
        if engine.dialect.name == "sqlite":
            event.listen(engine.sync_engine, "connect", sqlite_pragmas)
        async with engine.connect() as connection:
            await connection.run_sync(_upgrade)
        return cls(engine)

    async def close(self) -> None:
        await self.db.close()

    # API keys

    async def create_api_key(self, name: str) -> str:
        """A new key; only its digest is kept, so this is the one time it can be read."""
        key = "as_" + secrets.token_urlsafe(24)
        async with self._definitions.write() as db:
            db.add(ApiKeyRow(name=name, digest=digest(key), created_at=now()))
        return key

    async def api_key_name(self, key: str) -> str | None:
        """The name the key was created with, or None if it is not a key of this server."""
        values = {"digest": digest(key)}
        return await self._definitions.get(
            ("key", values["digest"]), lambda: self.db.read(lambda db: db.scalar(_KEY_NAME, values))
        )

    async def is_api_key(self, key: str) -> bool:
        return await self.api_key_name(key) is not None

    async def list_api_keys(self) -> list[ApiKey]:
        async with self.db.session() as db:
            rows = await db.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id))
            return [ApiKey(row.id, row.name, utc(row.created_at)) for row in rows]

    async def revoke_api_key(self, key_id: int) -> bool:
        """Delete the key: from the next request on, it is refused. False if there is none."""
        async with self._definitions.write() as db:
            deleted = await db.execute(delete(ApiKeyRow).where(ApiKeyRow.id == key_id))
        return bool(deleted.rowcount)  # type: ignore[attr-defined]

    # Agents

    async def put_agent(self, spec: AgentSpec) -> StoredAgent:
        """Create the agent, or replace it with a new version if its definition changed."""
        definition = spec.model_dump(mode="json")
        new = AgentRow(id=spec.id, version=1, spec=definition, created_at=now())
        new.updated_at = new.created_at
        async with self._definitions.write() as db:
            row, inserted = await self.db.insert_or_lock(db, new)
            if not inserted and row.spec != definition:
                row.version += 1
                row.spec = definition
                row.updated_at = now()
        return _stored_agent(row, row.spec, row.version)

    async def get_agent(self, agent_id: str) -> StoredAgent | None:
        async def read() -> StoredAgent | None:
            row = await self.db.read(lambda db: db.execute(_AGENT, {"id": agent_id}).first())
            return None if row is None else _stored_agent(row, row.spec, row.version)

        return await self._definitions.get(("agent", agent_id), read)

    async def list_agents(self) -> list[StoredAgent]:
        async with self.db.session() as db:
            rows = await db.scalars(select(AgentRow).order_by(AgentRow.id))
            return [_stored_agent(row, row.spec, row.version) for row in rows]

    async def delete_agent(self, agent_id: str) -> bool:
        async with self._definitions.write() as db:
            result = await db.execute(delete(AgentRow).where(AgentRow.id == agent_id))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    # Chat deployments

    async def put_deployment(
        self,
        settings: DeploymentSettings,
        *,
        target: StoredAgent | DeployedWorkflow,
        entities: Mapping[str, StoredAgent] | None = None,
        password_hash: str | None,
    ) -> StoredDeployment:
        """Create or replace a deployment, pinning the given agent or workflow snapshot (and
        an orchestration's entities)."""
        agent = target if isinstance(target, StoredAgent) else None
        workflow = target if isinstance(target, DeployedWorkflow) else None
        fields = {
            "settings": settings.model_dump(mode="json"),
            "password_hash": password_hash,
            "agent_spec": agent.spec.model_dump(mode="json") if agent else None,
            "agent_version": agent.version if agent else None,
            "workflow_definition": workflow.definition if workflow else None,
            "workflow_version": workflow.version if workflow else None,
            "entities": {
                entity_id: {"spec": e.spec.model_dump(mode="json"), "version": e.version}
                for entity_id, e in (entities or {}).items()
            },
            "updated_at": now(),
        }
        new = DeploymentRow(slug=settings.slug, created_at=fields["updated_at"], **fields)
        async with self._definitions.write() as db:
            row, inserted = await self.db.insert_or_lock(db, new)
            if not inserted:
                for name, value in fields.items():
                    setattr(row, name, value)
        return _stored_deployment(row)

    async def get_deployment(self, slug: str) -> StoredDeployment | None:
        async def read() -> StoredDeployment | None:
            async with self.db.session() as db:
                row = await db.get(DeploymentRow, slug)
            return None if row is None else _stored_deployment(row)

        return await self._definitions.get(("deployment", slug), read)

    async def list_deployments(self) -> list[StoredDeployment]:
        async with self.db.session() as db:
            rows = await db.scalars(select(DeploymentRow).order_by(DeploymentRow.slug))
            return [_stored_deployment(row) for row in rows]

    async def delete_deployment(self, slug: str) -> bool:
        async with self._definitions.write() as db:
            result = await db.execute(delete(DeploymentRow).where(DeploymentRow.slug == slug))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    # Sessions and runs

    async def session_agent(self, session_id: str) -> str | None:
        """The agent a session belongs to, or None if there is no such session."""
        return await self.db.read(lambda db: db.scalar(_SESSION_AGENT, {"id": session_id}))

    async def list_sessions(self, agent_id: str | None, page: Page) -> list[SessionSummary]:
        """Sessions, newest first, of one agent or all, a ``page`` at a time."""
        of_session = RunRow.session_id == SessionRow.id
        query = select(  # per session listed, not per session stored: counted for the page
            SessionRow,
            select(func.count(RunRow.id)).where(of_session).scalar_subquery(),
            select(func.max(RunRow.created_at)).where(of_session).scalar_subquery(),
        )
        if agent_id is not None:
            query = query.where(SessionRow.agent_id == agent_id)
        query = newest_first(query, page, SessionRow.created_at, SessionRow.id)
        async with self.db.session() as db:
            return [
                SessionSummary(
                    id=session.id,
                    agent_id=session.agent_id,
                    created_at=utc(session.created_at),
                    runs=runs,
                    last_run_at=None if last is None else utc(last),
                )
                for session, runs, last in await db.execute(query)
            ]

    async def session_created_at(self, session_id: str) -> datetime | None:
        async with self.db.session() as db:
            found = await db.scalar(
                select(SessionRow.created_at).where(SessionRow.id == session_id)
            )
        return None if found is None else utc(found)

    async def session_runs(self, session_id: str) -> list[RunRecord]:
        async with self.db.session() as db:
            rows = await db.scalars(
                select(RunRow).where(RunRow.session_id == session_id).order_by(RunRow.created_at)
            )  # only agent runs have a session
            return [_run_record(row) for row in rows]

    async def delete_session(self, session_id: str) -> bool:
        """The session with its messages, runs, their events and approvals. ``Conflict`` if
        one of its runs is going (in any process)."""
        async with self.db.write() as db:
            going = await db.scalar(
                select(RunRow.id).where(RunRow.session_id == session_id, RunRow.status == "running")
            )
            if going is not None:
                raise Conflict(
                    f"Session {session_id!r} has a run in progress: cancel it first",
                    field="session_id",
                )
            result = await db.execute(delete(SessionRow).where(SessionRow.id == session_id))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def history(self, session_id: str) -> list[Message]:
        async with self.db.session() as db:
            rows = await db.scalars(
                select(MessageRow)
                .where(MessageRow.session_id == session_id)
                .order_by(MessageRow.id)
            )
            return [_message(row) for row in rows]

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
        """The run, its first events (and its new session): all or nothing. ``Conflict`` if
        the session has a live run (another process may have started it)."""
        try:
            await self.runs.create(
                {
                    "id": run_id,
                    "kind": "agent",
                    "agent_id": agent.spec.id,
                    "agent_version": agent.version,
                    "session_id": session_id,
                    "status": "running",
                    "input": input,
                    "reasoning_requested": reasoning_requested,
                    "created_at": now(),
                    "owner": owner,
                    "parent_run_id": parent_run_id,
                },
                first_events=first_events,
                session={"id": session_id, "agent_id": agent.spec.id, "created_at": now()}
                if new_session
                else None,
            )
        except IntegrityError:  # the database's one live run per session
            raise Conflict(
                f"Session {session_id!r} already has a run in progress", field="session_id"
            ) from None

    async def append_events(self, *events: BaseEvent) -> None:
        await self.runs.append(*events)

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
        """Record the outcome, its last event, and the run's exchange in its session: all
        or nothing."""
        await self.runs.finish(
            run_id,
            status=status,
            last_event=last_event,
            error=error,
            content=content,
            usage=usage,
            memory=memory,
        )

    async def list_runs(self, query: RunQuery) -> list[RunRecord]:
        """Agent runs, newest first, a page at a time (``RunQuery``)."""
        return [_run_record(row) for row in await self.runs.page("agent", query)]

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The agent run (None for a workflow execution's id)."""
        row = await self.runs.get(run_id, "agent")
        return None if row is None else _run_record(row)

    async def run_exists(self, run_id: str) -> bool:
        """Whether any run, an agent run or a workflow execution, has this id."""
        return await self.runs.exists(run_id)

    async def run_events(self, run_id: str) -> list[Event]:
        return await self.runs.events(run_id)

    # Approvals

    async def pause_run(
        self,
        run_id: str,
        *,
        state: dict[str, Any],
        usage: Usage,
        approvals: Sequence[tuple[str, str, dict[str, Any]]],
        last_event: BaseEvent,
    ) -> None:
        """Save what the run needs to continue and the approvals it waits for: all or nothing."""
        paused_at = now()
        async with self.db.write() as db:
            db.add(RunEventRow(**event_values(last_event)))
            run = await db.get_one(RunRow, run_id)
            run.status = "awaiting_approval"
            run.paused_state = state
            run.input_tokens, run.output_tokens = usage.input_tokens, usage.output_tokens
            run.cost_usd = usage.cost_usd
            db.add_all(
                ApprovalRow(
                    run_id=run_id,
                    call_id=call_id,
                    tool_name=name,
                    tool_input=tool_input,
                    decision="pending",
                    requested_at=paused_at,
                )
                for call_id, name, tool_input in approvals
            )

    async def approvals(self, run_id: str) -> list[ApprovalRecord]:
        async with self.db.session() as db:
            rows = await db.scalars(
                select(ApprovalRow)
                .where(ApprovalRow.run_id == run_id)
                .order_by(ApprovalRow.requested_at, ApprovalRow.call_id)
            )
            return [_approval(row) for row in rows]

    async def decide(
        self, run_id: str, call_id: str, *, approved: bool, reason: str | None, decided_by: str
    ) -> bool:
        """Record a decision on a pending approval; False if it was not pending (any more)."""
        async with self.db.write() as db:
            result = await db.execute(
                update(ApprovalRow)
                .where(
                    ApprovalRow.run_id == run_id,
                    ApprovalRow.call_id == call_id,
                    ApprovalRow.decision == "pending",
                )
                .values(
                    decision="approved" if approved else "denied",
                    reason=reason,
                    decided_by=decided_by,
                    decided_at=now(),
                )
            )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def paused_state(self, run_id: str) -> dict[str, Any] | None:
        """What a paused run saved, without claiming it; None if it is not paused."""
        async with self.db.session() as db:
            return await db.scalar(
                select(RunRow.paused_state).where(
                    RunRow.id == run_id, RunRow.status == "awaiting_approval"
                )
            )

    async def claim_paused_run(self, run_id: str, owner: str) -> PausedRun | None:
        """Move a paused run back to ``running`` for whoever continues it; None if someone
        else did (or it is not paused)."""
        async with self.db.write() as db:
            result = await db.execute(
                update(RunRow)
                .where(RunRow.id == run_id, RunRow.status == "awaiting_approval")
                .values(status="running", owner=owner)
            )
            if not result.rowcount:  # type: ignore[attr-defined]
                return None
            run = await db.get_one(RunRow, run_id)
        assert run.paused_state is not None
        assert run.session_id is not None
        return PausedRun(
            state=run.paused_state,
            usage=_run_record(run).usage,
            last_seq=await self.runs.last_seq(run_id),  # claimed: no one else writes to it
            session_id=run.session_id,
        )

    async def session_paused(self, session_id: str) -> bool:
        """Whether the session has a run waiting for approval (it takes no new message)."""
        found = await self.db.read(lambda db: db.scalar(_SESSION_PAUSED, {"id": session_id}))
        return found is not None

    async def mark_failed(self, run_id: str, error: str) -> None:
        """Just the status, when recording the whole outcome failed."""
        await self.runs.mark_failed(run_id, error)

    async def cancel_paused_run(self, run_id: str, last_event: BaseEvent) -> bool:
        """End a run that waits for approval as cancelled; its open approvals with it."""
        async with self.db.write() as db:
            result = await db.execute(
                update(RunRow)
                .where(RunRow.id == run_id, RunRow.status == "awaiting_approval")
                .values(
                    status="cancelled", error="Run cancelled", paused_state=None, finished_at=now()
                )
            )
            if not result.rowcount:  # type: ignore[attr-defined]
                return False
            await db.execute(
                update(ApprovalRow)
                .where(ApprovalRow.run_id == run_id, ApprovalRow.decision == "pending")
                .values(decision="cancelled", decided_at=now())
            )
            db.add(RunEventRow(**event_values(last_event)))
        return True

    async def decided_paused_runs(self) -> list[str]:
        """Paused runs whose approvals are all decided: a crash came between the last
        decision and the run going on."""
        async with self.db.session() as db:
            pending = select(ApprovalRow.run_id).where(ApprovalRow.decision == "pending")
            rows = await db.scalars(
                select(RunRow.id).where(
                    RunRow.status == "awaiting_approval", RunRow.id.not_in(pending)
                )
            )
            return list(rows)

    async def last_seq(self, run_id: str) -> int:
        return await self.runs.last_seq(run_id)


def _upgrade(connection: Connection) -> None:
    """Migrate to the latest revision. On SQLite, foreign keys are off meanwhile, as SQLite's
    own procedure for rebuilding a table asks (else dropping the old copy of ``runs`` would
    delete its events with it), and checked before they are back on."""
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:  # outside any transaction, where the pragma takes effect
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
    connection.commit()
    if sqlite:
        if broken := connection.exec_driver_sql("PRAGMA foreign_key_check").all():
            raise RuntimeError(f"The migrated database breaks foreign keys: {broken[:5]}")
        connection.exec_driver_sql("PRAGMA foreign_keys=ON")
        connection.commit()


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL; None for another database, or one in memory."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _private_database(path: Path) -> None:
    """SQLite makes its ``-wal`` and ``-shm`` files with the database file's mode, so a
    database file created private before SQLite opens it keeps them private too."""
    os.close(open_private(path))
    for companion in ("-wal", "-shm"):
        make_private(path.with_name(path.name + companion))


def _stored_agent(
    row: AgentRow | DeploymentRow | Row[Any], spec: dict[str, Any], version: int
) -> StoredAgent:
    """An agent as stored, or as a deployment pinned it (with the deployment's times)."""
    return StoredAgent(
        spec=AgentSpec.model_validate(spec),
        version=version,
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
    )


def _stored_deployment(row: DeploymentRow) -> StoredDeployment:
    target: StoredAgent | DeployedWorkflow
    if row.agent_spec is not None and row.agent_version is not None:
        target = _stored_agent(row, row.agent_spec, row.agent_version)
    else:
        assert row.workflow_definition is not None
        assert row.workflow_version is not None
        target = DeployedWorkflow(row.workflow_definition, row.workflow_version)
    return StoredDeployment(
        settings=DeploymentSettings.model_validate(row.settings),
        password_hash=row.password_hash,
        target=target,
        entities=None
        if row.entities is None
        else {
            entity_id: _stored_agent(row, pinned["spec"], pinned["version"])
            for entity_id, pinned in row.entities.items()
        },
        updated_at=utc(row.updated_at),
    )


def _run_record(row: RunRow) -> RunRecord:
    assert row.kind == "agent", row.kind
    assert row.agent_id is not None
    assert row.agent_version is not None
    assert row.session_id is not None
    assert row.reasoning_requested is not None
    return RunRecord(
        id=row.id,
        agent_id=row.agent_id,
        agent_version=row.agent_version,
        session_id=row.session_id,
        status=row.status,
        input=row.input,
        content=row.content,
        error=row.error,
        usage=Usage(
            input_tokens=row.input_tokens, output_tokens=row.output_tokens, cost_usd=row.cost_usd
        ),
        reasoning_requested=row.reasoning_requested,
        created_at=utc(row.created_at),
        finished_at=None if row.finished_at is None else utc(row.finished_at),
        parent_run_id=row.parent_run_id,
    )


def _approval(row: ApprovalRow) -> ApprovalRecord:
    return ApprovalRecord(
        run_id=row.run_id,
        call_id=row.call_id,
        tool_name=row.tool_name,
        tool_input=row.tool_input,
        decision=row.decision,
        reason=row.reason,
        decided_by=row.decided_by,
        requested_at=utc(row.requested_at),
        decided_at=None if row.decided_at is None else utc(row.decided_at),
    )


def _message(row: MessageRow) -> Message:
    return Message(
        role=row.role,  # type: ignore[arg-type]
        content=row.content,
        tool_calls=tuple(RequestedToolCall(**call) for call in row.tool_calls),
        tool_call_id=row.tool_call_id,
        provider_state=row.provider_state,
    )
