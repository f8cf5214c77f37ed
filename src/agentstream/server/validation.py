"""What every request is checked for before a handler sees it (``agentstream.inputs``: no
NUL, no non-finite numbers, nothing nested past ``MAX_DEPTH``), and field types shared by
request bodies.

``check_request`` is a dependency of the whole app, so a new route cannot miss it: it
checks path and query parameters, JSON bodies and form fields, and names the field.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import Field
from starlette.datastructures import UploadFile

from agentstream.errors import UserError
from agentstream.inputs import find_problem

__all__ = ["MessageText", "check_request", "is_json"]

MessageText = Annotated[str, Field(min_length=1, max_length=200_000)]
"""What a person sends: 1 to 200,000 characters (``check_request`` refuses NUL)."""

FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


async def check_request(request: Request) -> None:
    """Refuse a request whose parameters or body hold what nothing can use."""
    for name, value in request.path_params.items():
        _check(str(value), name)
    for name, value in request.query_params.multi_items():
        _check(value, name)
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or route.body_field is None:
        return  # the handler reads no body: neither does this
    content_type = request.headers.get("content-type", "").lower()
    if is_json(content_type) and await request.body():
        try:
            body = await request.json()  # parsed (and kept) by FastAPI already
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or too deep to parse:
            return  # a route that reads a form got it, and refuses it as a form (a 422)
        _check(body)
    elif content_type.startswith(FORMS):
        for name, item in (await request.form()).multi_items():
            _check(item.filename or "" if isinstance(item, UploadFile) else item, name)


def _check(value: Any, name: str | None = None) -> None:
    """``name``: the parameter that is ``value``; None for a JSON body, whose top-level
    fields name themselves."""
    problem = find_problem(value)
    if problem is None:
        return
    field = name or problem.field
    raise UserError(f"{field}: {problem.message}", field=field)


def is_json(content_type: str) -> bool:
    """The rule FastAPI parses bodies by: ``application/json`` or ``application/*+json``,
    read as ``email.message`` reads a content type (a media type without exactly one ``/``
    is none of them)."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return (
        kind == "application"
        and "/" not in subtype
        and (subtype == "json" or subtype.endswith("+json"))
    )
