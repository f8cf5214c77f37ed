"""Benchmark servers, each in its own process: ``python -m bench.servers KIND PORT ...``.

- ``agentstream PORT DATA_DIR``: the real app with the demo agent and three bench agents:
  ``words`` (the peers' model: "Write N words", paced by ``AGENTSTREAM_OFFLINE_TOKEN_DELAY``,
  default 0, like the offline model), ``clock`` (tokens are the time they were yielded, for
  latency) and ``tools`` (one turn of many tool calls, for many persisted events).
  ``GET /bench/sql`` counts the SQL statements the process has executed, by verb. Served
  by agentstream's server (``serving.DrainingServer``: its connections accepted many at a
  time), stopping at once (no grace period for live runs).
- ``baseline PORT [FRAMES_FILE]``: bare Starlette StreamingResponses, which is what a
  hand-rolled endpoint would do: ``/stream`` yields the given pre-encoded SSE frames,
  ``/paced`` yields delta frames at a pace, ``/replay`` a stored run's events.
- ``pydantic-ai PORT DELAY`` and ``langgraph PORT DELAY``: the peers (``bench.peers``).
"""

from __future__ import annotations

import functools
import json
import os
import resource
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from agentstream.agents import AgentSpec
from agentstream.config import Settings
from agentstream.providers.base import (
    ModelPart,
    ModelRequest,
    TextPart,
    ToolCallArgsPart,
    ToolCallEndPart,
    ToolCallStartPart,
    TurnEndPart,
)
from agentstream.providers.scripted import ScriptedModel
from agentstream.server import create_app
from bench.peers import langgraph_app, pydantic_ai_app, ticks, word_count

CLOCK_PACE = 0.001
"""Seconds between the clock agent's tokens: paced, so each token travels on its own."""
TOOL_CALLS = 497
"""Calls in the tools agent's one turn: with the run's other events, 1,000 persisted."""


class WordsModel:
    """Streams "Write N words" as N tokens on the schedule the peers use (``ticks``); with
    ``clock``, each token is the Unix time in ns at which it was yielded."""

    def __init__(self, name: str, delay: float, *, clock: bool = False) -> None:
        self.name = name
        self.delay = delay
        self.clock = clock

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelPart, None]:
        async for index in ticks(word_count(request.messages[-1].content), self.delay):
            yield TextPart(f" {time.time_ns()}" if self.clock else f" word{index}")
        yield TurnEndPart("end_turn")


def tool_calls(request: ModelRequest) -> Iterator[ModelPart]:
    """First turn: many calculator calls; once their results are in, a short answer."""
    if request.messages[-1].role == "tool":
        yield TextPart("Done.")
        yield TurnEndPart("end_turn")
        return
    for index in range(TOOL_CALLS):
        call_id = f"call_{index}"
        yield ToolCallStartPart(call_id, "calculator")
        yield ToolCallArgsPart(call_id, json.dumps({"expression": f"{index} + 1"}))
        yield ToolCallEndPart(call_id)
    yield TurnEndPart("tool_calls")


def agentstream_app(data_dir: Path) -> Starlette:
    os.environ.setdefault("AGENTSTREAM_OFFLINE_TOKEN_DELAY", "0")
    statements = _counted_statements()
    app = create_app(
        Settings(data_dir=data_dir, demo=True, shutdown_grace_seconds=0),
        models=[
            WordsModel("clock", CLOCK_PACE, clock=True),
            WordsModel("words", float(os.environ["AGENTSTREAM_OFFLINE_TOKEN_DELAY"])),
            ScriptedModel("tools", tool_calls),
        ],
        agents=[
            AgentSpec(id="clock", model="clock"),
            AgentSpec(id="words", model="words"),
            AgentSpec(id="tools", model="tools", tools=["calculator"], max_steps=2),
        ],
    )

    @app.get("/bench/sql", include_in_schema=False)
    async def sql() -> dict[str, int]:
        return dict(statements)

    return app


def _counted_statements() -> Counter[str]:
    """The statements the ``sqlite3`` driver is sent on a cursor from now on (an
    ``executemany`` one), by their first word, on every connection opened: SQLAlchemy's
    (``pysqlite`` and ``aiosqlite``) and the store's own, which sends its INSERTs and some
    reads past SQLAlchemy's events. Not a connection's own ``execute`` (the pragmas)."""
    statements: Counter[str] = Counter()

    class Cursor(sqlite3.Cursor):
        def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
            statements[sql.split(None, 1)[0].upper()] += 1
            return super().execute(sql, parameters)

        def executemany(self, sql: str, parameters: Any, /) -> Cursor:
            statements[sql.split(None, 1)[0].upper()] += 1
            return super().executemany(sql, parameters)

    class Counting(sqlite3.Connection):
        def cursor(self, factory: Any = Cursor) -> Any:
            return super().cursor(factory)

    counting = functools.partial(sqlite3.connect, factory=Counting)
    setattr(sqlite3, "connect", counting)  # noqa: B010 (aiosqlite's, replaced)
    setattr(sqlite3.dbapi2, "connect", counting)  # noqa: B010 (SQLAlchemy's pysqlite's)
    return statements


def baseline_app(frames: list[bytes]) -> Starlette:
    async def stream(_request: Request) -> StreamingResponse:
        async def frames_() -> AsyncIterator[bytes]:
            for frame in frames:
                yield frame

        return StreamingResponse(frames_(), media_type="text/event-stream")

    async def paced(request: Request) -> StreamingResponse:
        """``{"tokens": N, "delay": seconds, "clock": bool}``: delta frames at that pace."""
        asked = await request.json()

        async def frames_() -> AsyncIterator[bytes]:
            async for seq in ticks(asked["tokens"], asked["delay"]):
                token = time.time_ns() if asked.get("clock") else f"word{seq}"
                yield b'id: %d\ndata: {"event":"content_delta","delta":" %s"}\n\n' % (
                    seq,
                    str(token).encode(),
                )
            yield b'data: {"event":"complete"}\n\n'

        return StreamingResponse(frames_(), media_type="text/event-stream")

    async def replay(request: Request) -> StreamingResponse:
        """``?db=PATH&run=ID``: a run's persisted events straight from SQLite, as SSE."""
        with sqlite3.connect(request.query_params["db"]) as db:
            rows = db.execute(
                "SELECT seq, payload FROM run_events WHERE run_id = ? ORDER BY seq",
                (request.query_params["run"],),
            ).fetchall()
        body = "".join(f"id: {seq}\ndata: {payload}\n\n" for seq, payload in rows)
        return StreamingResponse(iter([body.encode()]), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/stream", stream, methods=["POST"]),
            Route("/paced", paced, methods=["POST"]),
            Route("/replay", replay),
        ]
    )


def serve_agentstream(app: Starlette, port: int) -> None:
    """On agentstream's server (``serving.DrainingServer``, which accepts connections many at
    a time), uvicorn's settings otherwise as the others' (warnings only, a backlog of 4,096);
    a revision from before it (scenario 7's ``BEFORE``) under uvicorn alone, as it served."""
    try:
        from agentstream.server.serving import DrainingServer, listen
    except ImportError:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096)
        return
    listener = listen("127.0.0.1", port)
    listener.listen(4096)  # the others' backlog
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    DrainingServer(config).run(sockets=[listener])


def main() -> None:
    kind, port, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # thousands of streams
    app: Starlette
    if kind == "agentstream":
        serve_agentstream(agentstream_app(Path(rest[0])), port)
        return
    if kind == "baseline":
        raw = Path(rest[0]).read_bytes() if rest else b""
        app = baseline_app([frame + b"\n\n" for frame in raw.split(b"\n\n") if frame])
    elif kind == "pydantic-ai":
        app = pydantic_ai_app(float(rest[0]))
    elif kind == "langgraph":
        app = langgraph_app(float(rest[0]))
    else:
        raise SystemExit(f"unknown server kind {kind!r}")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096)


if __name__ == "__main__":
    main()
