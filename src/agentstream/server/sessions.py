"""Conversations: a session's runs and memory, and forgetting it."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, Query, Response
from pydantic import BaseModel

from agentstream.errors import NotFound
from agentstream.server.auth import require_api_key
from agentstream.server.listing import next_cursor, page_of
from agentstream.server.openapi import refusals
from agentstream.server.routing import Router
from agentstream.server.services import Services, services
from agentstream.store.paging import Page
from agentstream.views.native import UsageJSON

__all__ = ["router"]

router = Router(prefix="/api/sessions", tags=["sessions"], dependencies=[Depends(require_api_key)])
Svc = Annotated[Services, Depends(services)]


class SessionRun(BaseModel):
    id: str
    status: str
    input: str
    content: str | None
    error: str | None
    usage: UsageJSON
    created_at: datetime
    finished_at: datetime | None


class MemoryMessage(BaseModel):
    role: str
    content: str
    tool_calls: list[dict[str, Any]]
    tool_call_id: str | None


class SessionOut(BaseModel):
    id: str
    agent_id: str
    created_at: datetime
    runs: list[SessionRun]
    messages: list[MemoryMessage]
    """What the model remembers: user messages, tool exchanges, final answers (no preamble)."""


class SessionSummaryOut(BaseModel):
    id: str
    agent_id: str
    created_at: datetime
    runs: int
    """How many runs the conversation has had."""
    last_run_at: datetime | None


class SessionPage(BaseModel):
    sessions: list[SessionSummaryOut]
    next_cursor: str | None
    """Pass as ``cursor`` for the next page; null on the last one."""


@router.get("")
async def list_sessions(
    svc: Svc,
    page: Annotated[Page, Depends(page_of)],
    agent_id: Annotated[str | None, Query(max_length=100)] = None,
) -> SessionPage:
    """Conversations, newest first: of one agent, created from ``since`` and before
    ``until``; a page at a time."""
    found = await svc.store.list_sessions(agent_id, page)
    return SessionPage(
        sessions=[SessionSummaryOut(**asdict(session)) for session in found],
        next_cursor=next_cursor(found, page),
    )


@router.get("/{session_id}")
async def get_session(session_id: str, svc: Svc) -> SessionOut:
    agent_id = await svc.store.session_agent(session_id)
    created_at = await svc.store.session_created_at(session_id)
    if agent_id is None or created_at is None:
        raise NotFound(f"No session {session_id!r}", field="session_id")
    runs = await svc.store.session_runs(session_id)
    memory = await svc.store.history(session_id)
    return SessionOut(
        id=session_id,
        agent_id=agent_id,
        created_at=created_at,
        runs=[SessionRun.model_validate(run, from_attributes=True) for run in runs],
        messages=[MemoryMessage(**asdict(m)) for m in memory],  # without its provider_state
    )


@router.delete(
    "/{session_id}",
    status_code=204,
    responses=refusals({409: "A run of the session is in progress: cancel it first"}),
)
async def delete_session(session_id: str, svc: Svc) -> Response:
    """Forget the conversation: its memory, runs, their events and approvals."""
    if not await svc.runs.forget_session(session_id):
        raise NotFound(f"No session {session_id!r}", field="session_id")
    return Response(status_code=204)
