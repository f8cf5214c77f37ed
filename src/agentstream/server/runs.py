"""Runs after the fact: the assembled run with its persisted events, cancel, and resuming."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from agentstream.errors import Conflict, NotFound
from agentstream.events import (
    Event,
    Reasoning,
    StepCompleted,
    StepStarted,
    ToolCall,
    ToolResult,
)
from agentstream.inputs import InputModel
from agentstream.server.auth import require_api_key
from agentstream.server.listing import next_cursor, page_of
from agentstream.server.openapi import (
    CANCELS_RUN,
    FOLLOW_FRAMING,
    STARTS_RUN,
    event_stream,
    refusals,
)
from agentstream.server.routing import Router
from agentstream.server.services import Services, services
from agentstream.server.streams import STOP_WAIT, ResumeAfter, follow, native, native_replay
from agentstream.store.paging import Page
from agentstream.store.runs import RunQuery
from agentstream.store.store import ApprovalRecord, RunRecord
from agentstream.views.native import NativeFrameAdapter, UsageJSON, frame, usage_json

__all__ = ["cancel", "decide_all", "router"]

router = Router(prefix="/api/agents/runs", tags=["runs"], dependencies=[Depends(require_api_key)])
Svc = Annotated[Services, Depends(services)]


class ToolCallOut(BaseModel):
    id: str
    name: str
    step: int
    arguments: dict[str, Any]
    status: str | None
    result: Any
    duration_ms: int | None
    """From the call to its result; null while it has none."""


class StepOut(BaseModel):
    """One model turn and its tool calls, timed."""

    step: int
    started_at: datetime
    duration_ms: int | None
    """Null while the step is going (or if the run ended during it)."""


class RunOut(BaseModel):
    id: str
    agent_id: str
    agent_version: int
    session_id: str
    parent_run_id: str | None
    """The run that started this one: a coordinator's, or a workflow execution's."""
    status: str
    input: str
    content: str | None
    reasoning: str
    error: str | None
    steps: list[StepOut]
    tool_calls: list[ToolCallOut]
    usage: UsageJSON
    created_at: datetime
    finished_at: datetime | None
    duration_ms: int | None
    approvals: list[ApprovalOut]
    """Tool calls that waited for a person, with who decided what and when."""
    events: list[dict[str, Any]]
    """The persisted events in order, as streamed (with their ``seq``): no token deltas."""


RunStatus = Literal[
    "running", "awaiting_approval", "completed", "error", "timeout", "cancelled", "interrupted"
]


class RunSummary(BaseModel):
    id: str
    agent_id: str
    session_id: str
    parent_run_id: str | None
    """The run that started this one: a coordinator's, or a workflow execution's."""
    status: str
    input: str
    error: str | None
    usage: UsageJSON
    created_at: datetime
    finished_at: datetime | None


class RunPage(BaseModel):
    runs: list[RunSummary]
    next_cursor: str | None
    """Pass as ``cursor`` for the next page; null on the last one."""


@router.get("")
async def list_runs(
    svc: Svc,
    page: Annotated[Page, Depends(page_of)],
    agent_id: Annotated[str | None, Query(max_length=100)] = None,
    status: RunStatus | None = None,
    parent_run_id: Annotated[str | None, Query(max_length=40)] = None,
) -> RunPage:
    """Agent runs, newest first: of one agent, in one status, started by one run (an
    orchestration's entity runs, an execution's coordinator runs), created from ``since``
    and before ``until``; a page at a time."""
    runs = await svc.store.list_runs(
        RunQuery(
            agent_id=agent_id,
            status=status,
            parent_run_id=parent_run_id,
            page=page,
        )
    )
    return RunPage(  # a RunRecord has these fields by name, and its Usage those of UsageJSON
        runs=[RunSummary.model_validate(run, from_attributes=True) for run in runs],
        next_cursor=next_cursor(runs, page),
    )


async def _run_or_404(svc: Services, run_id: str) -> RunRecord:
    run = await svc.store.get_run(run_id)
    if run is None:
        raise NotFound(f"No run {run_id!r}", field="run_id")
    return run


@router.get("/{run_id}")
async def get_run(run_id: str, svc: Svc) -> RunOut:
    run = await _run_or_404(svc, run_id)
    events = await svc.store.run_events(run_id)
    calls: dict[str, ToolCallOut] = {}
    called_at: dict[str, float] = {}
    steps: dict[int, StepOut] = {}
    step_started_at: dict[int, float] = {}
    reasoning = []
    for event in events:
        match event:
            case StepStarted(step=step, ts=ts):
                step_started_at[step] = ts
                steps[step] = StepOut(step=step, started_at=_moment(ts), duration_ms=None)
            case StepCompleted(step=step, ts=ts) if step in steps:
                steps[step].duration_ms = _ms(ts - step_started_at[step])
            case ToolCall(call_id=call_id, tool_name=name, step=step, arguments=arguments, ts=ts):
                called_at[call_id] = ts
                calls[call_id] = ToolCallOut(
                    id=call_id,
                    name=name,
                    step=step,
                    arguments=arguments,
                    status=None,
                    result=None,
                    duration_ms=None,
                )
            case ToolResult(call_id=call_id, status=status, result=result, ts=ts) if (
                call_id in calls
            ):
                call = calls[call_id]
                call.status, call.result = status, result
                call.duration_ms = _ms(ts - called_at[call_id])
            case Reasoning(text=text):
                reasoning.append(text)
    finished = run.finished_at
    return RunOut(
        id=run.id,
        agent_id=run.agent_id,
        agent_version=run.agent_version,
        session_id=run.session_id,
        parent_run_id=run.parent_run_id,
        status=run.status,
        input=run.input,
        content=run.content,
        reasoning="\n\n".join(reasoning),
        error=run.error,
        steps=list(steps.values()),
        tool_calls=list(calls.values()),
        usage=UsageJSON(**usage_json(run.usage)),
        created_at=run.created_at,
        finished_at=finished,
        duration_ms=None if finished is None else _ms((finished - run.created_at).total_seconds()),
        approvals=_approvals_out(await svc.store.approvals(run_id)),
        events=[shown for e in events if (shown := frame(e)) is not None],
    )


def _moment(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class DecisionIn(InputModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"tool_call_id": "call_1", "reason": "Not with customer data"}]
        }
    )

    tool_call_id: str = Field(max_length=100)
    """The call to decide on, from its ``approval_requested`` frame."""
    reason: str | None = Field(default=None, max_length=2_000)
    """Shown to the model with a denial."""


class ApprovalOut(BaseModel):
    tool_call_id: str
    tool_name: str
    tool_input: dict[str, Any]
    decision: str
    """pending, approved or denied."""
    reason: str | None
    decided_by: str | None
    """The name of the API key that decided."""
    requested_at: datetime
    decided_at: datetime | None


class DecisionOut(BaseModel):
    run_id: str
    status: str
    """``running`` once every approval is decided (subscribe to ``/stream`` to follow it)."""
    approvals: list[ApprovalOut]


def _approvals_out(records: list[ApprovalRecord]) -> list[ApprovalOut]:
    return [ApprovalOut(**asdict(a), tool_call_id=a.call_id) for a in records]


Caller = Annotated[str, Depends(require_api_key)]


DECISION_REFUSALS = refusals(
    {409: "The run is not waiting for approval, or the call was decided already"}, STARTS_RUN
)


@router.post("/{run_id}/approve", responses=DECISION_REFUSALS)
async def approve(run_id: str, body: DecisionIn, svc: Svc, caller: Caller) -> DecisionOut:
    """Let the model's call run. The run continues once every pending call is decided."""
    return await _decide(svc, run_id, body, approved=True, caller=caller)


@router.post("/{run_id}/deny", responses=DECISION_REFUSALS)
async def deny(run_id: str, body: DecisionIn, svc: Svc, caller: Caller) -> DecisionOut:
    """Refuse the model's call; the model is told so (with ``reason``) and carries on."""
    return await _decide(svc, run_id, body, approved=False, caller=caller)


async def _decide(
    svc: Services, run_id: str, body: DecisionIn, *, approved: bool, caller: str
) -> DecisionOut:
    run = await _run_or_404(svc, run_id)
    if run.status != "awaiting_approval":
        raise Conflict(
            f"Run {run_id!r} is not waiting for approval (status: {run.status})", field="run_id"
        )
    asked = {a.call_id: a for a in await svc.store.approvals(run_id)}
    if body.tool_call_id not in asked:
        raise NotFound(
            f"Run {run_id!r} has no approval for tool call {body.tool_call_id!r}",
            field="tool_call_id",
        )
    if not await svc.store.decide(
        run_id, body.tool_call_id, approved=approved, reason=body.reason, decided_by=caller
    ):
        await svc.runs.resume(run_id)  # in case a crash came between a decision and going on
        decided = await svc.store.approvals(run_id)
        earlier = next(a for a in decided if a.call_id == body.tool_call_id)
        raise Conflict(
            f"Tool call {body.tool_call_id!r} was already {earlier.decision} "
            f"by {earlier.decided_by}",
            field="tool_call_id",
        )
    await svc.runs.resume(run_id)
    current = await svc.store.get_run(run_id)
    assert current is not None
    return DecisionOut(
        run_id=run_id,
        status=current.status,
        approvals=_approvals_out(await svc.store.approvals(run_id)),
    )


async def decide_all(
    svc: Services,
    run_id: str,
    decisions: Sequence[tuple[str, bool, str | None]],
    *,
    caller: str,
    field: str,
) -> int:
    """Record ``(call_id, approved, reason)`` for each call a paused run waits on, and
    continue it: the seq after which it goes on. A decision already made stands (a client
    sending its answer again); an unknown call is ``NotFound`` and calls left undecided a
    ``Conflict``, both naming ``field``, before anything is recorded."""
    approvals = await svc.store.approvals(run_id)
    answered = {call_id for call_id, _, _ in decisions}
    if unknown := answered - {a.call_id for a in approvals}:
        raise NotFound(
            f"Run {run_id!r} has no approval for {', '.join(sorted(unknown))}", field=field
        )
    if left := {a.call_id for a in approvals if a.decision == "pending"} - answered:
        raise Conflict(
            f"Run {run_id!r} also waits for a decision on {', '.join(sorted(left))}", field=field
        )
    paused_at = await svc.store.last_seq(run_id)
    for call_id, approved, reason in decisions:
        await svc.store.decide(run_id, call_id, approved=approved, reason=reason, decided_by=caller)
    await svc.runs.resume(run_id)
    return paused_at


async def cancel(svc: Services, run: RunRecord, reason: str) -> bool:
    """Cancel a run that is going (in whichever process runs it) or waiting for approval,
    once it has ended; False if it had ended already."""
    if run.status == "awaiting_approval":
        return await svc.runs.cancel_paused(run.id)
    if run.status == "running":
        return await svc.supervisor.stop(run.id, reason, wait=STOP_WAIT)
    return False


@router.post("/{run_id}/cancel", responses=refusals({409: "The run has ended"}, CANCELS_RUN))
async def cancel_run(run_id: str, svc: Svc) -> dict[str, str]:
    """Cancel a live run, or one waiting for approval, and answer once it has ended: tools
    in flight settle as cancelled, the run's status is ``cancelled``, its session is free for
    the next message."""
    cancelled = await cancel(svc, await _run_or_404(svc, run_id), "Run cancelled")
    run = await svc.store.get_run(run_id)
    assert run is not None
    if not cancelled:
        raise Conflict(f"Run {run_id!r} has ended (status: {run.status})", field="run_id")
    return {"run_id": run_id, "status": run.status}


@router.get(
    "/{run_id}/stream",
    response_class=Response,
    responses={
        **event_stream(
            "Agent events", FOLLOW_FRAMING, NativeFrameAdapter, ids=True, name="NativeFrame"
        ),
        204: {"description": "The run has ended and has nothing after `after`"},
    },
)
async def resume_stream(run_id: str, svc: Svc, after: ResumeAfter) -> Any:
    """Follow a run from after ``Last-Event-ID`` or ``?after=`` (the later of the two: an
    EventSource reconnects to the same URL with the header): live events while the run is in
    this server's log, the persisted ones after that. Disconnecting does not cancel.

    ``204 No Content`` once a finished run has nothing more, which tells an EventSource to
    stop reconnecting.
    """

    async def persisted() -> list[Event]:
        await _run_or_404(svc, run_id)
        return await svc.store.run_events(run_id)

    return await follow(
        svc.supervisor,
        run_id,
        persisted,
        native,
        replay=native_replay,
        after=after,
        keepalive=svc.settings.keepalive_seconds,
    )
