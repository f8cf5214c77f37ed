"""``agentstream serve`` as an operator starts it: what a server owns before its app starts
(its port, its SQLite data directory), private data files, and whose forwarded headers it
believes."""

from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import httpx

from agentstream.sse import SSEDecoder
from conftest import crashable_server, free_port, make_settings, run_events, serve, wait_until_up

SERVE = [sys.executable, "-m", "agentstream", "serve"]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path]),
    "AGENTSTREAM_DEMO": "true",
}


@contextmanager
def running(command: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A server process, up and answering, until the block ends."""
    port = command[command.index("--port") + 1]
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL)
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
        from conftest import call_wait_then_answer

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


def test_a_server_on_a_taken_port_touches_no_data(tmp_path: Path) -> None:
    with (
        crashable_server(tmp_path) as (crashed, crash),
        crashed.client() as client,
        client.stream("POST", "/api/agents/waiter/run/stream", json={"message": "go"}) as live,
    ):
        until(frames_of(live), "tool_call")
        crash()  # a run left running, for a recovery to interrupt
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
        with serve(make_settings(data)) as live:
            run_events(live, "demo", {"message": "hi"})
            assert _modes(data) == private
        for path in [data, *data.iterdir()]:  # as an older version left them
            path.chmod(0o755 if path.is_dir() else 0o644)
        with serve(make_settings(data)) as live:
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
