"""Connections accepted many at each turn of the event loop (``accepting.Acceptor``), where
uvloop's own server accepts one: under load a turn takes tens of milliseconds, and clients
opening streams faster than the turns waited seconds in the kernel's queue. Counted in
turns of the event loop (a callback that schedules itself again each turn), not in time."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import ExitStack, asynccontextmanager, closing, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvicorn
import uvloop

from agentstream.server import accepting
from agentstream.server.accepting import Acceptor
from agentstream.server.serving import DrainingServer, listen

T = TypeVar("T")

BURST = 100
A_FEW_TURNS = 10
"""Turns of the loop to accept a ``BURST`` in at most, where one a turn takes a hundred."""


class Counted(asyncio.Protocol):
    """A connection's protocol that only counts the connections made."""

    def __init__(self, made: list[int]) -> None:
        self.made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made[0] += 1


LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
"""The event loops ``agentstream serve`` runs on: uvloop, or asyncio's where it is missing."""


def run_in(main: Callable[[], Coroutine[Any, Any, T]], loop: str = "uvloop") -> T:
    """``main()`` run to its end on a new event loop of ``LOOPS``."""
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(main())


async def turns_until(done: Callable[[], bool], most: int = 400) -> int:
    """Turns of the running loop until ``done()`` (``most`` at most)."""
    loop = asyncio.get_running_loop()
    turned = asyncio.Event()
    count = 0

    def turn() -> None:
        nonlocal count
        count += 1
        if done() or count >= most:
            turned.set()
        else:
            loop.call_soon(turn)

    loop.call_soon(turn)
    await turned.wait()
    return count


@contextmanager
def connected(listener: socket.socket, count: int) -> Iterator[list[socket.socket]]:
    """``count`` clients connected to ``listener`` (waiting in its queue until accepted)."""
    with ExitStack() as stack:
        port = listener.getsockname()[1]
        yield [
            stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            for _ in range(count)
        ]


@pytest.mark.parametrize("loop", LOOPS)
def test_a_burst_of_connections_is_accepted_in_a_few_turns_of_the_loop(loop: str) -> None:
    async def main() -> int:
        made = [0]
        with closing(listen("127.0.0.1", 0)) as listener, connected(listener, BURST):
            acceptor = Acceptor(listener, lambda: Counted(made))
            turns = await turns_until(lambda: made[0] == BURST)
            acceptor.close()
            await acceptor.wait_closed()
        assert made[0] == BURST
        return turns

    assert run_in(main, loop) <= A_FEW_TURNS


def test_uvloop_alone_accepts_one_connection_a_turn() -> None:
    """Why the acceptor is there: should this fail, uvloop accepts in bursts again, and
    ``Acceptor`` can go."""

    async def main() -> int:
        made = [0]
        with closing(listen("127.0.0.1", 0)) as listener, connected(listener, BURST):
            loop = asyncio.get_running_loop()
            server = await loop.create_server(lambda: Counted(made), sock=listener)
            turns = await turns_until(lambda: made[0] == BURST)
            server.close()
        return turns

    assert run_in(main) >= BURST


def test_a_closed_acceptor_accepts_nothing_and_leaves_the_socket_open() -> None:
    async def main() -> None:
        made = [0]
        with closing(listen("127.0.0.1", 0)) as listener:
            acceptor = Acceptor(listener, lambda: Counted(made))
            acceptor.close()
            acceptor.close()  # again: nothing
            with connected(listener, 3):
                await turns_until(lambda: False, most=20)
            assert made == [0]
            assert listener.fileno() != -1

    run_in(main)


class OutOfDescriptors(socket.socket):
    """A listening socket whose first ``accept`` finds the process out of descriptors."""

    failed = False

    def accept(self) -> tuple[socket.socket, Any]:
        if not OutOfDescriptors.failed:
            OutOfDescriptors.failed = True
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


def test_out_of_descriptors_it_waits_then_accepts_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(accepting, "RETRY_AFTER", 0.05)
    monkeypatch.setattr(OutOfDescriptors, "failed", False)

    async def main() -> None:
        made = [0]
        all_made = asyncio.Event()

        class CountedToThree(Counted):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                super().connection_made(transport)
                if made[0] == 3:
                    all_made.set()

        plain = listen("127.0.0.1", 0)
        with (
            closing(OutOfDescriptors(fileno=plain.detach())) as listener,
            connected(listener, 3),
        ):
            acceptor = Acceptor(listener, lambda: CountedToThree(made))
            loop = asyncio.get_running_loop()
            await turns_until(lambda: OutOfDescriptors.failed)
            failed_at = loop.time()
            await asyncio.wait_for(all_made.wait(), 10)
            # not accepting meanwhile (the loop's clock is read to the millisecond)
            assert loop.time() - failed_at >= accepting.RETRY_AFTER / 2
            acceptor.close()
            await acceptor.wait_closed()
        assert made == [3]

    with caplog.at_level(logging.ERROR, logger="agentstream.server.accepting"):
        run_in(main)
    assert [record.getMessage() for record in caplog.records] == [
        "Cannot accept connections (Too many open files); trying again in 0.05 s"
    ]


async def no_content(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app that answers every request 204."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


GET = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@asynccontextmanager
async def draining_server(listener: socket.socket, **options: Any) -> AsyncIterator[DrainingServer]:
    """A ``DrainingServer`` serving ``no_content`` on ``listener`` (uvicorn's ``options``)
    in this loop, until the block ends."""
    config = uvicorn.Config(no_content, lifespan="off", log_level="warning", **options)
    server = DrainingServer(config)
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await turns_until(lambda: server.started)
        yield server
    finally:
        server.should_exit = True
        await serving


@pytest.fixture
def no_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn's server leaves the test runner's signal handlers alone."""
    monkeypatch.setattr(DrainingServer, "capture_signals", nullcontext)


@pytest.mark.usefixtures("no_signals")
def test_the_server_accepts_its_connections_many_a_turn_and_stops_when_told() -> None:
    """``DrainingServer`` (what ``agentstream serve`` runs) listens by ``Acceptor``s: a
    burst of requests is answered, its connections accepted within a few turns."""

    async def main() -> tuple[int, list[bytes]]:
        with closing(listen("127.0.0.1", 0)) as listener:
            async with draining_server(listener) as server:
                with connected(listener, BURST) as clients:
                    connections = server.server_state.connections
                    turns = await turns_until(lambda: len(connections) == BURST)
                    for client in clients[:3]:
                        client.sendall(GET)
                    loop = asyncio.get_running_loop()
                    answers = await asyncio.gather(
                        *(loop.run_in_executor(None, client.recv, 64) for client in clients[:3])
                    )
        return turns, answers

    turns, answers = run_in(main)
    assert turns <= A_FEW_TURNS
    assert all(answer.startswith(b"HTTP/1.1 204 ") for answer in answers)


@pytest.mark.usefixtures("no_signals")
def test_a_server_given_a_certificate_serves_over_tls(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        message = "OpenSSL's command is missing: apt-get install openssl (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    key, certificate = tmp_path / "key.pem", tmp_path / "certificate.pem"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    where = ["-keyout", str(key), "-out", str(certificate), "-subj", "/CN=127.0.0.1"]
    subprocess.run([*openssl, *where], check=True, capture_output=True)
    trusting = ssl.create_default_context(cafile=certificate)
    trusting.check_hostname = False

    def get(port: int) -> bytes:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            trusting.wrap_socket(raw) as tls,
        ):
            tls.sendall(GET)
            return tls.recv(64)

    async def main() -> bytes:
        with closing(listen("127.0.0.1", 0)) as listener:
            async with draining_server(listener, ssl_keyfile=key, ssl_certfile=certificate):
                port = listener.getsockname()[1]
                return await asyncio.get_running_loop().run_in_executor(None, get, port)

    assert run_in(main).startswith(b"HTTP/1.1 204 ")
