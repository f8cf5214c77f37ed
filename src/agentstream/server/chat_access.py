"""Who may chat with a deployment: password, email one-time codes, API key, or anyone.

A successful password or code earns a signed cookie scoped to the deployment, so the
page does not ask again. Password and code guesses are limited per client and deployment,
and so are runs (``rate_limits``).

Every process of a cluster sees the same of each: the codes and the cookie key are in the
database, the windows in Redis (``open_chat_access``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from agentstream.config import Settings
from agentstream.server.rate_limits import InFlight, WindowLimiter, per_minute, window_storage
from agentstream.store.codes import CodeStore
from agentstream.store.database import Database
from agentstream.store.server_secrets import ServerSecrets
from agentstream.store.tables import digest

__all__ = [
    "CODES_SENT",
    "DEPLOYMENT_GUESSES",
    "GUESSES",
    "ChatAccess",
    "CodeBook",
    "EmailSender",
    "SessionSigner",
    "log_code",
    "open_chat_access",
]

logger = logging.getLogger("agentstream.chat")

EmailSender = Callable[[str, str, str], Awaitable[None]]
"""``await send(to, subject, body)``."""


async def log_code(to: str, subject: str, body: str) -> None:
    """The sender when no mail server is configured: the code goes to the server log."""
    logger.warning("No SMTP configured; would send to %s: %s: %s", to, subject, body)


@dataclass(frozen=True)
class CodeBook:
    """One-time codes for allowed email addresses: valid for ``ttl`` seconds and a few
    tries; a new code replaces the last one for the same address. Kept (as digests) in
    the database, so a code works on any process, once."""

    store: CodeStore
    ttl: float = 10 * 60
    tries: int = 5

    async def issue(self, slug: str, email: str) -> str:
        code = f"{secrets.randbelow(10**6):06d}"
        await self.store.put(slug, email, digest(code), ttl=self.ttl, tries=self.tries)
        return code

    async def redeem(self, slug: str, email: str, code: str) -> bool:
        return await self.store.redeem(slug, email, digest(code.strip()))


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
    codes: CodeBook
    windows: WindowLimiter
    """Guesses, codes mailed and runs started, per window (see the limits above)."""
    send_email: EmailSender = log_code
    in_flight: InFlight = field(default_factory=InFlight)
    """Runs going now, per client and per deployment."""


_COOKIE_KEY = "chat-cookie-key"
"""The name of the generated cookie key among the ``ServerSecrets``."""


@asynccontextmanager
async def open_chat_access(
    settings: Settings, db: Database, send_email: EmailSender = log_code
) -> AsyncIterator[ChatAccess]:
    """The chat access of a server over ``db``, the same in every process that shares the
    database (and, for the windows, the Redis of ``settings``); its Redis connections are
    closed when the block ends."""
    key = settings.secret_key or await ServerSecrets(db).get_or_create(
        _COOKIE_KEY, _adopted_or_new_key(settings)
    )
    async with window_storage(settings.redis_url, f"{settings.redis_prefix}:limits") as storage:
        yield ChatAccess(
            signer=SessionSigner(key.encode()),
            codes=CodeBook(CodeStore(db)),
            windows=WindowLimiter(storage),
            send_email=send_email,
        )


def _adopted_or_new_key(settings: Settings) -> str:
    """The key the data directory's ``secret-key`` file holds (where versions before the
    database kept it, so their cookies stay valid), or a new random one."""
    path = settings.secret_key_file
    kept = path.read_text().strip() if path.is_file() else ""
    return kept or secrets.token_urlsafe(32)
