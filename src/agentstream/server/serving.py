"""Serving the app under uvicorn without touching data the server could not keep serving.

uvicorn starts the app (migrations, and the recovery of runs a crash cut off) before it
binds its port, so a second server started on a taken port used to change the first one's
data before failing. Here a server first takes what it must own: its listening socket, then,
on SQLite, its database, with an exclusive lock that names the owner to whoever finds it
taken. Only then does the app start. (PostgreSQL is shared by design: no lock there.)

Forwarded headers (``X-Forwarded-For``, ``X-Forwarded-Proto``) are believed only from the
configured proxies, so no client can pick the address its limits are counted by.

Connections are accepted many at a time (``accepting.Acceptor``), where uvloop's server
accepts one each turn of the event loop and left clients waiting seconds under load.

Stopping (SIGTERM, or Ctrl-C) drains before uvicorn shuts down: the server stops listening,
its app takes no new run and gives the live ones their grace period, and only then are the
connections closed and the app's lifespan ended (``DrainingServer``). With several workers
(cluster mode), uvicorn's own supervisor runs them on the one socket, and each drains alike.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import logging
import os
import socket
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp
from uvicorn.config import LOGGING_CONFIG, STARTUP_FAILURE
from uvicorn.supervisors import multiprocess

from agentstream.config import Settings
from agentstream.datadir import open_private
from agentstream.errors import ServeRefused
from agentstream.server.accepting import Acceptor
from agentstream.server.app import create_app
from agentstream.store import Store
from agentstream.store.store import sqlite_file
from agentstream.telemetry import logs, metrics
from agentstream.telemetry.logs import LogFormat

__all__ = [
    "CLOSE_TIMEOUT",
    "DrainingServer",
    "claim",
    "listen",
    "log_to_console",
    "run",
    "run_workers",
]

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT = 5
"""Seconds the connections still open after the drain get to end by themselves before
uvicorn cuts them and ends the app's lifespan: a client following a run of another process
would otherwise hold its connection for as long as that run goes."""


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
    """Serve ``app`` on a socket from ``claim`` until told to stop, then drain it. False if
    the app failed to start (uvicorn has logged why)."""
    server = DrainingServer(_config(app, settings, listener))
    server.run(sockets=[listener])
    return server.started


def run_workers(settings: Settings, listener: socket.socket) -> bool:
    """Serve with ``settings.workers`` processes on a socket from ``claim``, under uvicorn's
    supervisor, until told to stop; each worker builds its own app from ``settings`` and
    drains when it stops. False if a worker's app failed to start (it has logged why)."""
    anyio.run(_migrate, settings.database)  # here, once: workers migrating at once collide
    with _metrics_shared():
        return _supervise(settings, listener)


def _supervise(settings: Settings, listener: socket.socket) -> bool:
    config = _config(
        functools.partial(_worker_app, settings),
        settings,
        listener,
        factory=True,
        workers=settings.workers,
    )
    # uvicorn's supervisor makes each worker a ``Process``, which serves with a plain
    # ``uvicorn.Server`` and has no setting for another: while it runs, its workers are
    # ``_Worker``s, which serve with a ``DrainingServer``. Only this supervisor sees that.
    with mock.patch.object(multiprocess, "Process", _Worker):
        supervisor = multiprocess.Multiprocess(config, sockets=[listener])
        supervisor.run()
    return all(worker.exitcode != STARTUP_FAILURE for worker in supervisor.processes)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, stopping in the order that lets live runs end well. Told to stop
    (SIGTERM, Ctrl-C), it stops listening; then the app drains (``app.state.drain``: no new
    run, and the live ones get their grace period while their clients are still connected,
    so a run that finishes in time ends its stream as usual); only then comes uvicorn's own
    shutdown, which waits up to ``CLOSE_TIMEOUT`` for the connections, then ends the app's
    lifespan (which interrupts the runs still going). A second Ctrl-C cuts the drain short,
    as it does uvicorn's waits."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start (the app's lifespan), then an ``Acceptor`` on each socket."""
        if sockets is None:
            raise TypeError("a DrainingServer serves the sockets it is given (serving.claim)")
        await super().startup(sockets=[])
        acceptors = [Acceptor(sock, self._protocol, ssl=self.config.ssl) for sock in sockets]
        # uvicorn only closes the servers it keeps and waits for them to be closed
        self.servers = acceptors  # type: ignore[assignment]

    def _protocol(self) -> asyncio.Protocol:
        """A connection's protocol, as uvicorn's ``startup`` makes one."""
        protocol: asyncio.Protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        return protocol

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # uvicorn's shutdown closes them too: closing twice does nothing
            await server.wait_closed()  # connections accepted just before are drained too
        for sock in sockets or []:
            sock.close()
        drain = _drain_of(self.config.loaded_app)
        if drain is not None:  # the app has started
            logger.info("Stopped listening; live runs get the shutdown grace period to finish")
            await self._unless_forced(drain)
        await super().shutdown(sockets)

    async def _unless_forced(self, drain: Callable[[], Awaitable[None]]) -> None:
        async with anyio.create_task_group() as group:

            async def cut_short_when_forced() -> None:
                # A signal handler sets force_exit: poll it, as uvicorn's own waits do.
                while not self.force_exit:  # noqa: ASYNC110
                    await anyio.sleep(0.1)
                group.cancel_scope.cancel()

            group.start_soon(cut_short_when_forced)
            await drain()
            group.cancel_scope.cancel()


class _Worker(multiprocess.Process):
    """A worker process of ``run_workers``: uvicorn's, serving with a ``DrainingServer``."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            self._server = DrainingServer(config=self.config)
        return self._server

    def join(self) -> None:
        super().join()
        if self.pid is not None:
            metrics.process_ended(self.pid)  # its live streams are over


async def _migrate(database: str) -> None:
    """Bring the database to the latest migration (``Store.open`` does)."""
    store = await Store.open(database)
    await store.close()


@contextmanager
def _metrics_shared() -> Iterator[None]:
    """The workers' metrics added up at ``/metrics`` (prometheus_client's multiprocess
    mode): in the ``PROMETHEUS_MULTIPROC_DIR`` given, else in a directory of this serve,
    removed when it ends. Workers are new processes (spawned): they read it at start."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="agentstream-metrics-") as directory:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        try:
            yield
        finally:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]


def _worker_app(settings: Settings) -> FastAPI:
    """The app of one worker process, built in that process from the parent's settings."""
    log_to_console(settings.log_format)
    return create_app(settings)


def log_to_console(log_format: LogFormat = "auto") -> None:
    """The app's log lines (the demo key at start-up, runs starting and ending, warnings,
    the drain) on stderr: JSON lines, or uvicorn's format on a terminal (``log_format``),
    with the request, run, session and agent they are about."""
    app_logger = logging.getLogger("agentstream")
    if not app_logger.handlers:
        handler = logging.StreamHandler()
        handler.addFilter(logs.ContextFilter())
        app_logger.addHandler(handler)
    for each in app_logger.handlers:
        each.setFormatter(logs.formatter(log_format))
    app_logger.setLevel(logging.INFO)


def _log_config(log_format: LogFormat) -> dict[str, Any]:
    """uvicorn's logging: its own on a terminal; else JSON lines with the request id
    (access lines on stdout, the others on stderr, as uvicorn does)."""
    if not logs.uses_json(log_format):
        return LOGGING_CONFIG

    def handler(stream: str) -> dict[str, Any]:
        return {
            "class": "logging.StreamHandler",
            "formatter": "json",
            "filters": ["context"],
            "stream": f"ext://sys.{stream}",
        }

    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": logs.ContextFilter}},
        "formatters": {"json": {"()": logs.JsonFormatter}},
        "handlers": {"default": handler("stderr"), "access": handler("stdout")},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        },
    }


def _config(
    app: Any, settings: Settings, listener: socket.socket, **options: Any
) -> uvicorn.Config:
    proxies = settings.trusted_proxies
    return uvicorn.Config(
        app,
        host=settings.host,
        port=listener.getsockname()[1],
        log_level="info",
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies or None,
        timeout_graceful_shutdown=CLOSE_TIMEOUT,
        log_config=_log_config(settings.log_format),
        **options,
    )


def _drain_of(app: object) -> Callable[[], Awaitable[None]] | None:
    """``app.state.drain``, set once the app has started, from under the middleware uvicorn
    wraps an app in (each keeps the app it wraps as ``.app``)."""
    while not hasattr(app, "state") and hasattr(app, "app"):
        app = app.app
    drain: Callable[[], Awaitable[None]] | None = getattr(
        getattr(app, "state", None), "drain", None
    )
    return drain


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
