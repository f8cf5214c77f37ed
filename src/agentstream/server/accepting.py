"""Accepting the connections that wait on a listening socket, many at each turn of the loop.

uvloop's server accepts one connection each time the event loop turns (libuv does since
1.45: "don't accept() connections in a loop"). Under load a turn takes tens of milliseconds,
running every token due meanwhile, so a process serving a thousand streams accepted some
thirty connections a second: clients opening more than that waited in the kernel's queue,
their first token seconds late while the process had the time to start their runs. An
``Acceptor`` accepts what waits (up to ``AT_ONCE``) whenever the socket is readable, as
asyncio's own server does, and hands each connection to the loop's transport for it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from ssl import SSLContext

__all__ = ["AT_ONCE", "RETRY_AFTER", "Acceptor"]

logger = logging.getLogger(__name__)

AT_ONCE = 64
"""Connections accepted at most each time the socket is readable: a thousand a second
through a loop that turns every 60 ms, while workers sharing the socket (``serve
--workers``) are left the rest of a burst."""

RETRY_AFTER = 1.0
"""Seconds without accepting after the process ran out of file descriptors or memory (as
asyncio's server waits), or the socket failed otherwise: the connections wait in the
kernel's queue meanwhile."""

_THIS_CONNECTION = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})
"""What ``accept`` fails with for one connection (reset before it was accepted, a protocol
error, a firewall's no): the next may go through."""


class Acceptor:
    """Serves ``protocol_factory``'s protocols (over TLS with ``ssl``) on the connections to
    a listening socket, which it does not own (closing the acceptor stops accepting, the
    socket stays open), until closed. What uvicorn's ``Server`` needs of the servers it
    starts: ``close`` and ``wait_closed``."""

    def __init__(
        self,
        listener: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        *,
        ssl: SSLContext | None = None,
    ) -> None:
        self._listener = listener
        self._protocol_factory = protocol_factory
        self._ssl = ssl
        self._loop = asyncio.get_running_loop()
        self._opening: set[asyncio.Task[object]] = set()
        """The connections being handed to their transports (a task holds each until then)."""
        self._serving = True
        listener.setblocking(False)
        self._loop.add_reader(listener, self._accept)

    def _accept(self) -> None:
        for _ in range(AT_ONCE):
            try:
                connection, _address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in _THIS_CONNECTION:
                    continue
                # Out of file descriptors or memory, or the socket is broken: try again later
                # (a loop readable at every turn would spin on the error meanwhile).
                logger.error(
                    "Cannot accept connections (%s); trying again in %g s",
                    error.strerror or error,
                    RETRY_AFTER,
                )
                self._loop.remove_reader(self._listener)
                self._loop.call_later(RETRY_AFTER, self._resume)
                return
            self._open(connection)

    def _open(self, connection: socket.socket) -> None:
        """Hand the connection to a transport for its protocol (made here, so that a factory
        that fails closes the connection at once)."""
        try:
            protocol = self._protocol_factory()
        except Exception:
            connection.close()
            logger.exception("A connection could not be served")
            return
        connection.setblocking(False)
        opening = self._loop.create_task(
            self._loop.connect_accepted_socket(lambda: protocol, connection, ssl=self._ssl)
        )
        self._opening.add(opening)
        opening.add_done_callback(self._opened)

    def _opened(self, opening: asyncio.Task[object]) -> None:
        self._opening.discard(opening)
        if not opening.cancelled() and (error := opening.exception()) is not None:
            logger.warning("A connection could not be served: %r", error)

    def _resume(self) -> None:
        if self._serving:
            self._loop.add_reader(self._listener, self._accept)

    def close(self) -> None:
        """Stop accepting (again: nothing)."""
        if self._serving:
            self._serving = False
            self._loop.remove_reader(self._listener)

    async def wait_closed(self) -> None:
        """Until the connections accepted before ``close`` have their transports (and their
        protocols have been told of them)."""
        if self._opening:
            await asyncio.wait(self._opening)
