"""Is this configuration ready to serve? The checks ``agentstream check`` runs, and
``agentstream serve`` runs before it starts: the agents and models files, the database
(reachable, and where its migrations stand), the models the agents name (their keys, or
their local server), and the port.

Each problem is a line or two for a person, with the file and line where there is one,
never a traceback (the cause is kept, for ``--debug``). Nothing here writes: a SQLite
database is opened read-only, and one that does not exist is not created.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from urllib.parse import urlsplit

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import Connection
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agentstream.agents import AgentSpec, Definitions
from agentstream.config import Settings
from agentstream.errors import ConfigError, ServeRefused
from agentstream.providers.catalog import load_catalog
from agentstream.providers.registry import ModelRegistry
from agentstream.server.app import check_config
from agentstream.server.serving import listen
from agentstream.store import Store
from agentstream.store.store import sqlite_file

__all__ = [
    "DatabaseState",
    "Problem",
    "Report",
    "check",
    "check_database",
    "check_declared",
    "check_port",
    "inspect_database",
]

_MIGRATIONS = Path(str(files("agentstream.store").joinpath("migrations")))
_URL_FORMS = "use sqlite:///path/to/file.db or postgresql://user:password@host/database"
CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a database server before calling it unreachable."""


@dataclass(frozen=True, slots=True)
class Problem:
    message: str
    """A line or two for a person, starting with the file and line where there is one."""
    blocking: bool = True
    """The server cannot start (else it can, but something will not work: a model)."""
    cause: BaseException | None = None
    """The exception behind it, shown with ``--debug``."""


@dataclass(frozen=True, slots=True)
class DatabaseState:
    """Where the data is and how far its schema has come."""

    where: str
    """The SQLite file, or the database URL without its password."""
    revision: str | None
    """The migration it is at; None for a new (or empty) database."""
    pending: tuple[str, ...]
    """The migrations the server applies at start-up, in order."""
    agents: tuple[AgentSpec, ...] = ()
    """The agents stored in it (read when its schema is current)."""

    @property
    def new(self) -> bool:
        return self.revision is None


@dataclass(slots=True)
class Report:
    problems: list[Problem] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    """What was found fine, one line each."""
    database: DatabaseState | None = None
    agents: set[str] = field(default_factory=set)
    """The ids of the agents whose models have been checked."""

    @property
    def blocking(self) -> bool:
        return any(problem.blocking for problem in self.problems)


async def check(settings: Settings) -> Report:
    """Every check, in the order ``serve`` runs them."""
    report = Report()
    await check_declared(settings, report)
    await check_database(settings, report)
    await check_redis(settings, report)
    check_port(settings, report)
    return report


async def check_declared(settings: Settings, report: Report) -> None:
    """The agents and models files, and the models their agents name. Reads no data, so
    ``serve`` runs it before it claims its port and data directory."""
    try:
        declared = check_config(settings)
    except ConfigError as exc:
        report.problems.append(Problem(str(exc), cause=exc.__cause__))
        return
    agents = [
        (f"{definitions.where(('agents', i, 'model'))}: agent {spec.id!r}", spec)
        for definitions in (declared.demo, declared.file)
        if definitions is not None
        for i, spec in enumerate(definitions.agents)
    ]
    if settings.agents_file:
        report.passed.append(f"{settings.agents_file}: {_declared(declared.file)}")
    await _check_models(settings, agents, report)


async def check_database(settings: Settings, report: Report) -> None:
    """The database: reachable, its migrations, and the models its stored agents name
    (those the files do not declare)."""
    try:
        report.database = state = await inspect_database(settings.database)
    except ConfigError as exc:
        report.problems.append(Problem(str(exc), cause=exc.__cause__))
        return
    report.passed.append(_database_summary(state))
    stored = [
        (f"{state.where}: agent {spec.id!r} (stored)", spec)
        for spec in state.agents
        if spec.id not in report.agents
    ]
    await _check_models(settings, stored, report)


async def check_redis(settings: Settings, report: Report) -> None:
    """Cluster mode's Redis answers (the live log, cancels and chat limits go through it)."""
    if settings.redis_url is None:
        return
    client = Redis.from_url(settings.redis_url, socket_connect_timeout=CONNECT_TIMEOUT)
    url = urlsplit(settings.redis_url)  # said without its password
    where = f"{url.hostname}:{url.port or 6379}{url.path}" if url.hostname else url.path
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        cause = exc.__context__ if isinstance(exc, RedisError) and exc.__context__ else exc
        reason = (
            "connection refused (is the server running?)"
            if isinstance(cause, ConnectionRefusedError)
            else str(cause)
        )
        report.problems.append(Problem(f"Cannot reach Redis at {where}: {reason}"))
    else:
        version = await _redis_version(client)
        if version is not None and _older(version, REDIS_NEEDED):
            report.problems.append(
                Problem(
                    f"Redis at {where} is {version}: cluster mode needs {REDIS_NEEDED} or later"
                )
            )
        else:
            report.passed.append(
                f"Redis at {where}: answers (keys under {settings.redis_prefix!r})"
            )
    finally:
        await client.aclose()


REDIS_NEEDED = "6.2"
"""The live log trims each run's stream by seq (``XADD ... MINID``, Redis 6.2)."""


async def _redis_version(client: Redis) -> str | None:
    """The server's version, from ``INFO``; None if it will not say (a managed Redis may
    refuse the command): not judged then."""
    try:
        return str((await client.info("server"))["redis_version"])
    except (RedisError, KeyError):
        return None


def _older(version: str, than: str) -> bool:
    """``version`` is before ``than``, by major and minor (``6.2.0-rc1`` is 6.2); False if
    it is in another form (not judged)."""
    try:
        return _major_minor(version) < _major_minor(than)
    except ValueError:
        return False


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def check_port(settings: Settings, report: Report) -> None:
    """The port is free (``serve`` instead takes it, with the same message if it cannot)."""
    try:
        with closing(listen(settings.host, settings.port)):
            report.passed.append(f"port {settings.host}:{settings.port}: free")
    except ServeRefused as exc:
        report.problems.append(Problem(str(exc)))


async def _check_models(
    settings: Settings, agents: Iterable[tuple[str, AgentSpec]], report: Report
) -> None:
    """Each agent's model can run: its key is set, or its local server answers. ``agents``
    are (where it is declared, the agent)."""
    try:
        models = ModelRegistry(load_catalog(settings.models_file))
    except ConfigError:
        return  # check_config has said what is wrong with the file
    ready: set[str] = set()
    try:
        for where, spec in agents:
            report.agents.add(spec.id)
            if spec.model not in models:
                continue  # an unknown model: check_config said so, or a stored agent's
            if reason := await models.ready(spec.model):
                report.problems.append(Problem(f"{where}: {reason}", blocking=False))
            else:
                ready.add(spec.model)
    finally:
        await models.aclose()
    if ready:
        report.passed.append(f"models ready: {', '.join(sorted(ready))}")


async def inspect_database(url: str) -> DatabaseState:
    """Connect (read-only) and read where the schema stands. ``ConfigError``, one line, if
    the database cannot be reached or read."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"Database URL {url!r}: {exc}; {_URL_FORMS}") from exc
    database = sqlite_file(url)
    where = str(database) if database else parsed.render_as_string(hide_password=True)
    script = ScriptDirectory(str(_MIGRATIONS))
    head = script.get_current_head()
    if database is not None and not database.exists():
        return DatabaseState(where, None, _pending(script, head, None))
    engine = _engine(parsed, database, where)
    try:
        async with engine.connect() as connection:
            revision = await connection.run_sync(_revision)
        pending = _pending(script, head, revision)
        current = revision is not None and not pending
        agents = [a.spec for a in await Store(engine).list_agents()] if current else []
    except (OSError, DBAPIError) as exc:
        raise ConfigError(_unreachable(exc, parsed, where)) from exc
    except RevisionError as exc:
        raise ConfigError(
            f"{where}: the database is at migration {revision}, which this version of"
            " agentstream does not know (was it made by a newer one?)"
        ) from exc
    finally:
        await engine.dispose()
    return DatabaseState(where, revision, pending, tuple(agents))


def _engine(parsed: URL, database: Path | None, where: str) -> AsyncEngine:
    try:
        if database is not None:  # read-only: a check changes nothing
            readonly = parsed.set(database=f"file:{database}", query={"uri": "true", "mode": "ro"})
            return create_async_engine(readonly)
        return create_async_engine(parsed, connect_args=_connect_args(parsed))
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise ConfigError(
            f"Database URL {where}: not one agentstream can use ({exc}); {_URL_FORMS}"
        ) from exc


def _connect_args(parsed: URL) -> dict[str, float]:
    return {"timeout": CONNECT_TIMEOUT} if parsed.get_backend_name() == "postgresql" else {}


def _revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def _pending(script: ScriptDirectory, head: str | None, revision: str | None) -> tuple[str, ...]:
    if head is None or revision == head:
        return ()
    steps = script.iterate_revisions(head, revision or "base")
    return tuple(reversed([step.revision for step in steps if step is not None]))


def _unreachable(exc: BaseException, url: URL, where: str) -> str:
    """What went wrong connecting, as a person would say it."""
    backend = {"postgresql": "PostgreSQL"}.get(url.get_backend_name(), url.get_backend_name())
    server = f"{backend} at {url.host or 'localhost'}:{url.port or 5432}"
    cause = _root(exc)
    if isinstance(cause, socket.gaierror):
        return f"Cannot reach {server}: unknown host {url.host!r}"
    if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == (
        errno.ECONNREFUSED
    ):
        return f"Cannot reach {server}: connection refused (is the server running?)"
    if isinstance(cause, TimeoutError):
        return f"Cannot reach {server}: no answer within {CONNECT_TIMEOUT:g} s"
    sqlstate = getattr(cause, "sqlstate", None)  # PostgreSQL's error code, from the driver
    if sqlstate == "3D000":  # invalid_catalog_name
        return (
            f"{server} has no database {url.database!r}: create it"
            f" (createdb {url.database}) or fix the database URL"
        )
    if sqlstate in ("28000", "28P01"):  # invalid_authorization_specification, _password
        return (
            f"{server} refused user {url.username!r}: {cause}; check the user and password"
            " in the database URL"
        )
    return f"{where}: cannot read the database: {cause}"


def _root(exc: BaseException) -> BaseException:
    """The driver's own exception under SQLAlchemy's wrappers."""
    while (inner := exc.__cause__ or getattr(exc, "orig", None)) is not None and inner is not exc:
        exc = inner
    return exc


def _declared(definitions: Definitions) -> str:
    counts = {
        kind: len(getattr(definitions, kind)) for kind in ("agents", "workflows", "deployments")
    }
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def _database_summary(state: DatabaseState) -> str:
    if state.new:
        return f"database {state.where}: new (no agentstream tables yet); made at start-up"
    if state.pending:
        return (
            f"database {state.where}: at migration {state.revision};"
            f" start-up applies {', '.join(state.pending)}"
        )
    return f"database {state.where}: at migration {state.revision} (the latest)"
