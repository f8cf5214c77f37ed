"""Events as the shared live log holds them: JSON text, as ``EventAdapter`` reads it back.

Any string goes through, lone surrogates too (text a provider's JSON carried), which
pydantic's serializer refuses to write and its parser to read: an event with one is
written by the standard library, as ``\\ud800`` escapes (the JSON standard allows them),
and read back by it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from agentstream.events import Event, EventAdapter

__all__ = ["event_of", "events_json"]

_SERIALIZERS: dict[type[Event], Callable[[Event], bytes]] = {}


def events_json(events: list[Event]) -> list[bytes]:
    """The JSON of each of ``events``, all of one kind, in C's loop (``map``): by the
    serializer of the kind's own schema, made the first time. A token's in 0.6 µs, where
    the adapter's ``dump_json`` (a Python wrapper around it) takes 1.2,
    ``pydantic_core.to_json`` 1.5 (it infers the fields each time) and the union's
    (``EventAdapter``) 2.2; a format string of the token's fields took twice the
    serializer's time (``timeit``, docs/benchmarks.md)."""
    kind = type(events[0])
    if (to_json := _SERIALIZERS.get(kind)) is None:
        to_json = _SERIALIZERS[kind] = TypeAdapter(kind).serializer.to_json
    try:
        return list(map(to_json, events))
    except PydanticSerializationError:  # a lone surrogate somewhere
        return [_json(event, to_json) for event in events]


def _json(event: Event, to_json: Callable[[Event], bytes]) -> bytes:
    try:
        return to_json(event)
    except PydanticSerializationError:
        python = EventAdapter.dump_python(event, mode="json")
        return json.dumps(python, separators=(",", ":")).encode()


def event_of(payload: bytes) -> Event:
    """The event written as ``payload`` (``events_json``)."""
    try:
        return EventAdapter.validate_json(payload)
    except ValidationError:  # maybe a lone surrogate, which only the standard library reads
        return EventAdapter.validate_python(json.loads(payload))
