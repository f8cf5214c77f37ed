"""What agentstream accepts from outside: data its stores and streams can hold, and request
models that take values as given.

Three things nothing can use: NUL characters (PostgreSQL text cannot hold them, and no
person types one), non-finite numbers (Python's JSON parser reads ``NaN``, ``Infinity`` and
``1e999`` as floats that JSON cannot carry back out) and data nested deeper than
``MAX_DEPTH`` (encoders and the stack give out further on). The server refuses them at
input; a workflow block whose output holds one fails.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict
from pydantic_core import ErrorDetails

__all__ = ["MAX_DEPTH", "TOO_DEEP", "InputModel", "Problem", "find_problem", "message_of"]

MAX_DEPTH = 64
"""How deeply arrays and objects may nest (the value itself is level 0)."""
TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"


class InputModel(BaseModel):
    """A model of what callers send: unknown fields are refused and nothing is coerced
    (``"yes"`` is not a boolean, ``true`` not an integer, ``"5"`` not a number)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def message_of(error: ErrorDetails) -> str:
    """What a validation error says: pydantic's message, or for a check of ours, ours (not
    pydantic's "Value error, " in front of it)."""
    if error["type"] == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])
    return error["msg"]


class Problem(NamedTuple):
    """Where a value holds something nothing can use, and what."""

    path: tuple[str | int, ...]
    message: str

    @property
    def field(self) -> str:
        """The path, dotted: ``input.items.2``; ``body`` for the value itself."""
        return ".".join(str(part) for part in self.path) or "body"

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def find_problem(value: Any) -> Problem | None:
    """The first string or key with NUL, non-finite number, or container nested deeper than
    ``MAX_DEPTH`` (then named by its top-level field) in ``value`` (JSON-like data), if any."""
    pending: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while pending:
        item, path = pending.pop()
        if len(path) > MAX_DEPTH:  # the deep path says little: name the top-level field
            return Problem(path[:1], TOO_DEEP)
        if isinstance(item, str):
            if "\x00" in item:
                return Problem(path, "may not contain NUL (\\u0000) characters")
        elif isinstance(item, float):
            if not math.isfinite(item):
                return Problem(path, f"{item} is not a finite number (JSON has no NaN or Infinity)")
        elif isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in str(key):
                    return Problem(path, "may not contain NUL (\\u0000) characters in keys")
                pending.append((child, (*path, key)))
        elif isinstance(item, list | tuple):
            pending.extend((child, (*path, index)) for index, child in enumerate(item))
    return None
