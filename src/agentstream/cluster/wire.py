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
from dataclasses import asdict, dataclass
from typing import TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from agentstream.events import Event, EventAdapter, ReasoningDelta, TextDelta, Token
from agentstream.runlog import Deltas

__all__ = [
    "PACKED",
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


PACKED: dict[type[Token], str] = {TextDelta: "text_delta", ReasoningDelta: "reasoning_delta"}
"""The kinds of event whose runs of consecutive ones go packed: a run's tokens."""


@dataclass(slots=True)
class Pack:
    """A run's consecutive tokens of one kind, block and step, none with a separator, as
    one entry of the shared log: their times and texts in two lists, the rest once.

    A batch makes one of each run of a stream's tokens, from a pack of the in-process log
    (``runlog.Deltas``) or from the tokens it keeps as they came. A pack's JSON takes half
    the time of its tokens' own, and it is one entry: a stream's entries, and Redis's work,
    are a few times fewer."""

    type: str
    run_id: str
    seq: int
    """The first token's."""
    block_id: str | None
    step: int
    ts: list[float]
    deltas: list[str]

    @classmethod
    def of(cls, tokens: list[Token]) -> Pack:
        """A pack of ``tokens``: consecutive ones of one kind, block and step, none with a
        separator."""
        first = tokens[0]
        pack = cls(PACKED[type(first)], first.run_id, first.seq, first.block_id, first.step, [], [])
        pack.extend(tokens)
        return pack

    def goes_on_with(self, token: Token) -> bool:
        """``token`` (one with no separator) is the next after this pack's last, in it."""
        return (
            self.last_seq + 1 == token.seq
            and self.type == PACKED.get(type(token))
            and self.block_id == token.block_id
            and self.step == token.step
        )

    def extend(self, tokens: list[Token]) -> None:
        self.ts += [token.ts for token in tokens]
        self.deltas += [token.delta for token in tokens]

    @classmethod
    def kept(cls, deltas: Deltas, start: int, end: int) -> Pack:
        """A pack of the in-process log's pack's ``start``-th to ``end``-th tokens (not
        included), from slices of its arrays and text, without making the tokens again."""
        return cls(
            PACKED[deltas.kind],
            deltas.run_id,
            deltas.first_seq + start,
            deltas.block_id,
            deltas.step,
            deltas.times[start:end].tolist(),
            deltas.texts(start, end),
        )

    @property
    def last_seq(self) -> int:
        return self.seq + len(self.ts) - 1


_PACKS = TypeAdapter(Pack)
_KINDS = {name: kind for kind, name in PACKED.items()}


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
        kind(
            run_id=pack.run_id,
            seq=seq + i,
            ts=ts,
            block_id=pack.block_id,
            step=pack.step,
            delta=delta,
        )
        for i, (ts, delta) in enumerate(zip(pack.ts, pack.deltas, strict=True))
    ]


def packed_first_seq(payload: bytes) -> int:
    """The seq of the first token packed as ``payload``."""
    return _read(_PACKS, payload).seq
