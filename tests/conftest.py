"""Shared fixtures: a real uvicorn server on an ephemeral port over a real SQLite file."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import asyncpg
import httpx
import pytest
from filelock import FileLock
from hypothesis import settings
from sqlalchemy import Engine, event, make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from agentstream.config import Settings
from agentstream.knowledge.embedding import embeddings_installed
from agentstream.providers.base import (
    ToolSpec,
)
from agentstream.server import create_app
from agentstream.sse import ServerSentEvent, SSEDecoder
from fakes.server import run_app

pytest_plugins = ["cluster_fixtures"]
"""The cluster tests' fixtures, in a module of their own (it needs ``processes``, which
needs this one)."""

settings.register_profile("agentstream", deadline=None)
settings.load_profile("agentstream")
"""Property tests have no deadline: Hypothesis's (200 ms an example by default) is a
wall-clock assert, which a loaded machine fails (the suite beside another one on two
cores did)."""


@dataclass
class LiveServer:
    url: str
    key: str
    settings: Settings

    @property
    def headers(self) -> dict[str, str]:
        return {"apikey": self.key}

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, **{"timeout": 10, **kwargs})


@pytest.fixture(autouse=True)
def _app_logging_restored() -> Iterator[None]:
    """``serve`` invoked in this process (``CliRunner``) sets up the app's logging
    (``serving.log_to_console``) on the stderr of that invocation: the next tests get the
    logging they started with, not lines written into another test's output."""
    app_logger = logging.getLogger("agentstream")
    handlers, level = list(app_logger.handlers), app_logger.level
    yield
    app_logger.handlers[:], app_logger.level = handlers, level


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``embeddings`` need the extra (torch): skipped without it, except in CI,
    which installs it (``make install-embeddings``)."""
    if item.get_closest_marker("embeddings") and not embeddings_installed():
        message = "The embeddings extra is missing: make install-embeddings (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@contextmanager
def serve(settings: Settings, **app_kwargs: Any) -> Iterator[LiveServer]:
    """Run the app under uvicorn in a thread until the block ends."""
    app = create_app(settings, **app_kwargs)
    with run_app(app, name="The server", lifespan="on") as url:
        key = settings.demo_key_file.read_text().strip()
        yield LiveServer(url=url, key=key, settings=settings)


FORWARDED_ONLY = ("content_delta", "reasoning_delta", "preamble")
"""The native frames a run's record never keeps: what a replay from the store lacks."""

STORES = ["sqlite", "postgresql"]
"""The two stores, for fixtures parametrized over them (``serve_on``)."""


@contextmanager
def serve_on(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    """The demo served on the store ``request.param`` names (one of ``STORES``); the
    PostgreSQL one is a database other tests write to as well."""
    overrides = {}
    if request.param == "postgresql":
        overrides["database_url"] = request.getfixturevalue("postgres_url")
    with serve(make_settings(tmp_path, **overrides)) as live:
        yield live


TEST_STORE = os.environ.get("AGENTSTREAM_TEST_STORE", "sqlite")
"""The store of every server the suite starts that does not name one: ``sqlite`` (a file
under the test's folder) or ``postgresql`` (a new database for each; `make
test-postgresql`). The tests parametrized over ``STORES`` run on both either way."""


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Demo mode (demo agent and key) with an unpaced offline model, all under ``data_dir``
    (its database too, unless ``TEST_STORE`` says PostgreSQL)."""
    if TEST_STORE == "postgresql" and "database_url" not in overrides:
        overrides["database_url"] = _postgres_database_of(data_dir)
    return Settings(
        **{
            "data_dir": data_dir,
            "demo": True,
            "offline_token_delay": 0.0,
            "keepalive_seconds": 30.0,
            **overrides,
        }
    )


JS = Path(__file__).parent / "js"
"""The official JavaScript clients the tests drive (``package.json`` and its lock file)."""


@pytest.fixture(scope="session")
def node() -> str:
    """Node.js, with the packages of ``tests/js`` installed from the npm registry by the
    lock file (``npm ci``, once, again when the lock file changes)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        message = "Node.js 20+ and npm are needed to test with the official JavaScript clients"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    installed = JS / "node_modules" / ".package-lock.json"
    lock = JS / "package-lock.json"
    with FileLock(JS / "node_modules.lock"):  # one npm ci, whichever test worker comes first
        if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
            subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=JS,
                check=True,
                timeout=300,
            )
    return node


def run_node(node: str, script: str, args: dict[str, Any]) -> Any:
    """Run ``tests/js/<script>`` with ``args`` (JSON) and read what it prints (JSON)."""
    done = subprocess.run(
        [node, str(JS / script), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with serve(make_settings(tmp_path)) as live:
        yield live


async def eventually(check: Callable[[], Awaitable[object]]) -> None:
    """Poll an async ``check`` until it holds (for state in a database or Redis, which
    cannot be awaited); fail after 10 seconds."""
    with anyio.fail_after(10):
        while not await check():  # noqa: ASYNC110 (polling another process's state)
            await anyio.sleep(0.05)


def wait_until(condition: Callable[[], object], timeout: float = 10) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def wait_until_up(url: str) -> None:
    """Wait for a server started in another process to answer."""

    def up() -> bool:
        try:
            httpx.get(f"{url}/healthz")
        except httpx.TransportError:
            return False
        return True

    wait_until(up, timeout=20)


def wait_for_status(live: LiveServer, run_id: str, timeout: float = 15) -> dict[str, Any]:
    """Poll the run until it has left ``running``; fail after ``timeout`` seconds (a crashed
    process's runs end once its lease has run out)."""
    deadline = time.monotonic() + timeout
    with live.client() as client:
        while time.monotonic() < deadline:
            run: dict[str, Any] = client.get(f"/api/agents/runs/{run_id}").json()
            if run["status"] != "running":
                return run
            time.sleep(0.025)
    raise AssertionError(f"run {run_id} still running")


def latest_run_id(live: LiveServer, agent_id: str | None = None) -> str:
    """The newest agent run in the server's database, of ``agent_id`` if given."""
    where, params = ("and agent_id = :agent", {"agent": agent_id}) if agent_id else ("", {})
    found = rows(
        live,
        f"select id from runs where kind = 'agent' {where} order by created_at desc limit 1",
        **params,
    )
    assert found, f"no run of {agent_id or 'any agent'}"
    return str(found[0][0])


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


CALCULATOR = ToolSpec(
    name="calculator",
    description="Evaluate an arithmetic expression.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
)
"""The calculator as the provider tests declare it to a model."""


def read_events(response: httpx.Response) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for chunk in response.iter_bytes():
        events += decoder.feed(chunk)
    return events


def run_events(live: LiveServer, agent: str, body: dict[str, Any]) -> list[ServerSentEvent]:
    """POST a run and read its whole stream, event by event (``data:`` lines only)."""
    with (
        live.client() as client,
        client.stream("POST", f"/api/agents/{agent}/run/stream", json=body) as response,
    ):
        assert response.status_code == 200, response.read()
        events = read_events(response)
    assert all(e.id is None for e in events), "a POST stream has no id: lines"
    return events


def stream_frames(
    live: LiveServer, agent: str, body: dict[str, Any]
) -> tuple[list[int], list[dict[str, Any]]]:
    """POST a run and read its whole stream: the ``seq`` of each frame, and its JSON less
    the seq (so whole streams compare without it)."""
    frames = [e.json() for e in run_events(live, agent, body)]
    return [frame.pop("seq") for frame in frames], frames


POSTGRES_ADMIN_URL = os.environ.get(
    "AGENTSTREAM_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped afterwards."""
    with new_postgres_database() as url:
        yield url


@contextmanager
def new_postgres_database() -> Iterator[str]:
    """A new PostgreSQL database (its URL), dropped when the block ends.

    Skipped when no server answers, except in CI, where a missing database is a failure.
    """
    name, url = _create_postgres_database()
    try:
        yield url
    finally:
        _drop_postgres_database(name)


_DATABASES_OF_DATA_DIRS: dict[Path, tuple[str, str]] = {}
"""Made by ``make_settings`` under ``TEST_STORE=postgresql``, dropped when the session ends."""


def _postgres_database_of(data_dir: Path) -> str:
    """The database of a data directory, as its SQLite file would be: a server started
    again on the same directory finds its data."""
    if data_dir not in _DATABASES_OF_DATA_DIRS:
        _DATABASES_OF_DATA_DIRS[data_dir] = _create_postgres_database()
    return _DATABASES_OF_DATA_DIRS[data_dir][1]


def store_environment(settings: Settings) -> dict[str, str]:
    """What an ``agentstream`` process started by a test needs, beside ``--data-dir``, to
    use the store of ``settings``."""
    return {"AGENTSTREAM_DATABASE_URL": settings.database_url} if settings.database_url else {}


@pytest.fixture(scope="session", autouse=True)
def _session_databases_dropped() -> Iterator[None]:
    yield
    for name, _ in _DATABASES_OF_DATA_DIRS.values():
        _drop_postgres_database(name)


def _create_postgres_database() -> tuple[str, str]:
    name = f"agentstream_test_{uuid.uuid4().hex[:12]}"
    try:
        postgres_admin(f'CREATE DATABASE "{name}"')
    except OSError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}: {exc}")
    url = make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql+asyncpg", database=name)
    return name, url.render_as_string(hide_password=False)


def _drop_postgres_database(name: str) -> None:
    postgres_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_admin(statement: str) -> None:
    async def execute() -> None:
        connection = await asyncpg.connect(POSTGRES_ADMIN_URL)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    on_its_own_loop(execute)


T = TypeVar("T")


@contextmanager
def through_sqlalchemy(containing: str = "") -> Iterator[list[str]]:
    """The statements holding ``containing`` sent through SQLAlchemy's execution (on any
    engine) while the block runs: not those a store sends on its driver's own API."""
    sent: list[str] = []

    def record(_connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if containing in statement:
            sent.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def on_its_own_loop(work: Callable[[], Awaitable[T]]) -> T:
    """``work`` run to its end on an event loop of its own, in a thread of its own: the same
    from a plain test and from an async one (whose loop this thread is already running)."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(anyio.run, work).result()


def rows(live: LiveServer, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """What ``sql`` reads from the database of ``live`` (``:name`` parameters), on either
    store: the server's SQLite file or its PostgreSQL database."""

    async def read() -> list[tuple[Any, ...]]:
        engine = create_async_engine(live.settings.database)
        try:
            async with engine.connect() as db:
                return [tuple(row) for row in await db.execute(text(sql), params)]
        finally:
            await engine.dispose()

    return on_its_own_loop(read)


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


ARTIFACTS = Path(os.environ.get("AGENTSTREAM_TEST_ARTIFACTS", "test-artifacts"))
"""Where the page tests save their screenshots (ignored by git; CI can keep the folder)."""


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def sign_in(page: Any, live: LiveServer) -> None:
    """Sign the browser in to the console with the demo key, as its sign-in form does."""
    response = page.request.post(
        f"{live.url}/api/console/session",
        data={"api_key": live.key},
        headers={"Origin": live.url},
    )
    assert response.status == 204, response.text()


@pytest.fixture
def page(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A page in headless Chromium from the Debian packages (Playwright cannot download its
    own here). Skipped without it, except in CI. The test fails if the page's
    Content-Security-Policy refused anything, save the URLs a ``csp_refuses`` marker names
    (a request known to be made, refused, and handled by the page)."""
    if not Path(CHROMIUM).exists():
        message = "Chromium is missing: apt-get install chromium (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import ConsoleMessage, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        refused: list[str] = []  # what the pages' Content-Security-Policy blocked: nothing
        marker = request.node.get_closest_marker("csp_refuses")
        expected = marker.args if marker is not None else ()

        def on_console(message: ConsoleMessage) -> None:
            if "Security Policy" in message.text and not any(
                f"'{url}'" in message.text for url in expected
            ):
                refused.append(message.text)

        page.on("console", on_console)
        yield page
        browser.close()
        assert not refused, refused
