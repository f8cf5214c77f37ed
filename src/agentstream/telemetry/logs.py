"""Log lines that say which request and which run they are about.

What a line is about travels in context variables: the request id (set by the server's
``RequestIdMiddleware``) and the run, session and agent (set in the task of each run), so
a line logged anywhere below carries them. ``ContextFilter`` copies them onto each record;
``JsonFormatter`` writes a record as one JSON object per line, for log collectors, and
``TextFormatter`` as uvicorn's readable line, the ids appended, for a terminal.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Any, Literal, TextIO

from uvicorn.logging import DefaultFormatter

__all__ = [
    "CONTEXT_FIELDS",
    "AboutRun",
    "ContextFilter",
    "JsonFormatter",
    "LogFormat",
    "TextFormatter",
    "formatter",
    "request_id",
    "uses_json",
]

LogFormat = Literal["auto", "json", "text"]

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
"""The HTTP request being served (``X-Request-Id``)."""
_run: ContextVar[tuple[str, str | None, str | None] | None] = ContextVar("run", default=None)
"""The run being executed: its id, session and agent (or workflow)."""

CONTEXT_FIELDS = ("request_id", "run_id", "session_id", "agent")
"""What ``ContextFilter`` sets on every record (None where unknown)."""

_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's message again, with terminal colours
    *CONTEXT_FIELDS,
}
"""A record's own attributes: any other came with ``extra=`` and goes in the JSON line."""


class AboutRun:
    """The block in which lines logged (and in the tasks it starts) are about this run. A
    class, not a generator: the block lasts as long as the run."""

    __slots__ = ("_fields", "_token")

    def __init__(self, run_id: str, session_id: str | None, agent: str | None) -> None:
        self._fields = (run_id, session_id, agent)

    def __enter__(self) -> None:
        self._token = _run.set(self._fields)

    def __exit__(self, *exc_info: object) -> None:
        _run.reset(self._token)


class ContextFilter(logging.Filter):
    """Sets the request id, run id, session id and agent of the current context on each
    record (a handler's filter: it sees the lines of every logger the handler serves)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        run = _run.get()
        record.run_id, record.session_id, record.agent = run or (None, None, None)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the ids that are known, what was passed with ``extra=``, and
    ``exception`` with its traceback if there is one. uvicorn's access lines get
    ``client``, ``method``, ``path`` and ``status`` besides."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            if (value := getattr(record, name, None)) is not None:
                line[name] = value
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            client, method, path, _, status = args
            line.update(client=client, method=method, path=path, status=status)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(DefaultFormatter):
    """uvicorn's line (``INFO:     message``), then the ids that are known in brackets."""

    def __init__(self) -> None:
        super().__init__("%(levelprefix)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = " ".join(
            f"{name}={value}"
            for name in CONTEXT_FIELDS
            if (value := getattr(record, name, None)) is not None
        )
        return f"{text} [{ids}]" if ids else text


def uses_json(log_format: LogFormat, stream: TextIO | None = None) -> bool:
    """JSON lines unless asked for text, or, by default, when writing to a terminal."""
    if log_format != "auto":
        return log_format == "json"
    stream = stream or sys.stderr
    return not (hasattr(stream, "isatty") and stream.isatty())


def formatter(log_format: LogFormat, stream: TextIO | None = None) -> logging.Formatter:
    return JsonFormatter() if uses_json(log_format, stream) else TextFormatter()
