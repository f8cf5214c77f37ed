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

__all__ = ["AT_ONCE", "RETRY_AFTER", "Acceptor"]

logger = logging.getLogger(__name__)

AT_ONCE = 64
"""Connections accepted at most each time the socket is readable: a thousand a second
through a loop that turns every 60 ms, while workers sharing the socket (``serve
--workers``) are left the rest of a burst."""

RETRY_AFTER = 1.0
"""Seconds without accepting after the process ran out of file descriptors or memory (as
asyncio's server waits): the connections wait in the kernel's queue meanwhile."""

_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Acceptor:
    """Serves ``protocol``s on the connections to a listening socket (which it does not own:
    closing the acceptor stops accepting, the socket stays open) until closed. What uvicorn's
    ``Server`` needs of the servers it starts: ``close`` and ``wait_closed``."""

    def __init__(self, listener: socket.socket, protocol: Callable[[], asyncio.Protocol]) -> None:
        self._listener = listener
        self._protocol = protocol
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
                if error.errno in _OUT_OF_RESOURCES:
                    logger.error(
                        "Cannot accept connections (%s); trying again in %g s",
                        error.strerror,
                        RETRY_AFTER,
                    )
                    self._loop.remove_reader(self._listener)
                    self._loop.call_later(RETRY_AFTER, self._resume)
                    return
                continue  # this connection failed (reset before it was accepted): the next
            connection.setblocking(False)
            opening = self._loop.create_task(
                self._loop.connect_accepted_socket(self._protocol, connection)
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
        """Until the connections accepted before ``close`` are handed to their transports."""
        if self._opening:
            await asyncio.wait(self._opening)
