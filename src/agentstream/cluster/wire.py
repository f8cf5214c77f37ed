"""Events as the shared live log holds them: JSON text, as ``EventAdapter`` reads it back.

A string may hold a lone surrogate (half a pair, which a provider's JSON may carry), which
pydantic's serializer refuses to write and its parser to read: an event with one is
written by the standard library, as ``\\ud800`` escapes (the JSON standard allows them),
and read back by it. An event that neither can write (an object in a workflow's result
that JSON has no form for) is left out and logged: its seq is a hole, which viewers read
past, and the writer goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from agentstream.events import Event, EventAdapter

__all__ = ["event_of", "events_json"]

logger = logging.getLogger(__name__)

_SERIALIZERS: dict[type[Event], Callable[[Event], bytes]] = {}


def events_json(events: list[Event]) -> tuple[list[Event], list[bytes]]:
    """``events`` (all of one kind) that could be written, and the JSON of each, in C's
    loop (``map``): by the serializer of the kind's own schema, made the first time. A
    token's in 0.6 µs, where the adapter's ``dump_json`` (a Python wrapper around it)
    takes 1.2, ``pydantic_core.to_json`` 1.5 (it infers the fields each time) and the
    union's (``EventAdapter``) 2.2; a format string of the token's fields took twice the
    serializer's time (``timeit``, docs/benchmarks.md)."""
    kind = type(events[0])
    if (to_json := _SERIALIZERS.get(kind)) is None:
        to_json = _SERIALIZERS[kind] = TypeAdapter(kind).serializer.to_json
    try:
        return events, list(map(to_json, events))
    except PydanticSerializationError:  # a lone surrogate somewhere
        written = [(event, payload) for event in events if (payload := _json(event, to_json))]
        return [event for event, _ in written], [payload for _, payload in written]


def _json(event: Event, to_json: Callable[[Event], bytes]) -> bytes | None:
    try:
        return to_json(event)
    except PydanticSerializationError:
        pass
    try:
        python = EventAdapter.dump_python(event)  # not mode="json": it encodes each key
        return json.dumps(python, separators=(",", ":"), default=to_jsonable_python).encode()
    except (ValueError, TypeError) as exc:  # PydanticSerializationError is a ValueError
        logger.error("Left out of the live log, %s %d: %s", event.run_id, event.seq, exc)
        return None


def event_of(payload: bytes) -> Event:
    """The event written as ``payload`` (``events_json``)."""
    try:
        return EventAdapter.validate_json(payload)
    except ValidationError as exc:
        if exc.errors()[0]["type"] != "json_invalid":
            raise
        return EventAdapter.validate_python(json.loads(payload))  # a lone surrogate, maybe
