"""Server-Sent Events framing: encode frames for streaming responses and decode them
incrementally on the client side, following WHATWG HTML §9.2 (Server-sent events).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["SSEDecoder", "ServerSentEvent", "comment", "encode"]

# §9.2.5: end-of-line = ( cr lf / cr / lf ). Only these three; NOT str.splitlines(),
# which would also split on \x0b, \x0c, \x1c-\x1e, \x85, \u2028, \u2029.
_EOL = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSentEvent:
    """One dispatched event."""

    event: str = "message"
    data: str = ""
    # The last event ID in force when dispatched (spec: "last event ID buffer"); None
    # until the stream has sent an `id` field. "" means the stream reset it (`id:`).
    id: str | None = None
    # A valid `retry` field seen since the previous dispatched event, if any.
    retry: int | None = None

    def json(self) -> Any:
        """Parse `data` as JSON."""
        return json.loads(self.data)


def _strip_newlines(value: str) -> str:
    return value.replace("\r", "").replace("\n", "")


def encode(
    data: str,
    *,
    id: str | int | None = None,
    event: str | None = None,
    retry: int | None = None,
) -> str:
    """One frame as text: 'id:'/'event:'/'retry:' lines (newlines stripped from id and
    event), data split on \\r\\n|\\r|\\n into several 'data:' lines, then a blank line.
    Field order: id, event, retry, data. Uses 'field: value' with one space, so values
    with leading spaces survive §9.2.6's removal of one leading space.

    NUL is also stripped from id, since §9.2.6 makes a decoder ignore such an id.
    """
    if event is None and retry is None and "\n" not in data and "\r" not in data:
        # A frame of one line, as JSON text is.
        if id is None:
            return f"data: {data}\n\n"
        if isinstance(id, int):
            return f"id: {id}\ndata: {data}\n\n"
    lines: list[str] = []
    if isinstance(id, int):  # nothing to strip
        lines.append(f"id: {id}")
    elif id is not None:
        lines.append(f"id: {_strip_newlines(id).replace(chr(0), '')}")
    if event is not None:
        lines.append(f"event: {_strip_newlines(event)}")
    if retry is not None:
        if retry < 0:
            raise ValueError(f"retry must be a non-negative integer, got {retry}")
        lines.append(f"retry: {int(retry)}")
    lines.extend(f"data: {line}" for line in _EOL.split(data))
    return "\n".join(lines) + "\n\n"


def comment(text: str = "") -> str:
    """A comment frame, e.g. ': keepalive\\n\\n' (text split on newlines, each line
    prefixed ': '). Decoders ignore it (§9.2.6); useful as a keepalive."""
    return "".join(f": {line}\n" for line in _EOL.split(text)) + "\n"


class SSEDecoder:
    """Pure incremental decoder: feed bytes in arbitrary pieces, get the dispatched events.

    Implements §9.2.5 (parsing: UTF-8 decode, BOM, line splitting) and §9.2.6
    (interpreting: fields and dispatch). Incomplete trailing data at end of stream is
    never dispatched, as the spec requires.
    """

    __slots__ = (
        "_data",
        "_event",
        "_last_id",
        "_partial",
        "_pending_cr",
        "_retry",
        "_utf8",
    )

    def __init__(self) -> None:
        # §9.2.5: the stream is decoded with "UTF-8 decode" (errors -> U+FFFD); one
        # leading BOM is ignored. "utf-8-sig" strips exactly one leading BOM, even when
        # its bytes are split across feeds.
        self._utf8 = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
        self._partial: list[str] = []  # pieces of the current, unterminated line
        self._pending_cr = False  # previous chunk ended with CR: skip one leading LF
        self._data: list[str] = []  # data buffer, as lines (joined with "\n" on dispatch)
        self._event = ""  # event type buffer
        self._last_id: str | None = None  # last event ID buffer
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode the next piece of the byte stream; return the events it completed."""
        text = self._utf8.decode(chunk)
        if not text:
            return []
        if self._pending_cr:
            # A CR ending the previous chunk already terminated its line; a LF here is
            # the second half of that CRLF, not an empty line.
            self._pending_cr = False
            if text[0] == "\n":
                text = text[1:]
                if not text:
                    return []
        if "\n" not in text and "\r" not in text:
            self._partial.append(text)  # no terminator yet: avoid re-joining long lines
            return []
        if self._partial:
            self._partial.append(text)
            text = "".join(self._partial)
            self._partial.clear()
        lines = _EOL.split(text)
        rest = lines.pop()
        if rest:
            self._partial.append(rest)
        self._pending_cr = text[-1] == "\r"
        events: list[ServerSentEvent] = []
        for line in lines:
            ev = self.decode_line(line)
            if ev is not None:
                events.append(ev)
        return events

    def decode_line(self, line: str) -> ServerSentEvent | None:
        """Process one line (without its terminator) per §9.2.6.

        Returns an event when the line is blank and dispatches one, else None.
        """
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None  # comment
        field, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:  # an id containing NUL is ignored
            self._last_id = value
        elif field == "retry" and value.isascii() and value.isdigit():
            # Only ASCII digits, else ignored (so is a value too long for int()).
            with contextlib.suppress(ValueError):
                self._retry = int(value.lstrip("0") or "0")
        # Any other field name (or a rejected id/retry) is ignored.
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        # §9.2.6 "dispatch the event": an empty data buffer resets the buffers and
        # dispatches nothing; otherwise the trailing LF is dropped (implicit in the join).
        if not self._data:
            self._event = ""
            return None
        ev = ServerSentEvent(
            event=self._event or "message",
            data="\n".join(self._data),
            id=self._last_id,
            retry=self._retry,
        )
        self._data = []
        self._event = ""
        self._retry = None
        return ev
