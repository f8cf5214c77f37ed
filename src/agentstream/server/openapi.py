"""The OpenAPI document, with the errors the server really sends: ``{"error": {"code",
"message", "field"}}`` (``server.errors``) under each status an operation can answer with,
in place of FastAPI's ``{"detail": [...]}``, which this server never sends. The statuses
follow from each operation's shape, so a new route is documented without being listed."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

__all__ = ["document_errors"]


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


REF = "#/components/schemas/{model}"
ERROR_RESPONSE = {"content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}}
# FastAPI's own error schemas, which no response of this server has.
FRAMEWORK_ERRORS = ("HTTPValidationError", "ValidationError")


def _statuses(path: str, operation: dict[str, Any]) -> dict[str, str]:
    """The error statuses an operation can answer with, and when."""
    statuses = {}
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


def _with_errors(schema: dict[str, Any]) -> dict[str, Any]:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in FRAMEWORK_ERRORS:
        components.pop(name, None)
    _, definitions = models_json_schema([(Error, "serialization")], ref_template=REF)
    components.update(definitions["$defs"])
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for status, description in _statuses(path, operation).items():
                responses[status] = {"description": description, **ERROR_RESPONSE}
    return schema


def document_errors(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI document declare the server's error responses."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _with_errors(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way
