"""Every refusal is JSON that names the problem: ``{"error": {"code", "message", "field"}}``;
under ``/v1/`` (the OpenAI-compatible API) in OpenAI's shape, ``{"error": {"message",
"type", "param", "code"}}``, which its official clients read into their exceptions."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentstream.errors import UserError
from agentstream.inputs import TOO_DEEP, message_of
from agentstream.workflows.errors import WorkflowInvalid

logger = logging.getLogger(__name__)

__all__ = ["BodyLimit", "error_response", "install_error_handlers"]


OPENAI_PATHS = "/v1/"


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    field: str | None = None,
    details: Any = None,
    path: str = "",
) -> JSONResponse:
    """The refusal of a request to ``path``."""
    body: dict[str, Any]
    if path.startswith(OPENAI_PATHS):
        kind = "server_error" if status >= 500 else "invalid_request_error"
        body = {"message": message, "type": kind, "param": field, "code": code}
    else:
        body = {"code": code, "message": message, "field": field}
        if details is not None:
            body["details"] = details
    return JSONResponse({"error": body}, status_code=status)


def _field(location: tuple[Any, ...]) -> str:
    parts = [str(p) for p in location if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = [{"field": _field(tuple(e["loc"])), "message": message_of(e)} for e in exc.errors()]
    if any(e["type"] == "json_invalid" for e in exc.errors()):
        return error_response(
            400,
            "invalid_json",
            "The request body is not valid JSON",
            field="body",
            path=request.url.path,
        )
    first = details[0]
    return error_response(
        422,
        "invalid_request",
        f"{first['field']}: {first['message']}",
        field=first["field"],
        details=details,
        path=request.url.path,
    )


async def _user_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UserError)
    details = (
        [issue.as_dict() for issue in exc.issues] if isinstance(exc, WorkflowInvalid) else None
    )
    response = error_response(
        exc.status_code,
        exc.code,
        exc.message,
        field=exc.field,
        details=details,
        path=request.url.path,
    )
    response.headers.update(exc.headers)
    return response


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if isinstance(exc.__cause__, RecursionError):  # JSON too deep for the parser itself
        return error_response(422, "invalid_request", f"body: {TOO_DEEP}", field="body", path=path)
    if exc.status_code == 400:  # the framework could not decode the body (e.g. not UTF-8)
        return error_response(
            400,
            "invalid_body",
            f"{exc.detail}: send a UTF-8 encoded JSON object",
            field="body",
            path=path,
        )
    if exc.status_code == 413:
        return error_response(413, "body_too_large", str(exc.detail), field="body", path=path)
    codes = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}
    response = error_response(
        exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail), path=path
    )
    response.headers.update(exc.headers or {})
    return response


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    """The database cannot be reached (down, restarting, failing over, gone): say so, and
    when to try again. Any other database error is ours: a JSON 500. (A refused connection
    comes from the driver as it is, not wrapped.)"""
    away = isinstance(exc, ConnectionError) or (
        isinstance(exc, DBAPIError)
        and (
            isinstance(exc, OperationalError | InterfaceError)
            or exc.connection_invalidated
            or exc.statement is None  # failed to connect at all
        )
    )
    if isinstance(exc, IntegrityError):  # two requests created the same thing at once
        return error_response(
            409,
            "conflict",
            "It was created at the same time by another request; try again",
            path=request.url.path,
        )
    if not away:
        logger.error("Database error", exc_info=exc)
        return error_response(
            500, "internal_error", "Internal error; the server log has it", path=request.url.path
        )
    logger.error("The database is unavailable: %s", exc)
    return _unavailable("The database is unavailable; try again shortly", request)


async def _database_busy(request: Request, exc: Exception) -> JSONResponse:
    """Every connection of the pool stayed busy for as long as a query waits for one."""
    logger.warning("The database is busy: %s", exc)
    return _unavailable("The database is busy; try again shortly", request)


def _unavailable(message: str, request: Request) -> JSONResponse:
    response = error_response(503, "unavailable", message, path=request.url.path)
    response.headers["Retry-After"] = "5"
    return response


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(UserError, _user_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(ConnectionError, _database_error)
    app.add_exception_handler(PoolTimeout, _database_busy)


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with a JSON 413, declared or streamed.

    (FastAPI's own ``max_body_size`` answers a too-large Content-Length in plain text.)
    """

    def __init__(
        self, app: ASGIApp, *, limit: int, uploads: re.Pattern[str], upload_limit: int
    ) -> None:
        """Paths matching ``uploads`` (document uploads) may send up to ``upload_limit``."""
        self.app = app
        self.limit = limit
        self.uploads = uploads
        self.upload_limit = upload_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.upload_limit if self.uploads.fullmatch(scope["path"]) else self.limit
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            response = error_response(
                413,
                "body_too_large",
                f"The request body exceeds {limit} bytes",
                field="body",
                path=scope["path"],
            )
            await response(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise HTTPException(413, f"The request body exceeds {limit} bytes")
            return message

        await self.app(scope, receive_within_limit, send)
