"""Connections accepted many at each turn of the event loop (``accepting.Acceptor``), where
uvloop's own server accepts one: under load a turn takes tens of milliseconds, and clients
opening streams faster than the turns waited seconds in the kernel's queue. Counted in
turns of a uvloop loop (a callback that schedules itself again each turn), not in time."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable, Coroutine, Iterator
from contextlib import ExitStack, closing, contextmanager
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


def in_uvloop(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
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
            stack.enter_context(socket.create_connection(("127.0.0.1", port))) for _ in range(count)
        ]


def test_a_burst_of_connections_is_accepted_in_a_few_turns_of_the_loop() -> None:
    async def main() -> int:
        made = [0]
        with closing(listen("127.0.0.1", 0)) as listener, connected(listener, BURST):
            acceptor = Acceptor(listener, lambda: Counted(made))
            turns = await turns_until(lambda: made[0] == BURST)
            acceptor.close()
            await acceptor.wait_closed()
        assert made[0] == BURST
        return turns

    assert in_uvloop(main) <= A_FEW_TURNS


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

    assert in_uvloop(main) >= BURST


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

    in_uvloop(main)


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
            await turns_until(lambda: OutOfDescriptors.failed)
            assert made == [0]  # nothing more accepted at that turn
            await asyncio.wait_for(all_made.wait(), 10)
            acceptor.close()
            await acceptor.wait_closed()
        assert made == [3]

    with caplog.at_level(logging.ERROR, logger="agentstream.server.accepting"):
        in_uvloop(main)
    assert [record.getMessage() for record in caplog.records] == [
        "Cannot accept connections (Too many open files); trying again in 0.05 s"
    ]


def test_the_server_accepts_its_connections_many_a_turn_and_stops_when_told() -> None:
    """``DrainingServer`` (what ``agentstream serve`` runs) listens by ``Acceptor``s: a
    burst of requests is answered, its connections accepted within a few turns."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    async def main() -> None:
        with closing(listen("127.0.0.1", 0)) as listener:
            config = uvicorn.Config(app, lifespan="off", log_level="warning")
            server = DrainingServer(config)
            serving = asyncio.create_task(server.serve(sockets=[listener]))
            try:
                await turns_until(lambda: server.started)
                with connected(listener, BURST) as clients:
                    connections = server.server_state.connections
                    turns = await turns_until(lambda: len(connections) == BURST)
                    for client in clients[:3]:
                        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    loop = asyncio.get_running_loop()
                    answers = await asyncio.gather(
                        *(loop.run_in_executor(None, client.recv, 64) for client in clients[:3])
                    )
            finally:
                server.should_exit = True
                await serving
        assert turns <= A_FEW_TURNS
        assert all(answer.startswith(b"HTTP/1.1 204 ") for answer in answers)

    in_uvloop(main)
