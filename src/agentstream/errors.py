"""The exceptions agentstream raises, under one root.

AgentstreamError
├── UserError            the caller asked for something invalid (HTTP 4xx)
│   ├── AccessDenied     401: credentials missing or wrong
│   ├── Forbidden        403: known, but not allowed
│   ├── NotFound         404: no such agent, run, session or deployment
│   ├── Conflict         409: valid, but not now (e.g. the session is busy)
│   ├── ModelUnavailable 503: the agent's model cannot run here (e.g. its key is not set)
│   ├── Unavailable      503: a service it needs (Redis) is away; Retry-After says when
│   │   └── ShuttingDown 503: this process is draining; another one takes new runs
│   └── TooManyAttempts  429: too many guesses; Retry-After says when to try again
├── ConfigError          the configuration is wrong: one line, naming the file and line
├── RunError             a run could not produce an answer
│   ├── MaxStepsExceeded the agent kept calling tools past its step limit
│   └── ProviderError    the model provider failed: kind, status_code, body, headers
├── ServeRefused         a server cannot start: its port is taken, or another owns its data
└── ClientError          the SDK (agentstream.client) got no usable answer
    ├── APIConnectionError   the server could not be reached, or dropped the connection
    └── APIStatusError       the server refused: status_code, message, body, headers
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "AccessDenied",
    "AgentstreamError",
    "ClientError",
    "ConfigError",
    "Conflict",
    "Forbidden",
    "MaxStepsExceeded",
    "ModelUnavailable",
    "NotFound",
    "ProviderError",
    "ProviderErrorKind",
    "RunError",
    "ServeRefused",
    "ShuttingDown",
    "TooManyAttempts",
    "Unavailable",
    "UserError",
]


class AgentstreamError(Exception):
    """Root of every agentstream exception."""


class UserError(AgentstreamError):
    """Misuse: the request, not the system, is at fault. ``field`` names the culprit."""

    status_code = 422

    code = "invalid_request"

    def __init__(
        self, message: str, *, field: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.headers = headers or {}


class NotFound(UserError):
    status_code = 404
    code = "not_found"


class AccessDenied(UserError):
    """The caller has not (yet) proved it may use this resource."""

    status_code = 401
    code = "unauthorized"


class Forbidden(UserError):
    status_code = 403
    code = "forbidden"


class TooManyAttempts(UserError):
    """Too many password or code guesses; ``Retry-After`` says when to try again."""

    status_code = 429
    code = "too_many_attempts"


class ModelUnavailable(UserError):
    """The agent's model cannot run on this server (unknown, or its key is not set)."""

    status_code = 503
    code = "model_unavailable"


class Unavailable(UserError):
    """A service the server needs is away for a moment (cluster mode's Redis): try again
    after ``Retry-After`` seconds."""

    status_code = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class ShuttingDown(Unavailable):
    """This process is stopping (SIGTERM): it finishes its runs but starts none. Another
    process of the cluster, or this one restarted, takes the request."""

    code = "shutting_down"

    def __init__(self) -> None:
        super().__init__(
            "This server is shutting down; try again (another process takes new runs)",
            retry_after=1,
        )


class Conflict(UserError):
    status_code = 409
    code = "conflict"


class ConfigError(AgentstreamError):
    """The server cannot start as configured. The message is one line for a person, with
    the file and line where there is one (``agents.yaml:12: agents[0].model: ...``)."""


class RunError(AgentstreamError):
    """A run failed; the message is what the run's ``error`` event says."""


class MaxStepsExceeded(RunError):
    pass


ProviderErrorKind = Literal[
    "rate_limit",
    "auth",
    "context_length",
    "overloaded",
    "bad_request",
    "server",
    "connection",
    "timeout",
    "bad_response",
]


class ProviderError(RunError):
    """A model provider refused or failed. ``kind`` says what to do about it:

    rate_limit (slow down), auth (fix the key), context_length (shorten the input),
    overloaded / server / connection / timeout (try again later), bad_request (fix the
    request or settings), bad_response (the stream was malformed or cut short).
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        kind: ProviderErrorKind,
        status_code: int | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.kind = kind
        self.status_code = status_code
        self.body = body
        self.headers = dict(headers or {})


class ServeRefused(AgentstreamError):
    """A server cannot start: its port is taken, or another process owns its database."""


class ClientError(AgentstreamError):
    """The Python SDK could not get a usable answer from the server."""


class APIConnectionError(ClientError):
    """The server at ``url`` could not be reached, or the connection broke mid-stream."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.message = message
        self.url = url


class APIStatusError(ClientError):
    """The server answered with an HTTP error; ``message`` is its ``error.message``."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.body = body
        """The decoded JSON error body (``{"error": {"code", "message", "field"}}``), or text."""
        self.headers = dict(headers or {})

    @property
    def code(self) -> str | None:
        """The body's ``error.code`` (e.g. ``unauthorized``, ``not_found``), if any."""
        return self._error_field("code")

    @property
    def field(self) -> str | None:
        """The body's ``error.field``: the request field at fault, if any."""
        return self._error_field("field")

    def _error_field(self, name: str) -> str | None:
        error = self.body.get("error") if isinstance(self.body, dict) else None
        value = error.get(name) if isinstance(error, dict) else None
        return value if isinstance(value, str) else None

    def __str__(self) -> str:
        return f"{self.status_code}: {self.message}"
