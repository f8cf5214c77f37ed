"""Shared fixtures: a real uvicorn server on an ephemeral port over a real SQLite file."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import pytest
import uvicorn
from sqlalchemy import make_url

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
from agentstream.server import create_app
from agentstream.sse import ServerSentEvent, SSEDecoder


@dataclass
class LiveServer:
    url: str
    key: str
    settings: Settings

    @property
    def headers(self) -> dict[str, str]:
        return {"apikey": self.key}

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=10, **kwargs)


@contextmanager
def serve(settings: Settings, **app_kwargs: Any) -> Iterator[LiveServer]:
    """Run the app under uvicorn in a thread until the block ends."""
    app = create_app(settings, **app_kwargs)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("The server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    key = settings.demo_key_file.read_text().strip()
    try:
        yield LiveServer(url=f"http://127.0.0.1:{port}", key=key, settings=settings)
    finally:
        server.should_exit = True
        thread.join(10)


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Demo mode (demo agent and key) with an unpaced offline model, all under ``data_dir``."""
    return Settings(
        **{
            "data_dir": data_dir,
            "demo": True,
            "offline_token_delay": 0.0,
            "keepalive_seconds": 30.0,
            **overrides,
        }
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with serve(make_settings(tmp_path)) as live:
        yield live


async def wait(seconds: float = 30.0) -> str:
    """Wait, then say so."""
    await anyio.sleep(seconds)
    return "waited"


def call_wait_then_answer(request: ModelRequest) -> list[ModelPart]:
    """First turn calls the slow tool; after its result, answer."""
    if request.messages[-1].role == "tool":
        return [TextPart("done"), TurnEndPart("end_turn")]
    return [
        TextPart("Waiting."),
        ToolCallStartPart("call_1", "wait"),
        ToolCallArgsPart("call_1", "{}"),
        ToolCallEndPart("call_1"),
        TurnEndPart("tool_calls"),
    ]


def read_events(response: httpx.Response) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for chunk in response.iter_bytes():
        events += decoder.feed(chunk)
    return events


def stream_frames(
    live: LiveServer, agent: str, body: dict[str, Any]
) -> tuple[list[int], list[dict[str, Any]]]:
    """POST a run and read its whole stream: the ``id`` of each frame and its JSON."""
    with (
        live.client() as client,
        client.stream("POST", f"/api/agents/{agent}/run/stream", json=body) as response,
    ):
        assert response.status_code == 200, response.read()
        events = read_events(response)
    return [int(e.id or 0) for e in events], [e.json() for e in events]


POSTGRES_ADMIN_URL = os.environ.get(
    "AGENTSTREAM_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped afterwards.

    Skipped when no server answers, except in CI, where a missing database is a failure.
    """
    name = f"agentstream_test_{uuid.uuid4().hex[:12]}"
    try:
        postgres_admin(f'CREATE DATABASE "{name}"')
    except OSError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}: {exc}")
    url = make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql+asyncpg", database=name)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        postgres_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_admin(statement: str) -> None:
    async def execute() -> None:
        connection = await asyncpg.connect(POSTGRES_ADMIN_URL)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    anyio.run(execute)
