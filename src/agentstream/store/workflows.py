"""Workflows (versioned definitions) and their executions: runs of kind ``workflow``,
written by the one run path (``agentstream.store.runs``) that agent runs share.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from agentstream.errors import Conflict
from agentstream.events import BaseEvent, Event
from agentstream.store.clock import now, utc
from agentstream.store.database import Database
from agentstream.store.runs import RunQuery, RunStore
from agentstream.store.tables import RunRow, WorkflowRow
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
        self._runs = RunStore(db)

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
        new = WorkflowRow(id=workflow.id, definition=definition, version=1)
        new.created_at = new.updated_at = now()
        async with self._db.write() as db:
            row, inserted = await self._db.insert_or_lock(db, new)
            if not inserted and row.definition != definition:
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
        owner: str,
    ) -> None:
        await self._runs.create(
            {
                "id": execution_id,
                "kind": "workflow",
                "workflow_id": workflow.id,
                "workflow_version": version,
                "draft": draft,
                "definition": definition_json(workflow),
                "status": "running",
                "input": input,
                "created_at": now(),
                "owner": owner,
            }
        )

    async def append_events(self, *events: BaseEvent) -> None:
        await self._runs.append(*events)

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
        await self._runs.finish(
            execution_id, status=status, last_event=last_event, error=error, result=result
        )

    async def mark_failed(self, execution_id: str, error: str) -> None:
        """Just the status, when recording the whole outcome failed."""
        await self._runs.mark_failed(execution_id, error)

    async def get_execution(self, execution_id: str) -> ExecutionRecord | None:
        """The execution (None for an agent run's id)."""
        row = await self._runs.get(execution_id, "workflow")
        return None if row is None else _record(row)

    async def list_executions(self, query: RunQuery) -> list[ExecutionRecord]:
        """Executions, newest first, a page at a time (``RunQuery``)."""
        return [_record(row) for row in await self._runs.page("workflow", query)]

    async def execution_events(self, execution_id: str) -> list[Event]:
        return await self._runs.events(execution_id)


def _stored(row: WorkflowRow) -> StoredWorkflow:
    return StoredWorkflow(
        workflow=Workflow.model_validate(row.definition),
        version=row.version,
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
    )


def _record(row: RunRow) -> ExecutionRecord:
    assert row.kind == "workflow", row.kind
    assert row.workflow_id is not None
    assert row.draft is not None
    assert row.definition is not None
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
