"""References to upstream outputs inside block configuration: ``<block.field.sub>``.

A reference names a block and at least one field, so ``<b>`` in HTML is left alone. A
string that is exactly one reference takes the referenced value as is (an object stays an
object); references inside longer text are interpolated, non-strings as JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agentstream.workflows.errors import BlockFailed

__all__ = ["BadReference", "Reference", "as_text", "find_references", "lookup", "resolve"]

_REFERENCE = re.compile(r"<([A-Za-z_]\w*)((?:\.\w+)+)>")


class BadReference(BlockFailed):
    """A reference names a field its block's output does not have."""


@dataclass(frozen=True, slots=True)
class Reference:
    block_id: str
    path: tuple[str, ...]
    """The field, then sub-fields (keys, or list indices as digits)."""

    def __str__(self) -> str:
        return f"<{'.'.join((self.block_id, *self.path))}>"


def find_references(value: Any) -> Iterator[Reference]:
    """Every reference in a configuration value: strings, and inside lists and objects."""
    if isinstance(value, str):
        for match in _REFERENCE.finditer(value):
            yield _reference(match)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from find_references(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from find_references(item)


def resolve(value: Any, outputs: Mapping[str, Mapping[str, Any] | None]) -> Any:
    """``value`` with its references replaced by what they point to in ``outputs`` (the
    block outputs by id; None for a block that was skipped, whose fields read as null)."""
    if isinstance(value, str):
        whole = _REFERENCE.fullmatch(value)
        if whole:
            return lookup(_reference(whole), outputs)
        return _REFERENCE.sub(lambda m: as_text(lookup(_reference(m), outputs)), value)
    if isinstance(value, Mapping):
        return {key: resolve(item, outputs) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [resolve(item, outputs) for item in value]
    return value


def lookup(reference: Reference, outputs: Mapping[str, Mapping[str, Any] | None]) -> Any:
    """The referenced value. A top-level field the block did not produce (``error`` of a
    block that succeeded, or any field of a skipped one) is null; a missing sub-field is an
    error, since it points into data that is not shaped as the author thought."""
    field, *rest = reference.path
    value = (outputs.get(reference.block_id) or {}).get(field)
    walked = [reference.block_id, field]
    for key in rest:
        if isinstance(value, Mapping) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise BadReference(
                f"{reference}: {'.'.join(walked)} has no field {key!r} (it is {_describe(value)})"
            )
        walked.append(key)
    return value


def _reference(match: re.Match[str]) -> Reference:
    return Reference(match[1], tuple(match[2][1:].split(".")))


def as_text(value: Any) -> str:
    """A value where text is wanted: strings as they are, null as nothing, the rest as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__}" if not isinstance(value, Mapping) else "an object"
