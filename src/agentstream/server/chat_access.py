"""Who may chat with a deployment: password, email one-time codes, API key, or anyone.

A successful password or code earns a signed cookie scoped to the deployment, so the
page does not ask again. Password and code guesses are limited per client and deployment.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["ChatAccess", "CodeBook", "EmailSender", "GuessLimiter", "SessionSigner", "log_code"]

logger = logging.getLogger("agentstream.chat")

EmailSender = Callable[[str, str, str], Awaitable[None]]
"""``await send(to, subject, body)``."""


async def log_code(to: str, subject: str, body: str) -> None:
    """The sender when no mail server is configured: the code goes to the server log."""
    logger.warning("No SMTP configured; would send to %s: %s: %s", to, subject, body)


class GuessLimiter:
    """At most ``limit`` guesses per key in any ``window`` seconds (a sliding window).

    Keys whose window has passed are swept out now and then, so memory stays bounded by
    the guesses of the last window.
    """

    def __init__(self, *, limit: int, window: float = 15 * 60) -> None:
        self.limit = limit
        self.window = window
        self._guesses: dict[tuple[str, ...], deque[float]] = {}
        self._next_sweep = 0.0

    def retry_after(self, *key: str) -> float:
        """Seconds until the next guess is allowed; 0 if it is allowed now (and counted)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        guesses = self._guesses.setdefault(key, deque())
        while guesses and guesses[0] <= now - self.window:
            guesses.popleft()
        if len(guesses) >= self.limit:
            return guesses[0] + self.window - now
        guesses.append(now)
        return 0.0

    def _sweep(self, now: float) -> None:
        stale = [k for k, g in self._guesses.items() if not g or g[-1] <= now - self.window]
        for key in stale:
            del self._guesses[key]
        self._next_sweep = now + self.window / 10


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


@dataclass(frozen=True)
class ChatAccess:
    """The access machinery the chat endpoint shares across requests."""

    signer: SessionSigner
    send_email: EmailSender = log_code
    guesses: GuessLimiter = field(default_factory=lambda: GuessLimiter(limit=10))
    """Password and code guesses, per client and deployment (the spec's 10 per 15 min)."""
    deployment_guesses: GuessLimiter = field(default_factory=lambda: GuessLimiter(limit=200))
    """All guesses at one deployment, whoever makes them: a brake on distributed guessing."""
    codes_sent: GuessLimiter = field(default_factory=lambda: GuessLimiter(limit=5))
    """Codes mailed, per address and per client: no mail bombing."""
    codes: CodeBook = field(default_factory=CodeBook)


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()
