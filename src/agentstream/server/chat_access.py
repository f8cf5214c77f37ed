"""Who may chat with a deployment: password, email one-time codes, API key, or anyone.

A successful password or code earns a signed cookie scoped to the deployment, so the
page does not ask again. Password and code guesses are limited per client and deployment,
and so are runs (``rate_limits``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agentstream.server.rate_limits import InFlight, WindowLimiter, per_minute

__all__ = [
    "CODES_SENT",
    "DEPLOYMENT_GUESSES",
    "GUESSES",
    "ChatAccess",
    "CodeBook",
    "EmailSender",
    "SessionSigner",
    "log_code",
]

logger = logging.getLogger("agentstream.chat")

EmailSender = Callable[[str, str, str], Awaitable[None]]
"""``await send(to, subject, body)``."""


async def log_code(to: str, subject: str, body: str) -> None:
    """The sender when no mail server is configured: the code goes to the server log."""
    logger.warning("No SMTP configured; would send to %s: %s: %s", to, subject, body)


@dataclass(slots=True)
class _Code:
    digest: str
    expires: float
    tries_left: int


@dataclass
class CodeBook:
    """One-time codes for allowed email addresses: valid for ``ttl`` seconds and a few
    tries; a new code replaces the last one for the same address."""

    ttl: float = 10 * 60
    tries: int = 5
    _codes: dict[tuple[str, str], _Code] = field(default_factory=dict)

    def issue(self, slug: str, email: str) -> str:
        now = time.monotonic()
        for key in [k for k, c in self._codes.items() if c.expires < now]:
            del self._codes[key]
        code = f"{secrets.randbelow(10**6):06d}"
        self._codes[slug, email] = _Code(_digest(code), now + self.ttl, self.tries)
        return code

    def redeem(self, slug: str, email: str, code: str) -> bool:
        issued = self._codes.get((slug, email))
        if issued is None or issued.expires < time.monotonic():
            return False
        if hmac.compare_digest(issued.digest, _digest(code.strip())):
            del self._codes[slug, email]
            return True
        issued.tries_left -= 1
        if issued.tries_left <= 0:
            del self._codes[slug, email]
        return False


_TOKEN = re.compile(r"([A-Za-z0-9_-]*={0,2})\.([0-9]{1,12})\.([0-9a-f]{64})", re.ASCII)
"""``base64(identity).expires.hmac``: an expiry in seconds since the epoch, a SHA-256 MAC."""


class SessionSigner:
    """Signed, expiring proof that a client passed a deployment's access check.

    ``identity`` (the email, or "") travels in the token; ``binding`` (e.g. the password
    hash) does not, but is signed, so changing the password logs everyone out.
    """

    def __init__(self, secret: bytes, *, max_age: float = 7 * 24 * 3600) -> None:
        self._secret = secret
        self.max_age = max_age

    def sign(self, slug: str, *, identity: str, binding: str) -> str:
        expires = str(int(time.time() + self.max_age))
        encoded = base64.urlsafe_b64encode(identity.encode()).decode()
        return f"{encoded}.{expires}.{self._mac(slug, identity, binding, expires)}"

    def verify(self, token: str, slug: str, *, binding: str) -> str | None:
        """The identity the token was signed for, or None if it is not valid here. Any
        string may arrive as a cookie: one that is not a token of ours is simply no token."""
        parts = _TOKEN.fullmatch(token)
        if parts is None:
            return None
        encoded, expires, mac = parts.groups()
        if int(expires) < time.time():
            return None
        try:
            identity = base64.urlsafe_b64decode(encoded).decode()
        except ValueError:  # binascii.Error and UnicodeDecodeError both are
            return None
        if not hmac.compare_digest(mac, self._mac(slug, identity, binding, expires)):
            return None
        return identity

    def _mac(self, slug: str, identity: str, binding: str, expires: str) -> str:
        message = "\n".join((slug, identity, binding, expires)).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()


GUESSES = per_minute(10, 15, name="guesses")
"""Password and code guesses, per client and deployment (the spec's 10 per 15 min)."""
DEPLOYMENT_GUESSES = per_minute(200, 15, name="deployment-guesses")
"""All guesses at one deployment, whoever makes them: a brake on distributed guessing."""
CODES_SENT = per_minute(5, 15, name="codes-sent")
"""Codes mailed, per address and per client: no mail bombing."""


@dataclass(frozen=True)
class ChatAccess:
    """The access machinery the chat endpoint shares across requests: who may chat, and
    how much."""

    signer: SessionSigner
    send_email: EmailSender = log_code
    windows: WindowLimiter = field(default_factory=WindowLimiter)
    """Guesses, codes mailed and runs started, per window (see the limits above)."""
    in_flight: InFlight = field(default_factory=InFlight)
    """Runs going now, per client and per deployment."""
    codes: CodeBook = field(default_factory=CodeBook)


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()
