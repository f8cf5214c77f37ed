"""Chat deployments API: publish an agent or a workflow as a public chat, with toggles and
access rules."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Depends, Response
from pydantic import BaseModel

from agentstream.agents import StoredAgent
from agentstream.deployments import (
    DeploymentCreate,
    DeploymentSettings,
    DeploymentUpdate,
    hash_password,
)
from agentstream.errors import Conflict, NotFound, UserError
from agentstream.runtime.orchestration import resolve_entities
from agentstream.server.agents import agent_or_404
from agentstream.server.auth import require_api_key
from agentstream.server.openapi import refusals
from agentstream.server.routing import Router
from agentstream.server.services import Services, services
from agentstream.server.workflows import workflow_or_404
from agentstream.store.store import DeployedWorkflow, StoredDeployment
from agentstream.store.workflows import definition_json

__all__ = ["deploy", "deployment_or_404", "router"]

router = Router(
    prefix="/api/chat-deployments",
    tags=["chat deployments"],
    dependencies=[Depends(require_api_key)],
)
Svc = Annotated[Services, Depends(services)]


class DeploymentOut(BaseModel):
    deployment: DeploymentSettings
    agent_version: int | None
    """The version of the agent this deployment pinned: redeploy to pick up changes."""
    workflow_version: int | None
    """Or of the workflow."""
    has_password: bool
    url: str
    updated_at: datetime
    unavailable: str | None = None
    """Why the chat cannot answer on this server now (e.g. the agent's model has no key
    set); visitors then read only that the assistant is unavailable."""


def _out(svc: Services, stored: StoredDeployment) -> DeploymentOut:
    return DeploymentOut(
        deployment=stored.settings,
        agent_version=stored.target.version if isinstance(stored.target, StoredAgent) else None,
        workflow_version=(
            stored.target.version if isinstance(stored.target, DeployedWorkflow) else None
        ),
        has_password=stored.password_hash is not None,
        url=f"/chat/{stored.settings.slug}",
        updated_at=stored.updated_at,
        unavailable=_unavailable(svc, stored),
    )


def _unavailable(svc: Services, stored: StoredDeployment) -> str | None:
    """The first of the deployed agents (with an orchestration's entities) whose model
    cannot run here, and why."""
    if not isinstance(stored.target, StoredAgent):
        return None
    agents = [stored.target, *(stored.entities or {}).values()]
    reasons = (svc.runs.models.available(agent.spec.model) for agent in agents)
    return next((reason for reason in reasons if reason is not None), None)


async def deployment_or_404(svc: Services, slug: str) -> StoredDeployment:
    stored = await svc.store.get_deployment(slug)
    if stored is None:
        raise NotFound(f"No chat deployment {slug!r}", field="slug")
    return stored


def _check(settings: DeploymentSettings, password_hash: str | None) -> None:
    if settings.access == "password" and password_hash is None:
        raise UserError("Password access needs a password", field="password")
    if settings.access == "email" and not settings.allowed_emails:
        raise UserError("Email access needs at least one allowed email", field="allowed_emails")


async def deploy(
    svc: Services, settings: DeploymentSettings, password_hash: str | None
) -> StoredDeployment:
    """Validate and store a deployment with a fresh snapshot of its agent (with an
    orchestration's entities) or workflow."""
    _check(settings, password_hash)
    target: StoredAgent | DeployedWorkflow
    entities: dict[str, StoredAgent] = {}
    if settings.agent_id is not None:
        target = await agent_or_404(svc, settings.agent_id)
        entities = await resolve_entities(svc.store, target.spec)
    else:
        assert settings.workflow_id is not None
        stored = await workflow_or_404(svc, settings.workflow_id)
        blocks = {block.id for block in stored.workflow.blocks}
        if unknown := [b for b in settings.output_blocks if b not in blocks]:
            raise UserError(
                f"Workflow {settings.workflow_id!r} has no blocks {unknown}; "
                f"it has {sorted(blocks)}",
                field="output_blocks",
            )
        target = DeployedWorkflow(definition_json(stored.workflow), stored.version)
    return await svc.store.put_deployment(
        settings, target=target, entities=entities, password_hash=password_hash
    )


@router.get("")
async def list_deployments(svc: Svc) -> list[DeploymentOut]:
    return [_out(svc, d) for d in await svc.store.list_deployments()]


@router.post(
    "",
    status_code=201,
    responses=refusals(
        {
            404: "No agent `agent_id` (or an agent it delegates to), or no workflow `workflow_id`",
            409: "A chat deployment with this slug exists",
        }
    ),
)
async def create_deployment(body: DeploymentCreate, svc: Svc) -> DeploymentOut:
    if await svc.store.get_deployment(body.slug) is not None:
        raise Conflict(f"Chat deployment {body.slug!r} exists; PATCH it", field="slug")
    settings = DeploymentSettings.model_validate(body.model_dump(exclude={"password"}))
    password_hash = hash_password(body.password) if body.password else None
    return _out(svc, await deploy(svc, settings, password_hash))


@router.get("/{slug}")
async def get_deployment(slug: str, svc: Svc) -> DeploymentOut:
    return _out(svc, await deployment_or_404(svc, slug))


@router.patch("/{slug}")
async def update_deployment(slug: str, update: DeploymentUpdate, svc: Svc) -> DeploymentOut:
    """Change settings; also re-snapshots the agent, like a redeploy."""
    stored = await deployment_or_404(svc, slug)
    password_hash = hash_password(update.password) if update.password else stored.password_hash
    return _out(svc, await deploy(svc, stored.settings.updated(update), password_hash))


@router.post("/{slug}/redeploy")
async def redeploy(slug: str, svc: Svc) -> DeploymentOut:
    """Pick up the agent's current model, tools and instructions (or the workflow's
    current definition)."""
    stored = await deployment_or_404(svc, slug)
    return _out(svc, await deploy(svc, stored.settings, stored.password_hash))


@router.delete("/{slug}", status_code=204)
async def delete_deployment(slug: str, svc: Svc) -> Response:
    if not await svc.store.delete_deployment(slug):
        raise NotFound(f"No chat deployment {slug!r}", field="slug")
    return Response(status_code=204)
