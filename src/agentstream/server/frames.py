"""Subscription to SSE bytes for the native surface: view each event, encode, batch."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable

from agentstream import sse
from agentstream.events import BaseEvent
from agentstream.runlog import Subscription
from agentstream.views.native import frame

__all__ = ["encode_native", "native_chunks"]


def encode_native(events: Iterable[BaseEvent]) -> bytes:
    """The SSE text of the events this surface shows, one ``id: <seq>`` frame each."""
    out = []
    for event in events:
        data = frame(event)
        if data is not None:
            out.append(sse.encode(json.dumps(data, separators=(",", ":")), id=event.seq))
    return "".join(out).encode()


def native_chunks(subscription: Subscription) -> Callable[[], Awaitable[bytes | None]]:
    """A ``next_chunk`` for ``EventStreamResponse``: None when the run is over."""

    async def next_chunk() -> bytes | None:
        while batch := await subscription.next_batch():
            if chunk := encode_native(batch):
                return chunk
        subscription.close()
        return None

    return next_chunk
