"""API key authentication: ``apikey: KEY`` or ``Authorization: Bearer KEY``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException

from agentstream.server.services import Services, services

__all__ = ["api_key_of", "require_api_key"]


def api_key_of(apikey: str | None, authorization: str | None) -> str | None:
    """The key a request presents, from either header."""
    if apikey:
        return apikey
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


async def require_api_key(
    svc: Annotated[Services, Depends(services)],
    apikey: Annotated[str | None, Header(include_in_schema=False)] = None,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> None:
    key = api_key_of(apikey, authorization)
    if key is None or not await svc.store.is_api_key(key):
        raise HTTPException(
            401,
            "Missing or invalid API key: send it as 'apikey: KEY' or 'Authorization: Bearer KEY'",
            headers={"WWW-Authenticate": "Bearer"},
        )
