"""From a run subscription to SSE bytes: render each event with a view, encode, batch."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from agentstream import sse
from agentstream.events import BaseEvent
from agentstream.runlog import LogSubscription, Sequenced
from agentstream.views.native import frame

__all__ = ["Render", "encode_events", "event_chunks", "native"]

Render = Callable[[BaseEvent], Iterable[dict[str, Any]]]
"""A view: the frames one event becomes on a surface (often none or one)."""

E = TypeVar("E", bound=Sequenced)

_to_json = json.JSONEncoder(separators=(",", ":")).encode
"""One encoder for every frame: ``json.dumps`` with options builds a new one per call."""


def native(event: BaseEvent) -> Iterable[dict[str, Any]]:
    shown = frame(event)
    return () if shown is None else (shown,)


def encode_events(events: Iterable[E], render: Callable[[E], Iterable[dict[str, Any]]]) -> bytes:
    """The SSE text of the frames the events become, each with ``id: <seq>``."""
    return "".join(
        sse.encode(_to_json(data), id=event.seq) for event in events for data in render(event)
    ).encode()


def event_chunks(
    subscription: LogSubscription[E],
    render: Callable[[E], Iterable[dict[str, Any]]],
    *,
    trailer: bytes = b"",
) -> Callable[[], Awaitable[bytes | None]]:
    """A ``next_chunk`` for ``EventStreamResponse``; ``trailer`` goes out after the run's
    last event, then None ends the response."""
    pending_trailer = trailer

    async def next_chunk() -> bytes | None:
        nonlocal pending_trailer
        while batch := await subscription.next_batch():
            if chunk := encode_events(batch, render):
                return chunk
        subscription.close()
        chunk, pending_trailer = pending_trailer, b""
        return chunk or None

    return next_chunk
