"""API key authentication: ``apikey: KEY`` or ``Authorization: Bearer KEY``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from agentstream.server.services import Services, services

__all__ = ["api_key_of", "require_api_key"]

# The two ways to present a key, as OpenAPI security schemes: operations that require a key
# declare both (either will do), so the docs' "Authorize" sends it.
APIKEY_HEADER = APIKeyHeader(
    name="apikey", scheme_name="apikey", description="An API key", auto_error=False
)
BEARER = HTTPBearer(scheme_name="bearer", description="An API key", auto_error=False)


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
    apikey: Annotated[str | None, Security(APIKEY_HEADER)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
) -> str:
    """The caller's key name (who did it, for the record); 401 without a valid key."""
    key = apikey or (bearer.credentials if bearer else None)
    name = None if key is None else await svc.store.api_key_name(key)
    if name is None:
        raise HTTPException(
            401,
            "Missing or invalid API key: send it as 'apikey: KEY' or 'Authorization: Bearer KEY'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return name
