"""API key authentication: ``apikey: KEY`` or ``Authorization: Bearer KEY``; in a browser
signed in to the console, its session cookie (``CONSOLE_COOKIE``) instead."""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import HTTPException, Request
from fastapi.openapi import models
from fastapi.security.base import SecurityBase

from agentstream.errors import Forbidden
from agentstream.server.services import services

__all__ = ["BEARER_SCHEME", "CONSOLE_COOKIE", "api_key_of", "require_api_key", "same_origin"]

CONSOLE_COOKIE = "agentstream_console"
"""A console sign-in (``server.console``): HttpOnly, SameSite=Strict."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def api_key_of(apikey: str | None, authorization: str | None) -> str | None:
    """The key a request presents, from either header."""
    if apikey:
        return apikey
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


def same_origin(request: Request) -> bool:
    """Whether the request comes from a page of this server: its ``Origin`` names the host
    (and port) the request was sent to. Browsers send ``Origin`` with every request that
    can change something; a cookie alone must not (cross-site request forgery, should the
    cookie's SameSite be ignored, or a sibling host send it). Behind a proxy, that proxy
    must pass the ``Host`` the browser sent (nginx: ``proxy_set_header Host $http_host``)."""
    origin = request.headers.get("origin")
    host = request.headers.get("host")
    if not origin or not host:
        return False
    sent = urlsplit(origin)
    if sent.scheme not in _DEFAULT_PORTS or not sent.hostname:
        return False  # "null", from a sandboxed frame or a file
    default = _DEFAULT_PORTS[sent.scheme]
    received = urlsplit(f"//{host}")
    try:
        return (sent.hostname, sent.port or default) == (
            received.hostname,
            received.port or default,
        )
    except ValueError:  # a port that is not a number
        return False


_DEFAULT_PORTS = {"http": 80, "https": 443}


BEARER_SCHEME = models.HTTPBearer(description="An API key")
"""The other way to present a key, ``Authorization: Bearer KEY``: the OpenAPI document
offers it beside ``apikey`` wherever a key is asked for (``server.openapi``)."""


class ApiKeyCheck(SecurityBase):
    """The key check, a dependency that is its own OpenAPI security scheme (``apikey``), as
    FastAPI's ``APIKeyHeader`` is, so the docs' "Authorize" sends the key. It reads both
    headers itself: one dependency for each, as FastAPI's schemes, made FastAPI solve three
    dependencies a request where this is one (6% of a run start's instructions)."""

    def __init__(self) -> None:
        self.model = models.APIKey(
            **{"in": models.APIKeyIn.header}, name="apikey", description="An API key"
        )
        self.scheme_name = "apikey"

    async def __call__(self, request: Request) -> str:
        """The caller's key name (who did it, for the record); 401 without a valid key. The
        services are looked up here, not declared: a declared one would be one more
        dependency to solve, on every request of the key's routes."""
        svc = await services(request)
        headers = request.headers
        key = api_key_of(headers.get("apikey"), headers.get("authorization"))
        name = None
        if key is not None:
            name = await svc.store.api_key_name(key)
        elif (session := request.cookies.get(CONSOLE_COOKIE)) is not None:
            name = await svc.store.console_sessions.key_name(session)
            if name is not None and request.method not in SAFE_METHODS and not same_origin(request):
                raise Forbidden("A console session acts only from the console's own pages")
        if name is None:
            raise HTTPException(
                401,
                "Missing or invalid API key: send it as 'apikey: KEY' or "
                "'Authorization: Bearer KEY'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return name


require_api_key = ApiKeyCheck()
