"""The canvas surface (spec 000 "Canvas (draft Run)"): draft runs streamed as canvas
execution-event frames, replay of an execution in the same frames, and the hosted run view
that draws them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Body, Depends, Query, Response
from pydantic import ConfigDict, Field, field_validator

from agentstream.inputs import InputModel
from agentstream.server.auth import require_api_key
from agentstream.server.openapi import (
    FOLLOW_FRAMING,
    POST_FRAMING,
    STARTS_RUN,
    event_stream,
    refusals,
)
from agentstream.server.routing import Router
from agentstream.server.services import Services, services
from agentstream.server.streams import ResumeAfter, follow, stream_started
from agentstream.server.workflows import execution_or_404, parse_as, workflow_or_404
from agentstream.views.canvas import CanvasFrameAdapter, CanvasPolicy, CanvasView
from agentstream.workflows import Workflow
from agentstream.workflows.definition import Block
from agentstream.workflows.expressions import ExpressionError, parse_expression
from agentstream.workflows.graph import Graph
from agentstream.workflows.references import find_references

__all__ = ["canvas_policy", "router"]


router = Router()
Svc = Annotated[Services, Depends(services)]
Auth = [Depends(require_api_key)]


class DraftRunIn(InputModel):
    """What the builder sends to run its canvas. Besides ``input`` and ``definition``, the
    reference builder's execute fields are accepted; those that choose what this endpoint
    already does (a streamed draft run, every block shown) change nothing."""

    input: Any = None
    """The execution's input: the start block's output ``input``."""
    definition: dict[str, Any] | None = None
    """The editor's definition, saved or not; default: the saved one."""
    stream: bool | None = None
    """The canvas always streams: absent or ``true``."""
    selectedOutputs: list[Annotated[str, Field(max_length=200)]] | None = Field(
        default=None, max_length=100
    )
    """Accepted, changes nothing: the canvas shows every block's output."""
    triggerType: str | None = Field(default=None, max_length=40)
    """Accepted, changes nothing: a canvas execution is a draft run."""
    useDraftState: bool | None = None
    """Accepted, changes nothing: the draft is ``definition`` when given, else the saved one."""
    isClientSession: bool | None = None
    """Accepted, changes nothing."""
    includeFileBase64: bool | None = None
    """Accepted, changes nothing: no block output holds files."""
    base64MaxBytes: int | None = Field(default=None, gt=0)
    """Accepted, changes nothing."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"input": "What is 17 * 23?", "stream": True}]}
    )

    @field_validator("stream")
    @classmethod
    def _streams(cls, value: bool | None) -> bool | None:
        if value is False:
            raise ValueError("the canvas always streams: send true or leave it out")
        return value


def canvas_policy(workflow: Workflow) -> CanvasPolicy:
    """Blocks whose configuration turns PII redaction on for their output (a
    ``redact_output`` field) are not forwarded live, and neither is any block that reads
    such an output, directly or through other blocks: redaction follows the data."""
    graph = Graph(workflow)
    redacted: set[str] = set()
    for block_id in graph.order:  # upstream first: whether what a block reads is redacted
        block = graph.blocks[block_id]
        if block.redact_output or not redacted.isdisjoint(_reads(block)):
            redacted.add(block_id)
    return CanvasPolicy(redacted_blocks=frozenset(redacted))


def _reads(block: Block) -> set[str]:
    """The ids of the blocks whose outputs ``block`` references, in templates or
    expressions."""
    found = {
        reference.block_id
        for field in block.templated
        for reference in find_references(getattr(block, field))
    }
    for text in block.expressions().values():
        try:
            found.update(reference.block_id for reference in parse_expression(text).references())
        except ExpressionError:
            continue  # such a definition was refused before it could run
    return found


@router.post(
    "/api/workflows/{workflow_id}/execute",
    response_class=Response,
    responses={
        **event_stream(
            "Canvas execution events", POST_FRAMING, CanvasFrameAdapter, name="CanvasFrame"
        ),
        **refusals(STARTS_RUN),
    },
    dependencies=Auth,
    tags=["workflows"],
)
async def execute_draft(
    workflow_id: str, svc: Svc, body: Annotated[DraftRunIn | None, Body()] = None
) -> Any:
    """Run the workflow as a draft and stream canvas frames (``data:`` lines only; each
    frame's ``eventId`` is where to resume from). Always opted in: no protocol header.
    Disconnecting cancels the execution."""
    body = body or DraftRunIn()
    version = None
    if body.definition is not None:
        workflow = parse_as(svc, workflow_id, body.definition)
    else:
        stored = await workflow_or_404(svc, workflow_id)
        workflow, version = stored.workflow, stored.version
    execution_id = await svc.executions.start(workflow, body.input, draft=True, version=version)
    view = CanvasView(workflow_id=workflow_id, policy=canvas_policy(workflow))
    return stream_started(
        svc.supervisor,
        execution_id,
        view.frames,
        keepalive=svc.settings.keepalive_seconds,
        headers={"X-Execution-Id": execution_id},
    )


@router.get(
    "/api/workflows/executions/{execution_id}/canvas",
    response_class=Response,
    responses={
        **event_stream(
            "Canvas execution events",
            FOLLOW_FRAMING,
            CanvasFrameAdapter,
            name="CanvasFrame",
            ids=True,
        ),
        204: {"description": "Nothing more after `after`"},
    },
    dependencies=Auth,
    tags=["workflows"],
)
async def execution_canvas(
    execution_id: str,
    svc: Svc,
    after: ResumeAfter,
    full_history: Annotated[
        bool,
        Query(
            description="Also the live-only `stream:*` frames of what happened before "
            "connecting, as a viewer that watched got them (the console's execution page)"
        ),
    ] = False,
) -> Any:
    """An execution in canvas frames from after ``Last-Event-ID`` or ``?after=``: what
    already happened (from the live log, or the store once it is gone) without the live-only
    ``stream:*`` frames (spec 000, "Reconnect"), then what happens, live. Disconnecting
    does not cancel. ``204 No Content`` when there is nothing more."""
    record = await execution_or_404(svc, execution_id)
    workflow = Workflow.model_validate(record.definition)
    view = CanvasView(workflow_id=record.workflow_id, policy=canvas_policy(workflow))
    return await follow(
        svc.supervisor,
        execution_id,
        lambda: svc.workflows.execution_events(execution_id),
        view.frames,
        history=None if full_history else view.replayed,
        after=after,
        keepalive=svc.settings.keepalive_seconds,
        whole_run=True,
    )
