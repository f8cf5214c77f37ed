"""Workflows (versioned definitions), their executions and the executions' persisted events.

Like runs: one row per execution, one per persisted event, and the outcome with its last
event in one transaction. Token deltas never come here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError

from agentstream.errors import Conflict
from agentstream.events import INTERRUPTED, BaseEvent, Event, EventAdapter, RunFailed
from agentstream.store.clock import now, utc
from agentstream.store.database import Database
from agentstream.store.tables import WorkflowEventRow, WorkflowExecutionRow, WorkflowRow
from agentstream.workflows.definition import Workflow

__all__ = ["ExecutionRecord", "StoredWorkflow", "WorkflowStore", "definition_json"]


def definition_json(workflow: Workflow) -> dict[str, Any]:
    """The definition as clients write it (edges with ``from`` / ``to``)."""
    return workflow.model_dump(mode="json", by_alias=True)


@dataclass(frozen=True, slots=True)
class StoredWorkflow:
    workflow: Workflow
    version: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    id: str
    workflow_id: str
    workflow_version: int | None
    """The saved version that ran; None for a draft."""
    draft: bool
    definition: dict[str, Any]
    """The definition that ran, as JSON."""
    status: str
    """running, completed, error, cancelled, timeout or interrupted."""
    input: Any
    result: Any
    error: str | None
    created_at: datetime
    finished_at: datetime | None


class WorkflowStore:
    """Over the same engine as ``Store``, so one database holds everything."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # Definitions

    async def create_workflow(self, workflow: Workflow) -> StoredWorkflow:
        """Save a new workflow at version 1; ``Conflict`` if its id is taken, even by a
        create racing this one."""
        row = WorkflowRow(id=workflow.id, definition=definition_json(workflow), version=1)
        row.created_at = row.updated_at = now()
        try:
            async with self._db.write() as db:
                db.add(row)
        except IntegrityError:
            raise Conflict(
                f"Workflow {workflow.id!r} exists; PUT it to change it", field="id"
            ) from None
        return _stored(row)

    async def put_workflow(self, workflow: Workflow) -> StoredWorkflow:
        """Create the workflow, or replace it with a new version if its definition changed."""
        definition = definition_json(workflow)
        async with self._db.write() as db:
            row = await db.get(WorkflowRow, workflow.id, with_for_update=True)
            if row is None:
                row = WorkflowRow(id=workflow.id, definition=definition, version=1)
                row.created_at = row.updated_at = now()
                db.add(row)
            elif row.definition != definition:
                row.version += 1
                row.definition = definition
                row.updated_at = now()
        return _stored(row)

    async def get_workflow(self, workflow_id: str) -> StoredWorkflow | None:
        async with self._db.session() as db:
            row = await db.get(WorkflowRow, workflow_id)
        return None if row is None else _stored(row)

    async def list_workflows(self) -> list[StoredWorkflow]:
        async with self._db.session() as db:
            rows = await db.scalars(select(WorkflowRow).order_by(WorkflowRow.id))
            return [_stored(row) for row in rows]

    async def delete_workflow(self, workflow_id: str) -> bool:
        """The definition only: its executions stay readable."""
        async with self._db.write() as db:
            result = await db.execute(delete(WorkflowRow).where(WorkflowRow.id == workflow_id))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    # Executions

    async def create_execution(
        self,
        execution_id: str,
        workflow: Workflow,
        *,
        version: int | None,
        draft: bool,
        input: Any,
    ) -> None:
        async with self._db.write() as db:
            db.add(
                WorkflowExecutionRow(
                    id=execution_id,
                    workflow_id=workflow.id,
                    workflow_version=version,
                    draft=draft,
                    definition=definition_json(workflow),
                    status="running",
                    input=input,
                    result=None,
                    error=None,
                    created_at=now(),
                )
            )

    async def append_event(self, event: BaseEvent) -> None:
        await self._db.insert(_event_row(event))  # grouped with other runs' events

    async def finish_execution(
        self,
        execution_id: str,
        *,
        status: str,
        result: Any,
        error: str | None,
        last_event: BaseEvent,
    ) -> None:
        """Record the outcome with the terminal event: all or nothing."""
        async with self._db.write() as db:
            db.add(_event_row(last_event))
            row = await db.get_one(WorkflowExecutionRow, execution_id)
            row.status = status
            row.result = result
            row.error = error
            row.finished_at = now()

    async def mark_failed(self, execution_id: str, error: str) -> None:
        """Just the status, when recording the whole outcome failed."""
        async with self._db.write() as db:
            await db.execute(
                update(WorkflowExecutionRow)
                .where(
                    WorkflowExecutionRow.id == execution_id,
                    WorkflowExecutionRow.status == "running",
                )
                .values(status="error", error=error, finished_at=now())
            )

    async def get_execution(self, execution_id: str) -> ExecutionRecord | None:
        async with self._db.session() as db:
            row = await db.get(WorkflowExecutionRow, execution_id)
        return None if row is None else _record(row)

    async def list_executions(self, workflow_id: str, *, limit: int = 100) -> list[ExecutionRecord]:
        """The newest first."""
        async with self._db.session() as db:
            rows = await db.scalars(
                select(WorkflowExecutionRow)
                .where(WorkflowExecutionRow.workflow_id == workflow_id)
                .order_by(WorkflowExecutionRow.created_at.desc())
                .limit(limit)
            )
            return [_record(row) for row in rows]

    async def execution_events(self, execution_id: str) -> list[Event]:
        async with self._db.session() as db:
            rows = await db.scalars(
                select(WorkflowEventRow.payload)
                .where(WorkflowEventRow.execution_id == execution_id)
                .order_by(WorkflowEventRow.seq)
            )
            return [EventAdapter.validate_python(payload) for payload in rows]

    async def interrupt_unfinished(self) -> int:
        """Executions left ``running`` by a crash can never finish: say so, in the record
        and with the terminal event a server stopping in good order would have written."""
        last_seqs = (
            select(WorkflowExecutionRow.id, func.max(WorkflowEventRow.seq))
            .outerjoin(WorkflowEventRow, WorkflowEventRow.execution_id == WorkflowExecutionRow.id)
            .where(WorkflowExecutionRow.status == "running")
            .group_by(WorkflowExecutionRow.id)
        )
        async with self._db.write() as db:
            unfinished = (await db.execute(last_seqs)).all()
            for execution_id, last_seq in unfinished:
                stopped = RunFailed(
                    run_id=execution_id,
                    seq=(last_seq or 0) + 1,
                    ts=time.time(),
                    status="interrupted",
                    message=INTERRUPTED,
                )
                db.add(_event_row(stopped))
            await db.execute(
                update(WorkflowExecutionRow)
                .where(WorkflowExecutionRow.id.in_([row[0] for row in unfinished]))
                .values(status="interrupted", error=INTERRUPTED, finished_at=now())
            )
        return len(unfinished)


def _event_row(event: BaseEvent) -> WorkflowEventRow:
    payload: dict[str, Any] = EventAdapter.dump_python(event, mode="json")  # type: ignore[arg-type]
    return WorkflowEventRow(
        execution_id=event.run_id,
        seq=event.seq,
        type=payload["type"],
        ts=event.ts,
        payload=payload,
    )


def _stored(row: WorkflowRow) -> StoredWorkflow:
    return StoredWorkflow(
        workflow=Workflow.model_validate(row.definition),
        version=row.version,
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
    )


def _record(row: WorkflowExecutionRow) -> ExecutionRecord:
    return ExecutionRecord(
        id=row.id,
        workflow_id=row.workflow_id,
        workflow_version=row.workflow_version,
        draft=row.draft,
        definition=row.definition,
        status=row.status,
        input=row.input,
        result=row.result,
        error=row.error,
        created_at=utc(row.created_at),
        finished_at=None if row.finished_at is None else utc(row.finished_at),
    )
