"""Chat deployments: an agent published at ``/api/chat/{slug}`` with its own access rules.

A deployment pins a snapshot of the agent: editing the agent changes nothing here until
the deployment is updated or redeployed, as the spec requires.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StringConstraints, field_validator

__all__ = [
    "Access",
    "DeploymentCreate",
    "DeploymentSettings",
    "DeploymentUpdate",
    "email_allowed",
    "hash_password",
    "normalize_email",
    "reject_null",
    "verify_password",
]

Access = Literal["public", "password", "email", "api_key"]
Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
OutputName = Literal["content", "toolCalls", "usage"]


def reject_null(value: object) -> object:
    """For partial updates: leave a field out to keep it; null is not a value."""
    if value is None:
        raise ValueError("may not be null; leave the field out to keep its value")
    return value


class DeploymentUpdate(BaseModel):
    """The editable settings; every field optional for partial updates."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    _not_null = field_validator("*", mode="before")(reject_null)

    agent_id: str | None = None
    title: str | None = Field(default=None, max_length=200)
    greeting: str | None = Field(default=None, max_length=2_000)
    include_thinking: bool | None = Field(
        default=None, validation_alias=AliasChoices("include_thinking", "includeThinking")
    )
    include_tool_calls: bool | None = Field(
        default=None, validation_alias=AliasChoices("include_tool_calls", "includeToolCalls")
    )
    outputs: list[OutputName] | None = None
    access: Access | None = None
    password: str | None = Field(default=None, min_length=8, max_length=200)
    """Write-only: stored as a scrypt hash."""
    allowed_emails: list[str] | None = None
    redact_pii: bool | None = None


class DeploymentSettings(BaseModel):
    """A deployment as stored and shown (never with its password)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    slug: Slug
    agent_id: str
    title: str = Field(default="", max_length=200)
    greeting: str = Field(default="", max_length=2_000)
    include_thinking: bool = Field(
        default=False, validation_alias=AliasChoices("include_thinking", "includeThinking")
    )
    """Thinking frames, for clients that send the protocol header."""
    include_tool_calls: bool = Field(
        default=False, validation_alias=AliasChoices("include_tool_calls", "includeToolCalls")
    )
    """Tool lifecycle frames (name and status), for clients that send the protocol header."""
    outputs: list[OutputName] = ["content", "toolCalls"]
    """What the final envelope's ``output`` holds."""
    access: Access = "public"
    allowed_emails: list[str] = Field(default_factory=list)
    """Addresses (``jane@example.com``) or whole domains (``@example.com``)."""
    redact_pii: bool = False
    """Mask emails, phones, card numbers, IBANs and IPs; answer text is then sent settled."""

    def updated(self, update: DeploymentUpdate) -> DeploymentSettings:
        """These settings with the update applied, validated as a whole."""
        changes = update.model_dump(exclude_unset=True, exclude={"password"})
        return DeploymentSettings.model_validate({**self.model_dump(), **changes})


class DeploymentCreate(DeploymentSettings):
    password: str | None = Field(default=None, min_length=8, max_length=200)


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1)
    return f"scrypt${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    _, salt, digest = stored.split("$")
    candidate = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), n=2**14, r=8, p=1)
    return hmac.compare_digest(candidate.hex(), digest)


_EMAIL = re.compile(r"[a-z0-9._+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)+")


def normalize_email(email: str) -> str | None:
    """The address in lower case, or None unless it is one plain ``local@domain`` address
    (no second ``@``, no ``%`` routing, no spaces or control characters)."""
    email = email.strip().lower()
    return email if _EMAIL.fullmatch(email) else None


def email_allowed(email: str, allowed: list[str]) -> bool:
    """Whether a normalised address is invited, by itself or by its ``@domain``."""
    domain = "@" + email.partition("@")[2]
    return any(entry.strip().lower() in (email, domain) for entry in allowed)
