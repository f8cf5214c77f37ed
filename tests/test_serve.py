"""``agentstream serve`` as an operator starts it: what a server owns before its app starts
(its port, its SQLite data directory), private data files, whose forwarded headers it
believes, how it stops (SIGTERM drains), and several worker processes."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentstream.client import Client
from agentstream.server.app import YOUNG_COLLECTED_AT
from agentstream.sse import SSEDecoder
from conftest import (
    free_port,
    make_settings,
    new_postgres_database,
    run_events,
    serve,
    wait_until,
    wait_until_up,
)
from processes import server_process

SERVE = [sys.executable, "-m", "agentstream", "serve"]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path]),
    "AGENTSTREAM_DEMO": "true",
}


@contextmanager
def running(command: list[str], **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """A server process (with ``env`` on top of ``ENV``), up and answering, until the block
    ends."""
    port = command[command.index("--port") + 1]
    process = subprocess.Popen(command, env={**ENV, **env}, stdout=subprocess.DEVNULL)
    try:
        wait_until_up(f"http://127.0.0.1:{port}")
        yield process
    finally:
        process.kill()
        process.wait(10)


def frames_of(stream: httpx.Response) -> Iterator[dict[str, Any]]:
    decoder = SSEDecoder()
    for chunk in stream.iter_bytes():
        yield from (sse.json() for sse in decoder.feed(chunk))


def until(frames: Iterator[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    """Read frames up to one of kind ``event``."""
    read = []
    for frame in frames:
        read.append(frame)
        if frame["event"] == event:
            return read
    raise AssertionError(f"the stream ended without {event!r}: {read}")


def refused(*flags: str) -> str:
    """Start ``agentstream serve`` expecting a refusal: what it printed (stderr)."""
    done = subprocess.run([*SERVE, *flags], env=ENV, capture_output=True, timeout=60)
    assert done.returncode == 1, done
    return done.stderr.decode()


def gated_server(data_dir: Path, port: int, gate: Path) -> list[str]:
    """A server embedded as the README shows, with a ``waiter`` agent whose tool waits
    until ``gate`` exists: a run that is live for exactly as long as the test wants."""
    program = textwrap.dedent(f"""
        from pathlib import Path
        import anyio
        from agentstream.agents import AgentSpec
        from agentstream.config import Settings
        from agentstream.providers.scripted import ScriptedModel
        from agentstream.runtime.tools import Tool
        from agentstream.server import create_app
        from agentstream.server.serving import claim, run
        from fakes.test_app import call_wait_then_answer

        async def wait() -> str:
            while not Path({str(gate)!r}).exists():
                await anyio.sleep(0.02)
            return "opened"

        settings = Settings(data_dir=Path({str(data_dir)!r}), demo=True, port={port})
        app = create_app(
            settings,
            tools=[Tool.from_function(wait)],
            models=[ScriptedModel("scripted-wait", call_wait_then_answer)],
            agents=[AgentSpec(id="waiter", model="scripted-wait", tools=["wait"])],
        )
        with claim(settings) as listener:
            run(app, settings, listener)
    """)
    return [sys.executable, "-c", program, "--port", str(port)]


def test_a_second_server_on_the_same_data_dir_refuses_and_leaves_the_first_alone(
    tmp_path: Path,
) -> None:
    port, gate = free_port(), tmp_path / "gate"
    url = f"http://127.0.0.1:{port}"
    with running(gated_server(tmp_path, port, gate)) as first:
        key = (tmp_path / "demo-key").read_text().strip()
        with (
            httpx.Client(base_url=url, headers={"apikey": key}) as client,
            client.stream("POST", "/api/agents/waiter/run/stream", json={"message": "go"}) as live,
        ):
            stream = frames_of(live)
            frames = until(stream, "tool_call")
            run_id = frames[0]["run_id"]

            message = refused("--data-dir", str(tmp_path), "--port", str(free_port()))
            during = client.get(f"/api/agents/runs/{run_id}").json()["status"]
            gate.touch()
            frames += until(stream, "complete")
            run = client.get(f"/api/agents/runs/{run_id}").json()

    assert message == (
        f"Another agentstream server (pid {first.pid}, listening on {url}) owns "
        f"{tmp_path / 'agentstream.db'}; stop it first, or give this one another --data-dir\n"
    )
    assert during == "running", "the refused server interrupted nothing"
    assert stat.S_IMODE((tmp_path / "agentstream.db.lock").stat().st_mode) == 0o600
    assert frames[-1]["event"] == "complete"
    assert run["status"] == "completed"
    assert [e["event"] for e in run["events"]].count("error") == 0


@pytest.mark.parametrize(
    ("found", "serving"),
    [(700, YOUNG_COLLECTED_AT), (20_000, 20_000), (0, 0)],
    ids=["python's default", "a higher one kept", "the collector off, kept off"],
)
def test_the_collector_is_set_for_serving_while_the_app_serves(
    tmp_path: Path, found: int, serving: int
) -> None:
    """Every full pass of the cyclic collector walked the startup heap (some 200,000
    objects, about 100 ms with every stream standing still); frozen, it is skipped. Young
    objects are passed over every ``YOUNG_COLLECTED_AT`` at most (a busy server holds
    thousands for a fraction of a second). Both are given back when the app stops (a
    process may start another)."""
    assert gc.get_freeze_count() == 0
    before = gc.get_threshold()
    gc.set_threshold(found, *before[1:])
    try:
        with serve(make_settings(tmp_path)) as live:
            frozen, thresholds = gc.get_freeze_count(), gc.get_threshold()
            assert run_events(live, "demo", {"message": "hi"})[-1].json()["event"] == "complete"
        assert frozen > 100_000
        assert thresholds == (serving, *before[1:])
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == (found, *before[1:])
    finally:
        gc.set_threshold(*before)


def test_the_collector_is_given_back_when_the_last_app_stops(tmp_path: Path) -> None:
    """Two apps serving in one process: the first to stop leaves the collector set for the
    other, whichever started first."""
    before = gc.get_threshold()
    first = serve(make_settings(tmp_path / "first"))
    second = serve(make_settings(tmp_path / "second"))
    first.__enter__()
    try:
        second.__enter__()
    finally:  # the first to start stops first, the second serving still
        first.__exit__(None, None, None)
    try:
        assert gc.get_threshold()[0] == YOUNG_COLLECTED_AT, "the second app still serves"
    finally:
        second.__exit__(None, None, None)
    assert gc.get_threshold() == before


def test_a_server_on_a_taken_port_touches_no_data(tmp_path: Path) -> None:
    with (
        server_process(make_settings(tmp_path, database_url=None)) as crashed,  # a data dir's
        crashed.live.client() as client,
        client.stream("POST", "/api/agents/waiter/run/stream", json={"message": "go"}) as live,
    ):
        frames = frames_of(live)  # held: an iterator let go closes the connection, and
        until(frames, "tool_call")  # the run would be cancelled before the crash
        crashed.kill()  # a run left running, for a recovery to interrupt
    before = _fingerprint(tmp_path)

    with closing(socket.create_server(("127.0.0.1", 0))) as taken:
        port = taken.getsockname()[1]
        message = refused("--data-dir", str(tmp_path), "--port", str(port))

    assert message == (
        f"Cannot listen on 127.0.0.1:{port}: the address is in use (another server?); "
        "choose another --port\n"
    )
    assert _fingerprint(tmp_path) == before, "no migration, no recovery, not even a lock file"
    with closing(sqlite3.connect(tmp_path / "agentstream.db")) as db:
        assert db.execute("select status from runs").fetchall() == [("running",)]


def _fingerprint(directory: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


def test_the_data_directory_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    private = {
        ".": 0o700,
        "agentstream.db": 0o600,
        "agentstream.db-shm": 0o600,
        "agentstream.db-wal": 0o600,
        "demo-key": 0o600,
    }
    umask = os.umask(0o022)  # what most systems have: others may read new files
    try:
        with serve(make_settings(data, database_url=None)) as live:  # the SQLite file's modes
            run_events(live, "demo", {"message": "hi"})
            assert _modes(data) == private
        for path in [data, *data.iterdir()]:  # as an older version left them
            path.chmod(0o755 if path.is_dir() else 0o644)
        with serve(make_settings(data, database_url=None)) as live:
            run_events(live, "demo", {"message": "hi"})
            assert _modes(data) == private
    finally:
        os.umask(umask)


def _modes(directory: Path) -> dict[str, int]:
    return {
        ".": stat.S_IMODE(directory.stat().st_mode),
        **{path.name: stat.S_IMODE(path.stat().st_mode) for path in directory.iterdir()},
    }


def guesses(url: str, addresses: list[str]) -> list[int]:
    """One wrong password from each address, as X-Forwarded-For says; the statuses."""
    with httpx.Client(base_url=url, timeout=10) as client:
        return [
            client.post(
                "/api/chat/secret",
                json={"password": "guess"},
                headers={"X-Forwarded-For": address},
            ).status_code
            for address in addresses
        ]


def password_chat(tmp_path: Path, *flags: str) -> tuple[list[str], str]:
    """``agentstream serve`` with a password-protected chat: the command and its URL."""
    definitions = tmp_path / "agents.yaml"
    definitions.write_text(
        "deployments:\n"
        "  - {slug: secret, agent_id: demo, access: password, password: correct horse}\n"
    )
    port = free_port()
    command = [*SERVE, "--data-dir", str(tmp_path), "--port", str(port)]
    return [*command, "--agents", str(definitions), *flags], f"http://127.0.0.1:{port}"


def test_a_client_cannot_pick_its_address_with_x_forwarded_for(tmp_path: Path) -> None:
    command, url = password_chat(tmp_path)
    with running(command):
        statuses = guesses(url, [f"203.0.113.{n}" for n in range(11)])
    assert statuses == [401] * 10 + [429], "all from this one connection's address"


def test_the_address_a_trusted_proxy_forwards_is_the_clients(tmp_path: Path) -> None:
    command, url = password_chat(tmp_path, "--trusted-proxies", "127.0.0.0/8")
    with running(command):
        statuses = guesses(url, ["203.0.113.1"] * 11 + ["203.0.113.2"])
    assert statuses == [401] * 10 + [429, 401], "each client behind the proxy has its own limit"


@dataclass
class Stopping:
    """A gated server just sent SIGTERM while its ``waiter`` run waits in its tool."""

    process: subprocess.Popen[bytes]
    url: str
    gate: Path
    frames: list[dict[str, Any]]
    """The run's POST stream up to its tool call."""
    rest: Iterator[dict[str, Any]]
    """The rest of that stream, as it comes."""
    idle: httpx.Client
    """A client whose connection was open before the server stopped listening."""


@contextmanager
def stopping_during_a_run(data_dir: Path, **env: str) -> Iterator[Stopping]:
    port, gate = free_port(), data_dir / "gate"
    url = f"http://127.0.0.1:{port}"
    with running(gated_server(data_dir, port, gate), **env) as process:
        headers = {"apikey": (data_dir / "demo-key").read_text().strip()}
        with (
            httpx.Client(base_url=url, headers=headers, timeout=30) as client,
            client.stream("POST", "/api/agents/waiter/run/stream", json={"message": "go"}) as live,
            httpx.Client(base_url=url, headers=headers, timeout=30) as idle,
        ):
            stream = frames_of(live)
            frames = until(stream, "tool_call")
            idle.get("/healthz")
            process.send_signal(signal.SIGTERM)
            yield Stopping(process, url, gate, frames, stream, idle)


def listening(url: str) -> bool:
    """A new connection to ``url`` is accepted."""
    try:
        httpx.get(f"{url}/healthz")
    except httpx.ConnectError:
        return False
    return True


def stored_run(data_dir: Path) -> tuple[str, list[dict[str, Any]]]:
    """The one run in the server's SQLite file: its status and its stored events."""
    with closing(sqlite3.connect(data_dir / "agentstream.db")) as db:
        ((run_id, status),) = db.execute("select id, status from runs").fetchall()
        rows = db.execute(
            "select payload from run_events where run_id = ? order by seq", (run_id,)
        ).fetchall()
    return status, [json.loads(payload) for (payload,) in rows]


def test_sigterm_refuses_new_runs_and_lets_a_live_one_finish_on_its_stream(
    tmp_path: Path,
) -> None:
    with stopping_during_a_run(tmp_path) as stopping:
        # Draining: no new connection; one opened before may still ask, and is refused.
        wait_until(
            lambda: stopping.idle.get("/healthz").status_code == 200 and not listening(stopping.url)
        )
        refused = stopping.idle.post("/api/agents/waiter/run/stream", json={"message": "more"})
        stopping.gate.touch()
        frames = [*stopping.frames, *stopping.rest]
        # uvicorn ends the process as the signal would have, once it has shut down.
        assert stopping.process.wait(30) == -signal.SIGTERM

    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "shutting_down"
    assert [frame["event"] for frame in frames] == [
        "start",
        "step_started",
        "content_delta",
        "preamble",
        "tool_call",
        "tool_result",
        "step_completed",
        "step_started",
        "content_delta",
        "step_completed",
        "complete",
    ]
    status, events = stored_run(tmp_path)  # the refused run was never recorded
    assert status == "completed"
    assert events[-1]["type"] == "run_completed"


def test_a_run_that_outlasts_the_grace_period_ends_interrupted_not_cancelled(
    tmp_path: Path,
) -> None:
    with stopping_during_a_run(tmp_path, AGENTSTREAM_SHUTDOWN_GRACE_SECONDS="0.5") as stopping:
        # The server ends the stream (how: the next test); this client never leaves.
        with suppress(httpx.RemoteProtocolError):
            list(stopping.rest)
        assert stopping.process.wait(30) == -signal.SIGTERM

    status, events = stored_run(tmp_path)
    assert status == "interrupted"
    assert events[-2:] == [
        {**events[-2], "type": "tool_result", "status": "cancelled"},
        {**events[-1], "type": "run_failed", "status": "interrupted"},
    ]
    assert events[-1]["message"] == "The server stopped during the run"


def test_the_stream_of_a_run_interrupted_at_shutdown_ends_with_its_terminal_frame(
    tmp_path: Path,
) -> None:
    with stopping_during_a_run(tmp_path, AGENTSTREAM_SHUTDOWN_GRACE_SECONDS="0.5") as stopping:
        frames = [*stopping.frames, *stopping.rest]
        assert stopping.process.wait(30) == -signal.SIGTERM

    assert [frame["event"] for frame in frames[-2:]] == ["tool_result", "error"]
    assert frames[-1] == {
        "seq": frames[-1]["seq"],
        "event": "error",
        "message": "The server stopped during the run",
        "status": "interrupted",
    }


@pytest.mark.parametrize(
    ("flags", "env", "got"),
    [(["--workers", "2"], {}, "2"), ([], {"AGENTSTREAM_WORKERS": "2"}, "'2'")],
    ids=["flag", "environment"],
)
def test_several_workers_on_sqlite_are_refused_in_one_line(
    tmp_path: Path, flags: list[str], env: dict[str, str], got: str
) -> None:
    command = [*SERVE, "--data-dir", str(tmp_path), "--port", str(free_port()), *flags]
    done = subprocess.run(command, env={**ENV, **env}, capture_output=True, timeout=60)

    assert done.returncode == 1
    assert done.stderr.decode() == (
        "AGENTSTREAM_WORKERS: several workers are cluster mode: set"
        f" AGENTSTREAM_DATABASE_URL (PostgreSQL) and AGENTSTREAM_REDIS_URL (got {got})\n"
    )
    assert not any(tmp_path.iterdir()), "nothing started"


def test_two_workers_serve_one_port_and_both_drain_on_sigterm(tmp_path: Path) -> None:
    """On a new PostgreSQL database: the workers do not race to migrate it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with new_postgres_database() as database, log.open("w") as output:
        env = {
            **ENV,
            "AGENTSTREAM_DATABASE_URL": database,
            "AGENTSTREAM_REDIS_URL": "redis://127.0.0.1:6379/0",
            "AGENTSTREAM_REDIS_PREFIX": f"test-{tmp_path.name}",
        }
        command = [*SERVE, "--workers", "2", "--port", str(port), "--data-dir", str(tmp_path)]
        process = subprocess.Popen(command, env=env, stdout=output, stderr=output)
        try:
            wait_until(lambda: log.read_text().count("Application startup complete.") == 2, 60)
            key = (tmp_path / "demo-key").read_text().strip()
            with Client(url, key) as client:
                answers = [client.run("demo", "What is 17 * 23?") for _ in range(4)]
            # Whichever worker answers, /metrics adds up both (multiprocess mode).
            scraped = [httpx.get(f"{url}/metrics").text for _ in range(4)]
            process.send_signal(signal.SIGTERM)
            returncode = process.wait(60)
        finally:
            process.kill()
            process.wait(10)

    assert [answer.content for answer in answers] == ["The answer is 391."] * 4
    assert all('agentstream_runs_started_total{kind="agent"} 4.0' in text for text in scraped)
    assert returncode == 0
    printed = log.read_text()
    assert printed.count("Stopped listening; live runs get the shutdown grace period") == 2
    assert printed.count("Finished server process") == 2
    assert "ERROR" not in printed
