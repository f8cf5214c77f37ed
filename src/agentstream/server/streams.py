"""Runs over SSE, the same way on every surface: the stream of a run just started, following
or replaying a run from where a client left off (whichever process executes it), and
cancelling one. Routers bring what differs (how to start, which view, where the stored events
are); the supervisor (``runtime.supervisor.Supervisor``) knows where runs are.

A stream started by a POST belongs to its client: when the client leaves (or presses Stop),
the run is cancelled with ``CLIENT_CANCELLED``. It is exactly ``data: <json>`` frames (and
keepalive comments): the reference chat client, and the common parser that splits on blank
lines and keeps the parts starting with ``data: ``, drop any frame that begins with another
field. Where a client resumes from travels inside the frames instead (``seq`` on native
frames, ``eventId`` on canvas ones). A GET follow only watches (leaving unsubscribes) and
also sends ``id: <seq>`` lines, which an EventSource sends back as ``Last-Event-ID`` when it
reconnects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from json.encoder import encode_basestring_ascii
from typing import Annotated, Any

from fastapi import Depends, Header, Query
from starlette.responses import Response

from agentstream.events import Event, TextDelta
from agentstream.runlog import Subscription
from agentstream.runtime.supervisor import Supervisor
from agentstream.server.streaming import EventStreamResponse
from agentstream.views.frames import Frame, JSONText, to_json
from agentstream.views.native import frame

__all__ = [
    "CLIENT_CANCELLED",
    "DONE",
    "STOP_WAIT",
    "Render",
    "ResumeAfter",
    "encode_events",
    "follow",
    "native",
    "native_replay",
    "stream_started",
]


Render = Callable[[Event], Iterable[Frame]]
"""A view: the frames one event becomes on a surface (often none or one)."""


def _token_json(event: TextDelta) -> JSONText:
    """A text token's native frame (``frame(event, live=True)``) as ``to_json`` writes it,
    byte for byte (the same string escaping, no spaces), in a seventh of the time: tokens
    are most of the frames a stream sends."""
    delta = encode_basestring_ascii(event.separator + event.delta)
    return JSONText(f'{{"seq":{event.seq},"event":"content_delta","delta":{delta}}}')


def _token_sse(event: TextDelta) -> bytes:
    """The same frame as SSE text, for a stream with no ``id:`` lines
    (``encode_events((event,), native)``): in one call, where ``encode_events``, ``native``
    and ``_token_json`` made it in three. Its own f-string, not ``_token_json``'s in another
    (a call more) nor a template both fill (``str.format``, twice an f-string's time); a
    property test holds the two to the encoder's bytes."""
    delta = encode_basestring_ascii(event.separator + event.delta)
    return f'data: {{"seq":{event.seq},"event":"content_delta","delta":{delta}}}\n\n'.encode()


BURST = 0.001
"""Seconds: an event that comes sooner than this after the one before is not written
through but goes out from the response's task, with what comes meanwhile, in one send. A
run's tokens come one at a time (a paced model) or in bursts (a provider's read holding
several, an unpaced model): written through one by one, a burst cost a write to the socket
each, and one unpaced stream ran at 0.6x its events a second."""

DONE = b"data: [DONE]\n\n"
"""The last frame of an OpenAI or AI SDK stream (the public chat's is a JSON string)."""

CLIENT_CANCELLED = "Client cancelled request"
"""Why a run ended when the client of its POST stream left."""

STOP_WAIT = 10.0
"""How long a cancel request waits for the run to record its ending."""


def stream_started(
    runs: Supervisor,
    run_id: str,
    render: Render,
    *,
    keepalive: float,
    trailer: bytes = b"",
    headers: Mapping[str, str] | None = None,
    on_end: Callable[[], object] | None = None,
) -> EventStreamResponse:
    """The stream of a run just started, from its first event: ``data:`` lines only, then
    ``trailer``. Disconnecting cancels the run. ``on_end`` as in ``EventStreamResponse``."""
    subscription = runs.log.subscribe(run_id)  # just started here: its log is open
    return EventStreamResponse(
        _LiveFrames(subscription, render, trailer=trailer),  # closed when the response ends
        keepalive=keepalive,
        on_disconnect=lambda: runs.cancel(run_id, CLIENT_CANCELLED),
        on_end=on_end,
        headers=headers,
    )


async def _resume_after(
    after: Annotated[int | None, Query(ge=0)] = None,
    last_event_id: Annotated[int | None, Header(ge=0)] = None,
) -> int:
    """The later of ``?after=`` and ``Last-Event-ID``: an EventSource reconnects to the same
    URL with the header."""
    return max(after or 0, last_event_id or 0)


ResumeAfter = Annotated[int, Depends(_resume_after)]
"""A follow endpoint's parameter: the seq the client has seen up to."""


async def follow(
    runs: Supervisor,
    run_id: str,
    persisted: Callable[[], Awaitable[Sequence[Event]]],
    render: Render,
    *,
    after: int,
    keepalive: float,
    replay: Render | None = None,
    history: Render | None = None,
    whole_run: bool = False,
    ends: Callable[[Event], bool] | None = None,
    trailer: bytes = b"",
    headers: Mapping[str, str] | None = None,
) -> Response:
    """The stream of a run from the first event with ``seq > after``, each frame with
    ``id: <seq>``: the persisted events the live log does not hold, then the log's, live.
    ``persisted`` reads the stored events in order, raising if there is no such run.
    ``render`` shows the log's events, ``replay`` (default: ``render``) the stored ones;
    ``history``, if given, instead of either the events that happened before the viewer
    connected (live-only frames left out). Disconnecting only unsubscribes. ``204 No
    Content`` when there is nothing more, which tells an EventSource to stop reconnecting.

    ``whole_run``: the views keep state from event to event (the canvas and chat views), so
    they are fed the run from its first event and only the frames of the events after
    ``after`` go out: the frames a client that followed from the start got from there.
    ``ends``: the stream is one answer, over after the first event past ``after`` that
    ``ends`` holds for; then ``trailer``. A stream cut before it (a viewer that lost the
    shared log) has no trailer: its client resumes.
    """
    replay = replay or render
    start = 0 if whole_run else after
    live = await runs.subscribe(run_id, after=start)
    if history is not None:
        head = live.head if live is not None else None  # None: all of it has happened
        render, replay = _from_now(head, render, history), _from_now(head, replay, history)
    if whole_run:
        render, replay = _shown_after(after, render), _shown_after(after, replay)
    ending = None if ends is None else lambda event: event.seq > after and ends(event)
    parts: list[tuple[Sequence[Event], Render]] = []
    try:
        if live is None or start < live.starts_after:  # stored events before the log's part
            until = live.starts_after if live is not None else None
            stored = await persisted()
            parts.append(
                ([e for e in stored if start < e.seq and (until is None or e.seq <= until)], replay)
            )
        if live is not None and live.ended:
            # The log's part is over: read the rest of it, then whatever the store has after
            # it (a paused run may have been cancelled since).
            tail = await live.next_batch()
            parts.append((tail, render))
            read_up_to = tail[-1].seq if tail else max(start, live.starts_after)
            live.close()
            live = None
            parts.append(([e for e in await persisted() if e.seq > read_up_to], replay))
    except BaseException:
        if live is not None:
            live.close()
        raise
    pending = b""
    for events, shown in parts:
        events, over = _through_end(events, ending)
        pending += encode_events(events, shown, ids=True)
        if over:
            pending += trailer
            if live is not None:
                live.close()
                live = None
            break
    if not pending and live is None:
        return Response(status_code=204)
    if live is None and ending is None:  # all there is, read at once: the stream ends here
        pending += trailer
    following = (
        _LiveFrames(live, render, ids=True, ends=ending, trailer=trailer)
        if live is not None
        else None
    )
    return EventStreamResponse(
        following,
        first=pending,
        keepalive=keepalive,
        headers=headers,
    )


def _from_now(head: int | None, render: Render, history: Render) -> Render:
    """``render`` for the events after ``head`` (the log's last when the viewer connected),
    ``history`` for the others."""

    def shown(event: Event) -> Iterable[Frame]:
        return render(event) if head is not None and event.seq > head else history(event)

    return shown


def _shown_after(after: int, render: Render) -> Render:
    """``render`` fed every event, its frames shown for the events after ``after`` only."""

    def shown(event: Event) -> Iterable[Frame]:
        frames = tuple(render(event))
        return frames if event.seq > after else ()

    return shown


def _through_end(
    events: Sequence[Event], ends: Callable[[Event], bool] | None
) -> tuple[Sequence[Event], bool]:
    """The events up to and with the first that ends the stream, and whether one did."""
    if ends is not None:
        for i, event in enumerate(events):
            if ends(event):
                return events[: i + 1], True
    return events, False


class _LiveFrames:
    """A subscription's events as SSE text (``ids`` as in ``encode_events``), for an
    ``EventStreamResponse``: ``trailer`` after the run's last event, not where the
    subscription stopped short of it (a viewer that lost the shared log: its client
    resumes). With ``ends``, the stream is over after the first event it holds for, and
    only then is there a trailer. Written through (``write_through``), an event's frames go
    out as it is appended, while the response waits; not an event in a burst (``BURST``),
    nor one that may end the stream."""

    __slots__ = (
        "_ends",
        "_failed",
        "_ids",
        "_last",
        "_native_tokens",
        "_render",
        "_subscription",
        "_trailer",
        "_unsent",
        "_write",
        "next_batch",
        "over",
    )

    def __init__(
        self,
        subscription: Subscription,
        render: Render,
        *,
        trailer: bytes = b"",
        ids: bool = False,
        ends: Callable[[Event], bool] | None = None,
    ) -> None:
        self.next_batch: Callable[[], Awaitable[list[Event]]] = subscription.next_batch
        self.over = False
        self._subscription = subscription
        self._render = render
        self._trailer = trailer
        self._ids = ids
        self._native_tokens = render is native and not ids
        """Text tokens go out as ``_token_sse`` writes them."""
        self._ends = ends
        self._write: Callable[[bytes], bool] = _not_through
        self._last = 0.0
        """The time (``ts``) of the last event offered or read."""
        self._unsent = 0
        """The seq of the event written through whose send the response's task is to
        finish: left out of the batch it wakes to."""
        self._failed: Exception | None = None
        """What rendering an event raised in the run's task: raised in the response's."""

    def write_through(self, write: Callable[[bytes], bool]) -> None:
        """As ``Frames.write_through``: the events are offered to ``_take`` as they come."""
        self._write = write
        self.next_batch = partial(self._subscription.next_batch, self._take)

    def _take(self, event: Event) -> bool:
        """The subscription's ``Take``: the event's frames written at once, unless it comes
        in a burst (``BURST``) or may end the stream. An event whose frames did not go out
        whole (the client is slow, or the send failed) is not taken: the response's task
        wakes, finishes that send and leaves the event out of what it writes next."""
        try:
            burst, self._last = event.ts - self._last < BURST, event.ts
            if burst or (self._ends is not None and self._ends(event)):
                return False
            if type(event) is TextDelta and self._native_tokens:
                chunk = _token_sse(event)
            else:
                chunk = encode_events((event,), self._render, ids=self._ids)
            if chunk and not self._write(chunk):
                self._unsent = event.seq
                return False
            return True
        except Exception as error:  # the view's: raised where the response can end on it
            self._failed = error
            return False

    def encode(self, batch: list[Event]) -> bytes:
        if self._failed is not None:
            raise self._failed
        if batch:
            self._last = batch[-1].ts
            if batch[0].seq == self._unsent:  # its frames are on their way already
                batch = batch[1:]
                if not batch:
                    return b""
        else:  # all there is was read
            self.close()
            ended = self._ends is None and self._subscription.ended
            return self._trailer if ended else b""
        if self._ends is None:
            return encode_events(batch, self._render, ids=self._ids)
        events, over = _through_end(batch, self._ends)
        chunk = encode_events(events, self._render, ids=self._ids)
        if over:
            self.close()
            chunk += self._trailer
        return chunk

    def close(self) -> None:
        self.over = True
        self._subscription.close()
        # What holds this object and its response in cycles, which a stream, long in the
        # oldest generation, would keep until a full pass of the collector.
        self.next_batch, self._write = self._subscription.next_batch, _not_through


def _not_through(_chunk: bytes) -> bool:
    """``_LiveFrames._write`` where frames are not written through: never called (``_take``
    is offered events only once they are)."""
    raise RuntimeError("frames are not written through")


def native(event: Event) -> Iterable[Frame]:
    """The native frames of an event read from the live log."""
    if type(event) is TextDelta:
        return (_token_json(event),)
    shown = frame(event, live=True)
    return () if shown is None else (shown,)


def native_replay(event: Event) -> Iterable[dict[str, Any]]:
    """The native frames of an event read from the store, where no deltas are."""
    shown = frame(event)
    return () if shown is None else (shown,)


def encode_events(events: Iterable[Event], render: Render, *, ids: bool = False) -> bytes:
    """The SSE text of the frames the events become: one ``data:`` line each, after an
    ``id: <seq>`` line when ``ids`` (for EventSource, on GET streams only). A loop, not a
    comprehension of two ``for``s: a token's frame in 0.91 µs, not 1.10 (``timeit``).
    Written here, not by ``sse.encode``: JSON text is one line (it escapes line breaks),
    so there is nothing to split, and a call fewer a frame."""
    frames: list[str] = []
    for event in events:
        for data in render(event):
            text = data if type(data) is JSONText else to_json(data)
            line = "data: " + text + "\n\n"  # an f-string formats a JSONText by __format__
            frames.append(f"id: {event.seq}\n" + line if ids else line)
    return "".join(frames).encode()
