"""The model registry over HTTP: what each model costs and can do, and whether it can run here."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from pydantic import BaseModel

from agentstream.providers.catalog import ModelInfo
from agentstream.server.auth import require_api_key
from agentstream.server.routing import Router
from agentstream.server.services import Services, services

__all__ = ["router"]

router = Router(prefix="/api/models", tags=["models"], dependencies=[Depends(require_api_key)])


class ModelOut(BaseModel):
    model: ModelInfo
    provider_label: str
    available: bool
    """The model can run on this server now: its provider's key is set, or, for a local
    server that needs no key, that server accepts a connection."""
    unavailable_reason: str | None


@router.get("")
async def list_models(svc: Annotated[Services, Depends(services)]) -> list[ModelOut]:
    registry = svc.runs.models
    return [
        ModelOut(
            model=registry.info(name),
            provider_label=registry.provider(name).label,
            available=(reason := await registry.ready(name)) is None,
            unavailable_reason=reason,
        )
        for name in registry.names()
    ]
