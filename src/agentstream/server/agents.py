"""The native agent API: define agents, run them with a live SSE stream (spec 002)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from agentstream.agents import AgentSpec, AgentUpdate, StoredAgent
from agentstream.errors import Conflict, NotFound
from agentstream.inputs import InputModel
from agentstream.server.auth import require_api_key
from agentstream.server.openapi import POST_FRAMING, STARTS_RUN, event_stream, refusals
from agentstream.server.routing import Router
from agentstream.server.services import Services, services
from agentstream.server.streams import native, stream_started
from agentstream.server.validation import MessageText
from agentstream.views.native import NativeFrameAdapter

__all__ = ["agent_or_404", "router"]

router = Router(prefix="/api/agents", tags=["agents"], dependencies=[Depends(require_api_key)])
Svc = Annotated[Services, Depends(services)]


class RunRequest(InputModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"message": "What is 17 * 23? Think first.", "reasoning": True}]
        }
    )

    message: MessageText
    """The user's message."""
    session_id: str | None = Field(default=None, max_length=40)
    """Continue this conversation (from an earlier run's ``start`` event)."""
    reasoning: bool | None = None
    """Request the model's reasoning (``reasoning_delta`` / ``reasoning``); default: the agent's."""
    reasoning_requested: bool | None = None
    """The same, by spec 002's name; if both are given they must agree."""

    @field_validator("reasoning_requested")
    @classmethod
    def _agrees_with_reasoning(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        given = info.data.get("reasoning")
        if value is not None and given is not None and value != given:
            raise ValueError(f"is {value} but reasoning is {given}: give one of them")
        return value

    @property
    def wants_reasoning(self) -> bool | None:
        """Whether the caller asked for the model's reasoning; None: the agent decides."""
        return self.reasoning if self.reasoning is not None else self.reasoning_requested


class AgentOut(BaseModel):
    agent: AgentSpec
    version: int
    created_at: datetime
    updated_at: datetime


def _out(stored: StoredAgent) -> AgentOut:
    return AgentOut(agent=stored.spec, **asdict(stored))  # its spec under another name


async def agent_or_404(svc: Services, agent_id: str) -> StoredAgent:
    stored = await svc.store.get_agent(agent_id)
    if stored is None:
        raise NotFound(f"No agent {agent_id!r}", field="agent_id")
    return stored


@router.post(
    "/{agent_id}/run/stream",
    response_class=Response,
    responses={
        **event_stream("Agent events", POST_FRAMING, NativeFrameAdapter, name="NativeFrame"),
        **refusals(
            {409: "The session has a run in progress, or one waiting for approval"}, STARTS_RUN
        ),
    },
)
async def run_stream(agent_id: str, body: RunRequest, svc: Svc) -> Response:
    """Run the agent and stream its events. Disconnecting cancels the run."""
    agent = await agent_or_404(svc, agent_id)
    run = await svc.runs.start(
        agent, body.message, session_id=body.session_id, reasoning=body.wants_reasoning
    )
    return stream_started(
        svc.supervisor, run.run_id, native, keepalive=svc.settings.keepalive_seconds
    )


@router.get("")
async def list_agents(svc: Svc) -> list[AgentOut]:
    return [_out(agent) for agent in await svc.store.list_agents()]


@router.post("", status_code=201, responses=refusals({409: "An agent with this id exists"}))
async def create_agent(spec: AgentSpec, svc: Svc) -> AgentOut:
    svc.runs.check_agent(spec)
    await svc.knowledge.check_bases(spec.knowledge_bases)
    if await svc.store.get_agent(spec.id) is not None:
        raise Conflict(f"Agent {spec.id!r} exists; PATCH it to change it", field="id")
    return _out(await svc.store.put_agent(spec))


@router.get("/{agent_id}")
async def get_agent(agent_id: str, svc: Svc) -> AgentOut:
    return _out(await agent_or_404(svc, agent_id))


@router.patch("/{agent_id}")
async def update_agent(agent_id: str, update: AgentUpdate, svc: Svc) -> AgentOut:
    spec = (await agent_or_404(svc, agent_id)).spec.updated(update)
    svc.runs.check_agent(spec)
    await svc.knowledge.check_bases(spec.knowledge_bases)
    return _out(await svc.store.put_agent(spec))


@router.delete("/{agent_id}", status_code=204)
async def delete_agent(agent_id: str, svc: Svc) -> Response:
    if not await svc.store.delete_agent(agent_id):
        raise NotFound(f"No agent {agent_id!r}", field="agent_id")
    return Response(status_code=204)
