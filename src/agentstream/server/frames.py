"""From a run subscription to SSE bytes: render each event with a view, encode, batch; and
the resumable stream that follows a run live or replays what it persisted.

A stream started by a POST is exactly ``data: <json>`` frames (and keepalive comments): the
reference chat client, and the common parser that splits on blank lines and keeps the parts
starting with ``data: ``, drop any frame that begins with another field. Where a client
resumes from travels inside the frames instead (``seq`` on native frames, ``eventId`` on
canvas ones). The GET follow/resume streams also send ``id: <seq>`` lines, which an
EventSource sends back as ``Last-Event-ID`` when it reconnects.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from starlette.responses import Response

from agentstream import sse
from agentstream.events import Event
from agentstream.runlog import LogSubscription
from agentstream.server.streaming import EventStreamResponse
from agentstream.views.native import frame

__all__ = [
    "Render",
    "encode_events",
    "event_chunks",
    "follow_or_replay",
    "native",
    "native_replay",
]

Render = Callable[[Event], Iterable[dict[str, Any]]]
"""A view: the frames one event becomes on a surface (often none or one)."""

_to_json = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""One encoder for every frame: ``json.dumps`` with options builds a new one per call.
Never a bare ``NaN`` or ``Infinity``, which is not JSON (``JSON.parse`` fails on it)."""


def native(event: Event) -> Iterable[dict[str, Any]]:
    """The native frames of an event read from the live log."""
    shown = frame(event, live=True)
    return () if shown is None else (shown,)


def native_replay(event: Event) -> Iterable[dict[str, Any]]:
    """The native frames of an event read from the store, where no deltas are."""
    shown = frame(event)
    return () if shown is None else (shown,)


def encode_events(events: Iterable[Event], render: Render, *, ids: bool = False) -> bytes:
    """The SSE text of the frames the events become: one ``data:`` line each, after an
    ``id: <seq>`` line when ``ids`` (for EventSource, on GET streams only)."""
    return "".join(
        sse.encode(_to_json(data), id=event.seq if ids else None)
        for event in events
        for data in render(event)
    ).encode()


def event_chunks(
    subscription: LogSubscription,
    render: Render,
    *,
    trailer: bytes = b"",
    ids: bool = False,
) -> Callable[[], Awaitable[bytes | None]]:
    """A ``next_chunk`` for ``EventStreamResponse``; ``trailer`` goes out after the run's
    last event, then None ends the response. ``ids`` as in ``encode_events``."""
    pending_trailer = trailer

    async def next_chunk() -> bytes | None:
        nonlocal pending_trailer
        while batch := await subscription.next_batch():
            if chunk := encode_events(batch, render, ids=ids):
                return chunk
        subscription.close()
        chunk, pending_trailer = pending_trailer, b""
        return chunk or None

    return next_chunk


async def follow_or_replay(
    live: LogSubscription | None,
    persisted: Callable[[], Awaitable[Sequence[Event]]],
    render: Render,
    *,
    after: int,
    keepalive: float,
    replay: Render | None = None,
) -> Response:
    """The stream of a run (or execution) from the first event with ``seq > after``, each
    frame with ``id: <seq>``: the persisted events the live log does not hold, then the
    log's, live. ``live`` is a subscription from ``after`` (None: not in this server's log);
    ``persisted`` reads the stored events in order, raising if there is no such run.
    ``render`` shows the log's events, ``replay`` (default: ``render``) the stored ones.
    Disconnecting only unsubscribes. ``204 No Content`` when there is nothing more, which
    tells an EventSource to stop reconnecting."""
    replay = replay or render
    try:
        before: list[Event] = []
        """Stored events before the live log's part."""
        tail: list[Event] = []
        """The rest of the live log's part, once it has ended."""
        after_tail: list[Event] = []
        """Stored events after the live log's part, once it has ended."""
        if live is None or after < live.starts_after:
            until = live.starts_after if live is not None else None
            before = [
                e for e in await persisted() if after < e.seq and (until is None or e.seq <= until)
            ]
        if live is not None and live.ended:
            # The log's part is over: read the rest of it, then whatever the store has after
            # it (a paused run may have been cancelled since).
            tail = await live.next_batch()
            read_up_to = tail[-1].seq if tail else max(after, live.starts_after)
            live.close()
            live = None
            after_tail = [e for e in await persisted() if e.seq > read_up_to]
    except BaseException:
        if live is not None:
            live.close()
        raise
    pending = b"".join(
        (
            encode_events(before, replay, ids=True),
            encode_events(tail, render, ids=True),
            encode_events(after_tail, replay, ids=True),
        )
    )
    if not pending and live is None:
        return Response(status_code=204)
    follow = event_chunks(live, render, ids=True) if live is not None else None

    async def next_chunk() -> bytes | None:
        nonlocal pending
        if pending:
            chunk, pending = pending, b""
            return chunk
        return await follow() if follow is not None else None

    return EventStreamResponse(
        next_chunk, keepalive=keepalive, on_disconnect=live.close if live is not None else None
    )
