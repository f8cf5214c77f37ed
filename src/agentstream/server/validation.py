"""What every request is checked for before a handler sees it, and field types shared by
request bodies.

Three things no route can use: NUL characters (PostgreSQL text cannot hold them, and no
person types one), non-finite numbers (Python's JSON parser reads ``NaN``, ``Infinity`` and
``1e999`` as floats that JSON cannot carry back out) and data nested deeper than
``MAX_JSON_DEPTH`` (encoders and the stack give out further on). ``check_request`` refuses
them, naming the field, in path and query parameters, JSON bodies and form fields; it is a
dependency of the whole app, so a new route cannot miss it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import Field
from starlette.datastructures import UploadFile

from agentstream.errors import UserError

__all__ = ["MAX_JSON_DEPTH", "TOO_DEEP", "MessageText", "check_json", "check_request"]

MAX_JSON_DEPTH = 64
"""How deeply arrays and objects may nest in a request body (the body itself is level 0)."""
TOO_DEEP = f"nested deeper than {MAX_JSON_DEPTH} levels"

MessageText = Annotated[str, Field(min_length=1, max_length=200_000)]
"""What a person sends: 1 to 200,000 characters (``check_request`` refuses NUL)."""

FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


async def check_request(request: Request) -> None:
    """Refuse NUL in any parameter or text, and non-finite or too deeply nested JSON."""
    for name, value in request.path_params.items():
        _check_text(str(value), name)
    for name, value in request.query_params.multi_items():
        _check_text(value, name)
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or route.body_field is None:
        return  # the handler reads no body: neither does this
    content_type = request.headers.get("content-type", "").lower()
    if _is_json(content_type) and await request.body():
        check_json(await request.json())  # parsed (and kept) by FastAPI already
    elif content_type.startswith(FORMS):
        for name, item in (await request.form()).multi_items():
            _check_text(item.filename or "" if isinstance(item, UploadFile) else item, name)


def check_json(value: Any) -> None:
    """Raise ``UserError`` for the first field found nested deeper than ``MAX_JSON_DEPTH``,
    holding a non-finite number, or a string or key with NUL."""
    pending: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while pending:
        item, path = pending.pop()
        if len(path) > MAX_JSON_DEPTH:
            field = path[0] if isinstance(path[0], str) else "body"  # the top-level field
            raise UserError(f"{field}: {TOO_DEEP}", field=field)
        if isinstance(item, str):
            _check_text(item, _dotted(path))
        elif isinstance(item, float) and not math.isfinite(item):
            field = _dotted(path)
            raise UserError(
                f"{field}: {item} is not a JSON number: send finite numbers", field=field
            )
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key, _dotted(path))
                pending.append((child, (*path, key)))
        elif isinstance(item, list):
            pending.extend((child, (*path, index)) for index, child in enumerate(item))


def _check_text(text: str, field: str) -> None:
    if "\x00" in text:
        raise UserError(f"{field}: may not contain NUL (\\u0000) characters", field=field)


def _dotted(path: tuple[str | int, ...]) -> str:
    return ".".join(str(part) for part in path) or "body"


def _is_json(content_type: str) -> bool:
    """The rule FastAPI parses bodies by: ``application/json`` or ``application/*+json``."""
    media_type = content_type.split(";", 1)[0].strip()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )
