"""The OpenAPI document, with the errors the server really sends: ``{"error": {"code",
"message", "field"}}`` (``server.errors``; OpenAI's shape under ``/v1/``) under each status
an operation can answer with, in place of FastAPI's ``{"detail": [...]}``, which this
server never sends.

Each streaming operation documents its frames under ``text/event-stream``: the JSON Schema
of the ``data:`` of each frame, generated from the view's frame models (``views.native``,
``views.workflow``, ``views.chat``, ``views.canvas``) by ``event_stream``, so it cannot
drift from them; the third-party protocols (OpenAI, the AI SDK, AG-UI) are named instead.

Two sources of statuses: those that follow from an operation's shape (a body: 400, 413;
a key: 401; an id in the path: 404; parameters: 422), so a new route is documented without
being listed; and those only the route knows (409, 429, 503, ...), declared where it is
defined with ``responses=refusals(...)``. Either way the body's schema is filled in here.

A key is two schemes, either will do: ``apikey``, which FastAPI documents from the key's
dependency (``auth.require_api_key``), and ``bearer``, added here beside it.
"""

from __future__ import annotations

import json as _json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from pydantic import BaseModel, Field, TypeAdapter
from pydantic.json_schema import models_json_schema

from agentstream.server.auth import BEARER_SCHEME, require_api_key

__all__ = [
    "CANCELS_RUN",
    "STARTS_RUN",
    "document_errors",
    "event_stream",
    "refusals",
]


class ErrorDetail(BaseModel):
    code: str = Field(description="What went wrong, for programs", examples=["not_found"])
    message: str = Field(description="What went wrong, for people")
    field: str | None = Field(description="The input at fault, dotted, if one is")
    details: list[Any] | None = Field(
        default=None, description="Every problem found, when there are several"
    )


class Error(BaseModel):
    """Every refusal."""

    error: ErrorDetail


class OpenAIErrorDetail(BaseModel):
    message: str = Field(description="What went wrong, for people")
    type: str = Field(description="``invalid_request_error``, or ``server_error`` for a 5xx")
    param: str | None = Field(description="The input at fault, dotted, if one is")
    code: str | None = Field(description="What went wrong, for programs")


class OpenAIError(BaseModel):
    """Every refusal under ``/v1/``, in OpenAI's shape: the official clients read it into
    their exceptions."""

    error: OpenAIErrorDetail


REF = "#/components/schemas/{model}"
OPENAI_PATHS = "/v1/"


def _error_content(path: str) -> dict[str, Any]:
    model = "OpenAIError" if path.startswith(OPENAI_PATHS) else "Error"
    return {"application/json": {"schema": {"$ref": REF.format(model=model)}}}


def refusals(*declared: Mapping[int, str]) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses=``: the refusals only it can make, each status with when
    (``{409: "The agent exists"}``, ``STARTS_RUN``); ``document_errors`` adds the body."""
    return {status: {"description": text} for each in declared for status, text in each.items()}


STARTS_RUN: Mapping[int, str] = {
    503: "No run can start now: this process is shutting down (`shutting_down`; another "
    "takes new runs), the agent's model cannot run on this server (`model_unavailable`), "
    "or, in cluster mode, Redis is away (`unavailable`). `Retry-After` says when to try again"
}
"""Every operation that starts or continues a run."""

CANCELS_RUN: Mapping[int, str] = {
    503: "In cluster mode, Redis is away (`unavailable`): the process that executes the run "
    "cannot be told. `Retry-After` says when to try again"
}
"""Every operation that stops a run, wherever it executes."""
# FastAPI's own error schemas, which no response of this server has.
FRAMEWORK_ERRORS = ("HTTPValidationError", "ValidationError")
FASTAPI_422 = {
    "description": "Validation Error",
    "content": {"application/json": {"schema": {"$ref": REF.format(model="HTTPValidationError")}}},
}


def _statuses(path: str, method: str, operation: dict[str, Any]) -> dict[str, str]:
    """The error statuses an operation can answer with, and when."""
    statuses = {}
    if "security" in operation and method not in {"get", "head", "options"}:
        statuses["403"] = (
            "Signed in by the console's cookie, but not sent from this server's own pages "
            "(`Origin`)"
        )
    if "requestBody" in operation:
        statuses["400"] = "The body cannot be read (not JSON, or not UTF-8)"
        statuses["413"] = "The body is too large"
    if "security" in operation:
        statuses["401"] = "Missing or invalid API key"
    if "{" in path:
        statuses["404"] = "Nothing has that id"
    if "requestBody" in operation or operation.get("parameters"):
        statuses["422"] = "A parameter or the body is not valid"
    return statuses


POST_FRAMING = (
    "Server-Sent Events: each frame is one `data:` line holding one JSON value (the schema "
    "below), then a blank line; no `id:` or `event:` lines. While the run is silent, "
    "`: keepalive` comment lines. Leaving (closing the connection) cancels the run."
)
"""How a stream that a POST started is framed (``server.streams``)."""

FOLLOW_FRAMING = (
    "Server-Sent Events: each frame is an `id: <seq>` line (an EventSource sends it back as "
    "`Last-Event-ID` when it reconnects), then one `data:` line holding one JSON value (the "
    "schema below), then a blank line. While the run is silent, `: keepalive` comment "
    "lines. Leaving only stops following."
)
"""How a followed stream (a GET) is framed."""


def event_stream(
    what: str,
    framing: str,
    frames: TypeAdapter[Any] | None = None,
    *,
    name: str = "",
    protocol: str = "",
    ids: bool | None = False,
    json: Mapping[str, Any] | None = None,
) -> dict[int | str, dict[str, Any]]:
    """A streaming route's ``responses=`` for 200: ``what`` it streams and its ``framing``.

    The ``text/event-stream`` schema describes one event, as OpenAPI 3.1 reads it (3.2's
    ``itemSchema``): its ``data`` is JSON (``contentMediaType``) whose ``contentSchema`` is
    generated from the view's ``frames`` (the component ``name``); a third-party
    ``protocol`` is named instead. ``ids``: each event has an ``id:`` (its seq), else none;
    None: either.
    ``json``: the answer's ``application/json`` content, when it may not stream."""
    data: dict[str, Any] = {"type": "string"}
    if frames is not None:
        frame = frames.json_schema(ref_template=REF, mode="serialization")
        frame["title"] = name
        frame["description"] = "Any frame of the stream"
        data |= {"contentMediaType": "application/json", "contentSchema": frame}
        kinds = [
            kind["$ref"].rsplit("/", 1)[1] if "$ref" in kind else f"`{_json.dumps(kind['const'])}`"
            for kind in frame.get("oneOf", frame.get("anyOf", []))
        ]
        data["description"] = f"One frame, JSON: `{name}`: one of {', '.join(kinds)}"
    else:
        data["description"] = f"One frame, as {protocol} specifies"
    seq = {"type": "string", "pattern": "^[0-9]+$", "description": "The frame's seq"}
    event = {
        "type": "object",
        "description": f"One event. {framing}",
        "required": ["data", *(["id"] if ids else [])],
        "properties": {
            "data": data,
            "event": {"const": "message", "description": "No `event:` line: the default"},
            "id": False if ids is False else seq,
        },
    }
    content: dict[str, Any] = {"text/event-stream": {"schema": event}}
    if json is not None:
        content["application/json"] = dict(json)
    return {200: {"description": f"{what}. {framing}", "content": content}}


def _hoist_frames(schema: dict[str, Any]) -> None:
    """Frame schemas become components, named, with what they refer to."""
    components = schema["components"]["schemas"]
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for response in operation.get("responses", {}).values():
                stream = response.get("content", {}).get("text/event-stream", {})
                data = stream.get("schema", {}).get("properties", {}).get("data", {})
                frames = data.get("contentSchema")
                if frames is None:
                    continue
                for name, definition in {
                    **frames.pop("$defs", {}),
                    frames["title"]: frames,
                }.items():
                    if components.setdefault(name, definition) != definition:
                        raise ValueError(f"Two frame schemas named {name!r}")
                data["contentSchema"] = {"$ref": REF.format(model=frames["title"])}


PARAMETER_EXAMPLES: Mapping[str, Any] = {
    "agent_id": "demo",
    "model": "demo",
    "run_id": "run_5f0c6b1e9a2d4e7f8a3b2c1d0e9f8a7b",
    "parent_run_id": "run_5f0c6b1e9a2d4e7f8a3b2c1d0e9f8a7b",
    "response_id": "run_5f0c6b1e9a2d4e7f8a3b2c1d0e9f8a7b",
    "session_id": "ses_0d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a",
    "chat_id": "chat-1",
    "slug": "support",
    "kb_id": "handbook",
    "document_id": "doc_7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b",
    "handler_id": "ctx_1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d",
    "workflow_id": "greeting",
    "execution_id": "wfx_9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d",
    "conversationId": "c-42",
    "status": "completed",
    "since": "2026-01-01T00:00:00Z",
    "until": "2026-02-01T00:00:00Z",
    "cursor": "MjAyNi0wMS0wMVQwMDowMDowMCswMDowMHxydW5fMQ==",
    "limit": 20,
    "after": 12,
    "last-event-id": 12,
    "starting_after": 12,
    "stream": True,
    "full_history": True,
    "protocol": "agent-events-v1",
    "X-Sim-Stream-Protocol": "agent-events-v1",
}
"""An example of each parameter, by name: a name means the same thing on every operation
(``tests/test_api_examples.py`` fails on a parameter without one).
The ids are those a demo server has once the request examples have created what they
name (``tests/test_api_examples.py``)."""


def _with_examples(schema: dict[str, Any]) -> None:
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                known = parameter["name"] in PARAMETER_EXAMPLES
                if known and "example" not in parameter and "examples" not in parameter:
                    parameter["example"] = PARAMETER_EXAMPLES[parameter["name"]]


def _with_errors(schema: dict[str, Any]) -> dict[str, Any]:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in FRAMEWORK_ERRORS:
        components.pop(name, None)
    _, definitions = models_json_schema(
        [(Error, "serialization"), (OpenAIError, "serialization")], ref_template=REF
    )
    components.update(definitions["$defs"])
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for status, description in _statuses(path, method, operation).items():
                if responses.get(status, FASTAPI_422) == FASTAPI_422:  # else the route's own
                    responses[status] = {"description": description}
            for status, response in responses.items():
                if status.isdigit() and int(status) >= 400:
                    response["content"] = _error_content(path)
    return schema


def _with_bearer(schema: dict[str, Any]) -> None:
    """Wherever FastAPI documents the key's scheme (``auth.require_api_key``: ``apikey``), a
    bearer token does as well: either will do."""
    key = require_api_key.scheme_name
    schemes = schema.get("components", {}).get("securitySchemes", {})
    if key not in schemes:
        return
    schemes["bearer"] = jsonable_encoder(BEARER_SCHEME, by_alias=True, exclude_none=True)
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            security = operation.get("security", [])
            security += [{"bearer": each[key]} for each in security if key in each]


def document_errors(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI document declare the server's error responses, and the
    bearer token beside the ``apikey`` scheme."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _with_errors(generate())
            _with_bearer(app.openapi_schema)
            _with_examples(app.openapi_schema)
            _hoist_frames(app.openapi_schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way
