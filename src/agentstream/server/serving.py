"""Serving the app under uvicorn without touching data the server could not keep serving.

uvicorn starts the app (migrations, and the recovery of runs a crash cut off) before it
binds its port, so a second server started on a taken port used to change the first one's
data before failing. Here a server first takes what it must own: its listening socket, then,
on SQLite, its database, with an exclusive lock that names the owner to whoever finds it
taken. Only then does the app start. (PostgreSQL is shared by design: no lock there.)

Forwarded headers (``X-Forwarded-For``, ``X-Forwarded-Proto``) are believed only from the
configured proxies, so no client can pick the address its limits are counted by.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from agentstream.config import Settings
from agentstream.datadir import open_private
from agentstream.errors import ServeRefused
from agentstream.store.store import sqlite_file

__all__ = ["claim", "listen", "run"]


@contextmanager
def claim(settings: Settings) -> Iterator[socket.socket]:
    """What the server must own before its app starts: the listening socket (yielded) and,
    on SQLite, the database. ``ServeRefused`` (one line, naming the other owner) if either
    is taken; by then nothing else in the data directory has been read or changed."""
    with ExitStack() as owned:
        listener = owned.enter_context(closing(listen(settings.host, settings.port)))
        database = sqlite_file(settings.database)
        if database is not None:
            owned.enter_context(_lock(database, address=_url(listener)))
        yield listener


def run(app: ASGIApp, settings: Settings, listener: socket.socket) -> bool:
    """Serve ``app`` on a socket from ``claim`` until told to stop. False if the app failed
    to start (uvicorn has logged why)."""
    proxies = settings.trusted_proxies
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=listener.getsockname()[1],
        log_level="info",
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies or None,
    )
    server = uvicorn.Server(config)
    server.run(sockets=[listener])
    return server.started


def listen(host: str, port: int) -> socket.socket:
    """Bind and listen now: from here on the port is this process's."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(2048)
    except OSError as exc:
        listener.close()
        reason = (
            "the address is in use (another server?); choose another --port"
            if exc.errno == errno.EADDRINUSE
            else exc.strerror or str(exc)
        )
        raise ServeRefused(f"Cannot listen on {host}:{port}: {reason}") from None
    listener.set_inheritable(True)
    return listener


@contextmanager
def _lock(database: Path, *, address: str) -> Iterator[None]:
    """Own the SQLite database for as long as the block runs (the OS lets go if the
    process dies). The lock file next to it says who owns it: pid and address."""
    path = database.with_name(database.name + ".lock")
    descriptor = open_private(path)
    with closing(os.fdopen(descriptor, "r+")) as file:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, _, where = file.read().strip().partition(" ")
            raise ServeRefused(
                f"Another agentstream server (pid {pid or '?'}, listening on {where or '?'}) "
                f"owns {database}; stop it first, or give this one another --data-dir"
            ) from None
        file.truncate()
        file.write(f"{os.getpid()} {address}\n")
        file.flush()
        yield


def _url(listener: socket.socket) -> str:
    host, port = listener.getsockname()[:2]
    return (
        f"http://[{host}]:{port}" if listener.family == socket.AF_INET6 else f"http://{host}:{port}"
    )
