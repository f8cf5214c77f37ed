"""Servers in processes of their own, as users run them (``serving.claim`` and ``run``):
for tests that kill one (SIGKILL), stop one (SIGTERM), or run several as a cluster; and a
Redis of a test's own, to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from agentstream.config import Settings
from conftest import LiveServer, free_port, make_settings, wait_until, wait_until_up

__all__ = ["TAKEOVER_LEASE", "ServerProcess", "cluster", "server_process", "start_redis"]

TAKEOVER_LEASE = 3.0
"""The lease of servers whose death a test waits out. A process renews every third of it,
and takes itself for dead (ending its runs) when it renews late: a second, as before, was
missed by a process starved of CPU in a busy test run, whose runs then ended by themselves."""


@dataclass
class ServerProcess:
    live: LiveServer
    process: subprocess.Popen[bytes]

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, as a process manager stops a server; its exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


@contextmanager
def server_process(settings: Settings) -> Iterator[ServerProcess]:
    """``tests/fakes/test_app.py``'s app, served on a free port by a process of its own."""
    settings = settings.model_copy(update={"port": free_port()})
    program = textwrap.dedent("""
        import sys
        from agentstream.config import Settings
        from agentstream.server.serving import claim, run
        from fakes.test_app import create
        settings = Settings.model_validate_json(sys.argv[1])
        with claim(settings) as listener:
            run(create(settings), settings, listener)
    """)
    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), *sys.path])}
    process = subprocess.Popen([sys.executable, "-c", program, settings.model_dump_json()], env=env)
    try:
        url = f"http://127.0.0.1:{settings.port}"
        wait_until_up(url)
        key = settings.demo_key_file.read_text().strip()
        yield ServerProcess(LiveServer(url=url, key=key, settings=settings), process)
    finally:
        process.kill()
        process.wait(10)


@contextmanager
def cluster(
    data_dir: Path, database_url: str, redis_url: str, *, size: int = 2, **overrides: Any
) -> Iterator[list[ServerProcess]]:
    """``size`` server processes sharing one PostgreSQL database and one Redis (under a
    prefix of their own), started one after the other."""
    settings = make_settings(
        data_dir,
        database_url=database_url,
        redis_url=redis_url,
        redis_prefix=f"test-{data_dir.name}-{os.getpid()}",
        **overrides,
    )
    with ExitStack() as stack:
        yield [stack.enter_context(server_process(settings)) for _ in range(size)]


def start_redis(port: int) -> subprocess.Popen[bytes]:
    """A Redis of the test's own, keeping nothing on disk (as this machine's), to stop."""
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    wait_until(answers)
    return server
