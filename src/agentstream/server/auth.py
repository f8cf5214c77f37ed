"""API key authentication: ``apikey: KEY`` or ``Authorization: Bearer KEY``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException

from agentstream.server.services import Services, services

__all__ = ["require_api_key"]


async def require_api_key(
    svc: Annotated[Services, Depends(services)],
    apikey: Annotated[str | None, Header(include_in_schema=False)] = None,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> None:
    key = apikey
    if key is None and authorization is not None:
        scheme, _, token = authorization.partition(" ")
        key = token.strip() if scheme.lower() == "bearer" else None
    if not key or not await svc.store.is_api_key(key):
        raise HTTPException(
            401,
            "Missing or invalid API key: send it as 'apikey: KEY' or 'Authorization: Bearer KEY'",
            headers={"WWW-Authenticate": "Bearer"},
        )
