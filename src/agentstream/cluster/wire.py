"""Events as the shared live log holds them: JSON text, as ``EventAdapter`` reads it back;
and a run's consecutive tokens packed into one payload (``Pack``).

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
from dataclasses import asdict, dataclass, replace
from typing import TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from agentstream.events import TOKEN_TYPES, Event, EventAdapter, Token, make_token

__all__ = [
    "Pack",
    "event_of",
    "events_json",
    "packed_events",
    "packed_first_seq",
    "packs_json",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

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
    try:  # the Python dump, not mode="json", which refuses a lone surrogate in a key
        return _standard_json(EventAdapter.dump_python(event))
    except (ValueError, TypeError) as exc:  # PydanticSerializationError is a ValueError
        logger.error("Left out of the live log, %s %d: %s", event.run_id, event.seq, exc)
        return None


def _standard_json(python: object) -> bytes:
    """JSON by the standard library, which writes a lone surrogate as its escape."""
    return json.dumps(python, separators=(",", ":"), default=to_jsonable_python).encode()


def event_of(payload: bytes) -> Event:
    """The event written as ``payload`` (``events_json``)."""
    return _read(EventAdapter, payload)


def _read(adapter: TypeAdapter[T], payload: bytes) -> T:
    """``payload`` read by pydantic's parser, or by the standard library's where it found
    invalid JSON (a lone surrogate's escape, maybe)."""
    try:
        return adapter.validate_json(payload)
    except ValidationError as exc:
        if exc.errors()[0]["type"] != "json_invalid":
            raise
        return adapter.validate_python(json.loads(payload))


@dataclass(slots=True)
class Pack:
    """A run's consecutive tokens of one kind, block and step, none with a separator, as
    one entry of the shared log: their times and texts in two lists, the rest once.

    A run's tokens are kept so while they wait for their batch (``RedisLog.append`` adds
    each to the pack before it where it goes on): a pack and its two lists are three
    objects for the garbage collector to track however many tokens they hold, where the
    events themselves, an object each held until its batch (up to a second), set off most
    of its passes in a busy process. A pack's JSON takes half the time of its tokens' own,
    and it is one entry: a stream's entries, and Redis's work, are a few times fewer."""

    type: str
    run_id: str
    seq: int
    """The first token's."""
    block_id: str | None
    step: int
    ts: list[float]
    deltas: list[str]

    @classmethod
    def of(cls, token: Token) -> Pack:
        """A pack of ``token`` alone (one with no separator), for more to join."""
        return cls(
            TOKEN_TYPES[type(token)],
            token.run_id,
            token.seq,
            token.block_id,
            token.step,
            [token.ts],
            [token.delta],
        )

    @property
    def last_seq(self) -> int:
        return self.seq + len(self.ts) - 1

    def split_off(self, count: int) -> Pack:
        """The first ``count`` tokens (fewer than it holds), taken out as a pack of their
        own."""
        head = replace(self, ts=self.ts[:count], deltas=self.deltas[:count])
        del self.ts[:count], self.deltas[:count]
        self.seq += count
        return head


_PACKS = TypeAdapter(Pack)
_KINDS = {name: kind for kind, name in TOKEN_TYPES.items()}


def packs_json(packs: list[Pack]) -> list[bytes]:
    """The JSON of each pack, in C's loop (``map``): by pydantic's serializer, or the
    standard library's for a pack with a lone surrogate (as for an event's)."""
    try:
        return list(map(_PACKS.serializer.to_json, packs))
    except PydanticSerializationError:
        return [_pack_json(pack) for pack in packs]


def _pack_json(pack: Pack) -> bytes:
    try:
        return _PACKS.serializer.to_json(pack)
    except PydanticSerializationError:  # a lone surrogate
        return _standard_json(asdict(pack))


def packed_events(payload: bytes) -> list[Event]:
    """The tokens packed as ``payload`` (``packs_json``), equal to those that were."""
    pack = _read(_PACKS, payload)
    kind, seq = _KINDS[pack.type], pack.seq
    return [
        make_token(kind, pack.run_id, seq + i, ts, pack.block_id, pack.step, delta)
        for i, (ts, delta) in enumerate(zip(pack.ts, pack.deltas, strict=True))
    ]


def packed_first_seq(payload: bytes) -> int:
    """The seq of the first token packed as ``payload``."""
    return _read(_PACKS, payload).seq
