"""The native workflow API: define workflows, run them with a live SSE stream of workflow
events (spec 002 "Workflow Streaming"), read, follow, replay and cancel executions."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Body, Depends, Query, Response
from pydantic import BaseModel, ConfigDict

from agentstream.errors import Conflict, NotFound, UserError
from agentstream.events import Event
from agentstream.inputs import InputModel
from agentstream.server.auth import require_api_key
from agentstream.server.listing import next_cursor, page_of
from agentstream.server.openapi import (
    CANCELS_RUN,
    FOLLOW_FRAMING,
    POST_FRAMING,
    STARTS_RUN,
    event_stream,
    refusals,
)
from agentstream.server.routing import Router
from agentstream.server.services import Services, services
from agentstream.server.streams import STOP_WAIT, ResumeAfter, follow, stream_started
from agentstream.store.paging import Page
from agentstream.store.runs import RunQuery
from agentstream.store.workflows import ExecutionRecord, StoredWorkflow, definition_json
from agentstream.views.workflow import WorkflowFrameAdapter, frame, frames
from agentstream.workflows import Workflow, parse_workflow

__all__ = ["execution_or_404", "parse_as", "router", "workflow_or_404"]

router = Router(
    prefix="/api/workflows", tags=["workflows"], dependencies=[Depends(require_api_key)]
)
Svc = Annotated[Services, Depends(services)]
Definition = Annotated[
    dict[str, Any],
    Body(
        description="A workflow definition: ``id``, ``blocks``, ``edges`` (see the docs).",
        openapi_examples={
            "greeting": {
                "summary": "An agent's answer, templated",
                "value": {
                    "id": "greeting",
                    "name": "Greeting",
                    "blocks": [
                        {"id": "start", "type": "start"},
                        {"id": "ask", "type": "agent", "agent": "demo", "input": "<start.input>"},
                        {"id": "out", "type": "template", "template": "Answer: <ask.content>"},
                    ],
                    "edges": [{"from": "start", "to": "ask"}, {"from": "ask", "to": "out"}],
                },
            }
        },
    ),
]
SSE_RESPONSE = event_stream(
    "Workflow events", POST_FRAMING, WorkflowFrameAdapter, name="WorkflowFrame"
)
SSE_FOLLOW_RESPONSE: dict[int | str, dict[str, Any]] = {
    **event_stream(
        "Workflow events", FOLLOW_FRAMING, WorkflowFrameAdapter, ids=True, name="WorkflowFrame"
    ),
    204: {"description": "The execution has ended and has nothing after `after`"},
}


class WorkflowOut(BaseModel):
    workflow: dict[str, Any]
    """The definition, as saved (defaults filled in)."""
    version: int
    created_at: datetime
    updated_at: datetime


class RunIn(InputModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"input": "What is 17 * 23?"}]})

    input: Any = None
    """The execution's input: the start block's output ``input`` (``<start.input>``)."""


ExecutionStatus = Literal["running", "completed", "error", "timeout", "cancelled", "interrupted"]


class ExecutionSummary(BaseModel):
    id: str
    workflow_id: str
    workflow_version: int | None
    """The saved version that ran; null for a draft definition."""
    draft: bool
    status: str
    """running, completed, error, cancelled, timeout or interrupted."""
    input: Any
    result: Any
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    duration_ms: int | None


class ExecutionOut(ExecutionSummary):
    definition: dict[str, Any]
    """The definition that ran."""
    events: list[dict[str, Any]]
    """The persisted events in order, as streamed (with their ``seq``): no token deltas."""


def _out(stored: StoredWorkflow) -> WorkflowOut:
    return WorkflowOut(
        workflow=definition_json(stored.workflow),
        version=stored.version,
        created_at=stored.created_at,
        updated_at=stored.updated_at,
    )


def _summary(record: ExecutionRecord) -> dict[str, Any]:
    """The record's fields, not copied (an ``ExecutionSummary`` ignores the ``definition``,
    and a list holds many), and how long it ran."""
    finished = record.finished_at
    return {
        **{f.name: getattr(record, f.name) for f in fields(record)},
        "duration_ms": None
        if finished is None
        else round((finished - record.created_at).total_seconds() * 1000),
    }


def _parse(svc: Services, data: dict[str, Any]) -> Workflow:
    return parse_workflow(data, functions=svc.executions.engine.functions)


def parse_as(svc: Services, workflow_id: str, definition: dict[str, Any]) -> Workflow:
    """The definition as the workflow the URL names: its ``id`` may be left out, not differ."""
    given = definition.get("id", workflow_id)
    if given != workflow_id:
        raise UserError(
            f"The definition's id {given!r} is not the URL's {workflow_id!r}", field="id"
        )
    return _parse(svc, {**definition, "id": workflow_id})


async def workflow_or_404(svc: Services, workflow_id: str) -> StoredWorkflow:
    stored = await svc.workflows.get_workflow(workflow_id)
    if stored is None:
        raise NotFound(f"No workflow {workflow_id!r}", field="workflow_id")
    return stored


@router.get("")
async def list_workflows(svc: Svc) -> list[WorkflowOut]:
    return [_out(stored) for stored in await svc.workflows.list_workflows()]


@router.post(
    "", status_code=201, responses=refusals({409: "A workflow with this id exists, or existed"})
)
async def create_workflow(definition: Definition, svc: Svc) -> WorkflowOut:
    """Validate and save a new workflow; 409 if the id exists. A 422 lists every problem in
    ``error.details``, each naming its block and field."""
    return _out(await svc.workflows.create_workflow(_parse(svc, definition)))


class ExecutionPage(BaseModel):
    executions: list[ExecutionSummary]
    next_cursor: str | None
    """Pass as ``cursor`` for the next page; null on the last one."""


@router.get("/executions")
async def list_all_executions(
    svc: Svc,
    page: Annotated[Page, Depends(page_of)],
    workflow_id: Annotated[str | None, Query(max_length=100)] = None,
    status: ExecutionStatus | None = None,
) -> ExecutionPage:
    """Executions of every workflow (drafts included), newest first: of one workflow, in one
    status, created from ``since`` and before ``until``; a page at a time."""
    records = await svc.workflows.list_executions(
        RunQuery(
            workflow_id=workflow_id,
            status=status,
            page=page,
        )
    )
    return ExecutionPage(
        executions=[ExecutionSummary(**_summary(record)) for record in records],
        next_cursor=next_cursor(records, page),
    )


@router.get("/{workflow_id}")
async def get_workflow(workflow_id: str, svc: Svc) -> WorkflowOut:
    return _out(await workflow_or_404(svc, workflow_id))


@router.put("/{workflow_id}")
async def put_workflow(workflow_id: str, definition: Definition, svc: Svc) -> WorkflowOut:
    """Create or replace the workflow (a new version if the definition changed)."""
    return _out(await svc.workflows.put_workflow(parse_as(svc, workflow_id, definition)))


@router.delete("/{workflow_id}", status_code=204)
async def delete_workflow(workflow_id: str, svc: Svc) -> Response:
    """Delete the definition; its executions stay readable."""
    if not await svc.workflows.delete_workflow(workflow_id):
        raise NotFound(f"No workflow {workflow_id!r}", field="workflow_id")
    return Response(status_code=204)


@router.get("/{workflow_id}/executions")
async def list_executions(workflow_id: str, svc: Svc) -> list[ExecutionSummary]:
    """The workflow's latest executions, newest first."""
    records = await svc.workflows.list_executions(
        RunQuery(workflow_id=workflow_id, page=Page(limit=100))
    )
    return [ExecutionSummary(**_summary(record)) for record in records]


@router.post(
    "/{workflow_id}/run/stream",
    response_class=Response,
    responses={**SSE_RESPONSE, **refusals(STARTS_RUN)},
)
async def run_stream(
    workflow_id: str, svc: Svc, body: Annotated[RunIn | None, Body()] = None
) -> Response:
    """Execute the saved workflow and stream its events: ``data:`` lines only, each frame
    with its ``seq``. Disconnecting cancels the execution."""
    stored = await workflow_or_404(svc, workflow_id)
    execution_id = await svc.executions.start(
        stored.workflow, (body or RunIn()).input, version=stored.version
    )
    return stream_started(
        svc.supervisor,
        execution_id,
        frames,
        keepalive=svc.settings.keepalive_seconds,
        headers={"X-Execution-Id": execution_id},
    )


async def execution_or_404(svc: Services, execution_id: str) -> ExecutionRecord:
    record = await svc.workflows.get_execution(execution_id)
    if record is None:
        raise NotFound(f"No workflow execution {execution_id!r}", field="execution_id")
    return record


@router.get("/executions/{execution_id}")
async def get_execution(execution_id: str, svc: Svc) -> ExecutionOut:
    """The execution's record with its persisted events: what replay shows."""
    record = await execution_or_404(svc, execution_id)
    events = await svc.workflows.execution_events(execution_id)
    return ExecutionOut(
        **_summary(record),
        events=[shown for e in events if (shown := frame(e)) is not None],
    )


@router.get(
    "/executions/{execution_id}/stream", response_class=Response, responses=SSE_FOLLOW_RESPONSE
)
async def follow_execution(execution_id: str, svc: Svc, after: ResumeAfter) -> Any:
    """Follow an execution from after ``Last-Event-ID`` or ``?after=`` (the later of the
    two): live events (deltas included) while it is in this server's log, else a replay of
    its persisted events. Disconnecting does not cancel. ``204 No Content`` when a finished
    execution has nothing more, which tells an EventSource to stop reconnecting."""

    async def persisted() -> list[Event]:
        await execution_or_404(svc, execution_id)
        return await svc.workflows.execution_events(execution_id)

    return await follow(
        svc.supervisor,
        execution_id,
        persisted,
        frames,
        after=after,
        keepalive=svc.settings.keepalive_seconds,
    )


@router.post(
    "/executions/{execution_id}/cancel",
    responses=refusals({409: "The execution has ended"}, CANCELS_RUN),
)
async def cancel_execution(execution_id: str, svc: Svc) -> dict[str, str]:
    """Cancel a live execution and answer once it has ended: every running block stops, its
    status is ``cancelled``."""
    record = await execution_or_404(svc, execution_id)
    cancelled = record.status == "running" and await svc.supervisor.stop(
        execution_id, "Execution cancelled", wait=STOP_WAIT
    )
    record = await execution_or_404(svc, execution_id)
    if not cancelled:
        raise Conflict(
            f"Workflow execution {execution_id!r} has ended (status: {record.status})",
            field="execution_id",
        )
    return {"execution_id": execution_id, "status": record.status}
