"""Settings, from ``AGENTSTREAM_*`` environment variables or a ``.env`` file."""

from __future__ import annotations

import os
import re
from ipaddress import ip_network
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agentstream.datadir import open_private, private_directory
from agentstream.errors import ConfigError
from agentstream.inputs import message_of

__all__ = ["Settings", "write_private"]

_ASYNC_DRIVERS = {
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTSTREAM_", env_file=".env", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 3000
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Addresses or networks of the reverse proxies whose ``X-Forwarded-For`` and
    ``X-Forwarded-Proto`` are believed (comma-separated in the environment). Default: none,
    so the client address is the connection's, whatever a client claims."""
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Origins whose pages may call this server from a browser (comma-separated in the
    environment: ``https://app.example.com,http://localhost:5173``, or ``*`` for any).
    Default: none, and browsers refuse cross-origin calls."""
    data_dir: Path = Path(".agentstream")
    """Where the SQLite database and the demo key live."""
    database_url: str | None = None
    """A database URL, e.g. ``postgresql://user@host/db``; the async driver is chosen for
    you (``postgresql://`` and ``postgres://`` use asyncpg, ``sqlite:///`` aiosqlite), and
    a URL that names its driver (``postgresql+asyncpg://``) is kept as it is.

    Default: SQLite in ``data_dir``."""
    database_pool_size: int = Field(default=15, ge=1, le=1_000)
    """PostgreSQL: the connections each process keeps open and reuses, and the most it opens.
    A query that finds them all busy waits for one, 30 s at most: a request's query then
    answers 503, a run's write ends the run. Keep processes × this within the server's
    ``max_connections``."""
    redis_url: str | None = None
    """Cluster mode, e.g. ``redis://host:6379/0``: with a PostgreSQL ``database_url``, the
    live log of runs (Redis Streams), cancels and chat limits are shared through this Redis,
    so any number of processes serve any run (docs/deployment.md). Default: one process,
    all in memory."""
    redis_prefix: str = Field(default="agentstream", pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    """Prefix of every Redis key and channel: several deployments can share one Redis."""
    log_max_events: int = Field(default=10_000, gt=0)
    """Cluster mode: the events kept per run in its Redis stream; older ones are trimmed
    (a viewer resuming before them gets the stored events instead)."""
    lease_seconds: float = Field(default=15.0, ge=1)
    """A process that has not renewed its lease for this long is taken for dead: the others
    end its runs ``interrupted``. Each process renews its lease every third of this."""
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    """On SIGTERM the server takes no new run, and the live ones get this long to finish;
    those still going then end ``interrupted``."""
    workers: int = Field(default=1, ge=1, le=64)
    """Server processes on this host (``serve --workers``); more than one is cluster mode."""
    agents_file: Path | None = None
    """A YAML file of agent definitions loaded (created or updated) at start-up."""
    demo: bool = False
    """Seed the demo agent and a demo API key, and pace the offline model like a real one."""
    keepalive_seconds: float = Field(default=30.0, gt=0)
    """Send a ``: keepalive`` comment after this long without an event."""
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    """Larger request bodies are refused with 413."""
    max_document_bytes: int = Field(default=20_971_520, gt=0)
    """The same, for documents added to a knowledge base."""
    offline_token_delay: float | None = Field(default=None, ge=0)
    """Seconds between the offline model's tokens; default 0.02 in demo mode, else 0."""
    run_retention_seconds: float = Field(default=60.0, ge=0)
    """How long a finished run's live log (deltas included) stays available to late viewers."""
    workflow_timeout_seconds: float = Field(default=3600.0, gt=0, le=86_400)
    """Execution timeout of a workflow: past it the execution ends with status ``timeout``."""
    workflow_http_allow: list[str] = Field(default_factory=list)
    """Networks HTTP blocks may reach although not public, e.g. ``["10.0.0.0/8"]`` (as JSON
    in the environment). Default: none; loopback, private and link-local are refused."""

    models_file: Path | None = None
    """More models and providers for the registry (same format as the built-in catalog)."""
    provider_max_retries: int = Field(default=2, ge=0)
    """Retries of a failed provider request, done by the provider's SDK (with its backoff)."""
    provider_timeout_seconds: float = Field(default=600.0, gt=0)
    """Timeout of one provider request, as the provider's SDK applies it."""
    log_format: Literal["auto", "json", "text"] = "auto"
    """Log lines as JSON objects, one a line (``json``), or readable text (``text``);
    ``auto``: JSON unless stderr is a terminal (docs/observability.md)."""
    metrics: bool = True
    """Serve Prometheus metrics at ``/metrics``, without authentication: keep that path to
    the private network (docs/observability.md)."""
    tracing: Literal["off", "otlp", "console", "global"] = "off"
    """OpenTelemetry spans of runs, steps, model and tool calls (the ``otel`` extra):
    ``otlp`` exports them as the ``OTEL_EXPORTER_OTLP_*`` variables say, ``console`` prints
    them, ``global`` hands them to the global tracer provider the program set up."""
    secret_key: str | None = None
    """Signs chat access cookies; default: a random key kept in the database, so every
    process that shares it accepts the cookies any of them set."""

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """From the environment, with the ``overrides`` that are not None on top (command
        flags). A bad value is a ``ConfigError``: one line per value, naming its variable."""
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        except ValidationError as exc:
            raise ConfigError(
                "\n".join(
                    f"AGENTSTREAM_{str(error['loc'][0]).upper()}: {message_of(error)}"
                    f" (got {error['input']!r})"
                    for error in exc.errors()
                )
            ) from None

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxy_networks(cls, value: object) -> object:
        """Each entry an address or a network (``10.0.0.0/8``), written as uvicorn reads it."""
        value = _comma_separated(value)
        if isinstance(value, list):
            return [str(ip_network(str(entry), strict=False)) for entry in value]
        return value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value: object) -> object:
        """Each entry ``*`` or an origin as a browser sends it: ``scheme://host[:port]``."""
        value = _comma_separated(value)
        for entry in value if isinstance(value, list) else ():
            if entry != "*" and not re.fullmatch(r"https?://[^/?#\s]+", str(entry)):
                raise ValueError(f"{entry!r} is not an origin: write scheme://host[:port], no path")
        return value

    @field_validator("database_url")
    @classmethod
    def _async_driver(cls, value: str | None) -> str | None:
        """The async driver for a URL that names none: what people write just works."""
        if value is None:
            return None
        scheme, sep, rest = value.partition("://")
        return f"{_ASYNC_DRIVERS.get(scheme.lower(), scheme)}{sep}{rest}"

    @field_validator("redis_url")
    @classmethod
    def _shared_database(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Processes that share a live log must share a database: SQLite is one process's."""
        if value is None:
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("expected a redis://, rediss:// or unix:// URL")
        database = info.data.get("database_url")
        if database is None or not database.startswith("postgresql"):
            raise ValueError(
                "cluster mode needs a PostgreSQL database: set AGENTSTREAM_DATABASE_URL too"
            )
        return value

    @field_validator("workers")
    @classmethod
    def _workers_share(cls, value: int, info: ValidationInfo) -> int:
        if value > 1 and info.data.get("redis_url") is None:
            raise ValueError(
                "several workers are cluster mode: set AGENTSTREAM_DATABASE_URL (PostgreSQL)"
                " and AGENTSTREAM_REDIS_URL"
            )
        return value

    @property
    def cluster(self) -> bool:
        """Several processes may serve these runs (PostgreSQL and Redis)."""
        return self.redis_url is not None

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{self.data_dir / 'agentstream.db'}"

    @property
    def token_delay(self) -> float:
        if self.offline_token_delay is not None:
            return self.offline_token_delay
        return 0.02 if self.demo else 0.0

    @property
    def demo_key_file(self) -> Path:
        return self.data_dir / "demo-key"

    @property
    def secret_key_file(self) -> Path:
        """Where versions before the key moved into the database kept it: adopted from
        there at the first start, so the cookies they set stay valid."""
        return self.data_dir / "secret-key"


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, from the first byte, in a private directory."""
    private_directory(path.parent)
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC), "w") as file:
        file.write(text + "\n")


def _comma_separated(value: object) -> object:
    """A list setting as the environment writes it, ``a, b``, as a list; else as it is."""
    if isinstance(value, str):
        return [entry.strip() for entry in value.split(",") if entry.strip()]
    return value
