"""The console: where the people who run agentstream sign in with an API key and see every
run, session, workflow execution and knowledge base (``web/console.js``).

Signing in exchanges the key for a session cookie, HttpOnly and SameSite=Strict, that the
API accepts in place of the key (``auth.require_api_key``): the page never holds the key.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, Request, Response
from fastapi.responses import FileResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field

from agentstream.errors import AccessDenied, Forbidden
from agentstream.inputs import InputModel
from agentstream.server.auth import CONSOLE_COOKIE, require_api_key, same_origin
from agentstream.server.openapi import refusals
from agentstream.server.pages import page
from agentstream.server.routing import Router
from agentstream.server.services import Services, services

__all__ = ["pages", "router"]

router = Router(prefix="/api/console", tags=["console"])
pages = Router(include_in_schema=False)
Svc = Annotated[Services, Depends(services)]


class SignIn(InputModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"api_key": "as_demo-key"}]})

    api_key: str = Field(min_length=1, max_length=200)
    """A key made with ``agentstream keys create``."""


class SignedIn(BaseModel):
    key_name: str
    """The name of the key the console acts as (approvals record it)."""


NOT_HERE = {403: "Not sent from the console's own page (`Origin`)"}


@router.post(
    "/session",
    status_code=204,
    responses=refusals({401: "Not an API key of this server"}, NOT_HERE),
)
async def sign_in(body: SignIn, request: Request, svc: Svc) -> Response:
    """Exchange an API key for a console session cookie (HttpOnly, SameSite=Strict), which
    the API then accepts in place of the key, until sign-out, for ``ttl`` hours, or until
    the key is revoked."""
    if not same_origin(request):
        raise Forbidden("Sign in from the console's own page")
    token = await svc.store.console_sessions.open(body.api_key)
    if token is None:
        raise AccessDenied("Not an API key of this server", field="api_key")
    if (earlier := request.cookies.get(CONSOLE_COOKIE)) is not None:
        await svc.store.console_sessions.close(earlier)  # one session per browser
    response = Response(status_code=204)
    response.set_cookie(
        CONSOLE_COOKIE,
        token,
        max_age=int(svc.store.console_sessions.ttl),
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


@router.get("/session")
async def whoami(name: Annotated[str, Depends(require_api_key)]) -> SignedIn:
    """Who the console (or the key presented) acts as; 401 when signed out."""
    return SignedIn(key_name=name)


@router.delete("/session", status_code=204, responses=refusals(NOT_HERE))
async def sign_out(request: Request, svc: Svc) -> Response:
    """End the console session: its cookie stops working at once, on every process."""
    if not same_origin(request):
        raise Forbidden("Sign out from the console's own page")
    if (token := request.cookies.get(CONSOLE_COOKIE)) is not None:
        await svc.store.console_sessions.close(token)
    response = Response(status_code=204)
    response.delete_cookie(CONSOLE_COOKIE, path="/", httponly=True, samesite="strict")
    return response


@pages.get("/")
async def home() -> RedirectResponse:
    """The server's address, opened in a browser: the console."""
    return RedirectResponse("/console", status_code=307)


@pages.get("/console/workflows/{workflow_id}/run")
@pages.get("/console/executions/{execution_id}")
async def run_page() -> FileResponse:
    """The workflow run view: draws a workflow and runs drafts, or replays (or follows) an
    execution; it reads which from its URL."""
    return page("run.html")


@pages.get("/console")
@pages.get("/console/{view:path}")
async def console_page(view: str = "") -> FileResponse:
    """The console; it reads what to show from its URL."""
    return page("console.html")


@pages.get("/workflows/{workflow_id}/run")
async def old_workflow_page(workflow_id: str) -> RedirectResponse:
    """Where the run view was before the console."""
    return RedirectResponse(f"/console/workflows/{quote(workflow_id)}/run", status_code=308)


@pages.get("/workflows/executions/{execution_id}")
async def old_execution_page(execution_id: str) -> RedirectResponse:
    return RedirectResponse(f"/console/executions/{quote(execution_id)}", status_code=308)
