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
) -> str:
    """The caller's key name (who did it, for the record); 401 without a valid key."""
    key = api_key_of(apikey, authorization)
    name = None if key is None else await svc.store.api_key_name(key)
    if name is None:
        raise HTTPException(
            401,
            "Missing or invalid API key: send it as 'apikey: KEY' or 'Authorization: Bearer KEY'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return name
