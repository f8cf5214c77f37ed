"""Runs after the fact: the assembled run with its persisted events, cancel, and resuming."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Query, Response
from pydantic import BaseModel

from agentstream.errors import Conflict, NotFound
from agentstream.events import Reasoning, ToolCall, ToolResult
from agentstream.server.auth import require_api_key
from agentstream.server.frames import encode_events, event_chunks, native
from agentstream.server.services import Services, services
from agentstream.server.streaming import EventStreamResponse
from agentstream.views.native import UsageJSON, frame, usage_json

__all__ = ["router"]

router = APIRouter(
    prefix="/api/agents/runs", tags=["runs"], dependencies=[Depends(require_api_key)]
)
Svc = Annotated[Services, Depends(services)]


class ToolCallOut(BaseModel):
    id: str
    name: str
    step: int
    arguments: dict[str, Any]
    status: str | None
    result: Any


class RunOut(BaseModel):
    id: str
    agent_id: str
    agent_version: int
    session_id: str
    status: str
    input: str
    content: str | None
    reasoning: str
    error: str | None
    tool_calls: list[ToolCallOut]
    usage: UsageJSON
    created_at: datetime
    finished_at: datetime | None
    duration_ms: int | None
    events: list[dict[str, Any]]
    """The persisted events in order, as streamed (with their ``seq``): no token deltas."""


@router.get("/{run_id}")
async def get_run(run_id: str, svc: Svc) -> RunOut:
    run = await svc.store.get_run(run_id)
    if run is None:
        raise NotFound(f"No run {run_id!r}", field="run_id")
    events = await svc.store.run_events(run_id)
    calls: dict[str, ToolCallOut] = {}
    reasoning = []
    for event in events:
        match event:
            case ToolCall(call_id=call_id, tool_name=name, step=step, arguments=arguments):
                calls[call_id] = ToolCallOut(
                    id=call_id, name=name, step=step, arguments=arguments, status=None, result=None
                )
            case ToolResult(call_id=call_id, status=status, result=result) if call_id in calls:
                calls[call_id] = calls[call_id].model_copy(
                    update={"status": status, "result": result}
                )
            case Reasoning(text=text):
                reasoning.append(text)
    finished = run.finished_at
    return RunOut(
        id=run.id,
        agent_id=run.agent_id,
        agent_version=run.agent_version,
        session_id=run.session_id,
        status=run.status,
        input=run.input,
        content=run.content,
        reasoning="\n\n".join(reasoning),
        error=run.error,
        tool_calls=list(calls.values()),
        usage=UsageJSON(**usage_json(run.usage)),
        created_at=run.created_at,
        finished_at=finished,
        duration_ms=None
        if finished is None
        else round((finished - run.created_at).total_seconds() * 1000),
        events=[{"seq": e.seq, **shown} for e in events if (shown := frame(e)) is not None],
    )


@router.post("/{run_id}/cancel")
async def cancel_run(run_id: str, svc: Svc) -> dict[str, str]:
    """Cancel a live run and answer once it has ended: tools in flight settle as
    cancelled, the run's status is ``cancelled``, its session is free for the next message."""
    done = svc.runs.cancel(run_id)
    if done is not None:
        with anyio.move_on_after(10):
            await done.wait()
    run = await svc.store.get_run(run_id)
    if run is None:
        raise NotFound(f"No run {run_id!r}", field="run_id")
    if done is None:
        raise Conflict(f"Run {run_id!r} is not running (status: {run.status})", field="run_id")
    return {"run_id": run_id, "status": run.status}


@router.get(
    "/{run_id}/stream",
    response_class=Response,
    responses={200: {"content": {"text/event-stream": {}}, "description": "Agent events"}},
)
async def resume_stream(
    run_id: str,
    svc: Svc,
    after: Annotated[int | None, Query(ge=0)] = None,
    last_event_id: Annotated[int | None, Header(ge=0)] = None,
) -> Any:
    """Follow a run from after ``Last-Event-ID`` or ``?after=`` (the later of the two: an
    EventSource reconnects to the same URL with the header): live events while the run is in
    this server's log, the persisted ones after that. Disconnecting does not cancel.

    ``204 No Content`` once a finished run has nothing more, which tells an EventSource to
    stop reconnecting.
    """
    start = max(after or 0, last_event_id or 0)
    if run_id in svc.runs.log:
        subscription = svc.runs.log.subscribe(run_id, after=start)
        if subscription.finished:
            subscription.close()
            return Response(status_code=204)
        return EventStreamResponse(
            event_chunks(subscription, native),
            keepalive=svc.settings.keepalive_seconds,
            on_disconnect=subscription.close,
        )
    if await svc.store.get_run(run_id) is None:
        raise NotFound(f"No run {run_id!r}", field="run_id")
    stored = [e for e in await svc.store.run_events(run_id) if e.seq > start]
    if not stored:
        return Response(status_code=204)
    pending = [encode_events(stored, native)]

    async def next_chunk() -> bytes | None:
        return pending.pop() if pending else None

    return EventStreamResponse(next_chunk, keepalive=svc.settings.keepalive_seconds)
