"""Chat deployments: an agent or a workflow published at ``/api/chat/{slug}`` with its own
access rules.

A deployment pins a snapshot of what it serves: editing the agent (or workflow) changes
nothing here until the deployment is updated or redeployed, as the spec requires.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from agentstream.errors import UserError
from agentstream.inputs import InputModel, message_of

__all__ = [
    "Access",
    "DeploymentCreate",
    "DeploymentSettings",
    "DeploymentUpdate",
    "email_allowed",
    "hash_password",
    "image_origin",
    "normalize_email",
    "reject_null",
    "verify_password",
]

Access = Literal["public", "password", "email", "api_key"]
Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
OutputName = Literal["content", "toolCalls", "usage"]
AccentColor = Annotated[str, StringConstraints(pattern=r"^#[0-9a-fA-F]{6}$")]
"""A colour as ``#rrggbb``."""
Prompt = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Origin = Annotated[str, StringConstraints(pattern=r"^https?://[^/?#\s]+$", max_length=300)]
"""A site's origin as a browser sends it: ``scheme://host[:port]``."""
_HTTPS_IMAGE = re.compile(
    r"https://(?P<origin>[A-Za-z0-9.-]+(:[0-9]{1,5})?)(/[!#-&(-;=?-\[\]-~]*)?"
)
"""Printable ASCII, no quotes, angle brackets or backslashes; no user or password."""
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml);base64,[A-Za-z0-9+/]+=*")


def _image_url(value: str) -> str:
    if not (_HTTPS_IMAGE.fullmatch(value) or _DATA_IMAGE.fullmatch(value)):
        raise ValueError(
            "must be an https:// URL (ASCII, no user or password) or a base64 data: URL of "
            "a PNG, JPEG, GIF, WebP or SVG image"
        )
    return value


LogoUrl = Annotated[str, StringConstraints(max_length=200_000), AfterValidator(_image_url)]
"""An image: an ``https://`` URL (the page's policy then admits its origin for images), or
a ``data:`` URL of a PNG, JPEG, GIF, WebP or SVG image, base64, up to about 150 KB."""


def image_origin(url: str) -> str | None:
    """The origin an ``https://`` image comes from, for a page's ``img-src``; None for a
    ``data:`` URL (which ``img-src`` admits already)."""
    found = _HTTPS_IMAGE.fullmatch(url)
    return None if found is None else f"https://{found['origin']}"


def reject_null(value: object) -> object:
    """For partial updates: leave a field out to keep it; null is not a value."""
    if value is None:
        raise ValueError("may not be null; leave the field out to keep its value")
    return value


class DeploymentUpdate(InputModel):
    """The editable settings; every field optional for partial updates."""

    model_config = ConfigDict(
        populate_by_name=True,
        json_schema_extra={
            "examples": [{"title": "Ask us", "include_thinking": True, "include_tool_calls": True}]
        },
    )

    _not_null = field_validator("*", mode="before")(reject_null)

    agent_id: str | None = None
    workflow_id: str | None = None
    output_blocks: list[str] | None = None
    title: str | None = Field(default=None, max_length=200)
    greeting: str | None = Field(default=None, max_length=2_000)
    accent_color: AccentColor | None = None
    logo_url: LogoUrl | None = None
    suggested_prompts: list[Prompt] | None = Field(default=None, max_length=6)
    embed_origins: list[Origin] | None = Field(default=None, max_length=50)
    include_thinking: bool | None = Field(
        default=None, validation_alias=AliasChoices("include_thinking", "includeThinking")
    )
    include_tool_calls: bool | None = Field(
        default=None, validation_alias=AliasChoices("include_tool_calls", "includeToolCalls")
    )
    include_citations: bool | None = Field(
        default=None, validation_alias=AliasChoices("include_citations", "includeCitations")
    )
    outputs: list[OutputName] | None = None
    access: Access | None = None
    password: str | None = Field(default=None, min_length=8, max_length=200)
    """Write-only: stored as a scrypt hash."""
    allowed_emails: list[str] | None = None
    redact_pii: bool | None = None
    concurrent_runs_per_client: int | None = None
    concurrent_runs: int | None = None
    runs_per_minute_per_client: int | None = None


class DeploymentSettings(InputModel):
    """A deployment as stored and shown (never with its password)."""

    model_config = ConfigDict(populate_by_name=True)

    slug: Slug
    agent_id: str | None = None
    """The agent this deployment serves; or ``workflow_id``, not both."""
    workflow_id: str | None = Field(default=None, validate_default=True)
    """The workflow this deployment serves; ``output_blocks`` say which blocks answer."""
    output_blocks: list[str] = Field(default_factory=list, validate_default=True)
    """For a workflow: the blocks whose output is the answer, in this order."""
    title: str = Field(default="", max_length=200)
    greeting: str = Field(default="", max_length=2_000)
    accent_color: AccentColor = "#0a84ff"
    """The hosted page's colour: buttons, the user's messages."""
    logo_url: LogoUrl | None = None
    """Shown beside the title on the hosted page; none by default."""
    suggested_prompts: list[Prompt] = Field(default_factory=list, max_length=6)
    """Offered on the hosted page before the first message, to send with a click."""
    embed_origins: list[Origin] = Field(default_factory=list, max_length=50)
    """Sites that may show the hosted page in their own (``widget.js``); none by default."""
    include_thinking: bool = Field(
        default=False, validation_alias=AliasChoices("include_thinking", "includeThinking")
    )
    """Thinking frames, for clients that send the protocol header."""
    include_tool_calls: bool = Field(
        default=False, validation_alias=AliasChoices("include_tool_calls", "includeToolCalls")
    )
    """Tool lifecycle frames (name and status), for clients that send the protocol header."""
    include_citations: bool = Field(
        default=False, validation_alias=AliasChoices("include_citations", "includeCitations")
    )
    """The passages an answer cites (document, page, an excerpt), for the hosted page's
    source cards: never a tool's arguments."""
    outputs: list[OutputName] = Field(default=["content", "toolCalls"])
    """What the final envelope's ``output`` holds."""
    access: Access = "public"
    allowed_emails: list[str] = Field(default_factory=list)
    """Addresses (``jane@example.com``) or whole domains (``@example.com``)."""
    redact_pii: bool = False
    """Mask emails, phones, card numbers, IBANs and IPs; answer text is then sent settled."""
    concurrent_runs_per_client: int = Field(default=4, ge=1, le=1_000)
    """Answers one client may have coming at once; the next message gets 429."""
    concurrent_runs: int = Field(default=100, ge=1, le=100_000)
    """Answers coming at once from the whole deployment, all clients together."""
    runs_per_minute_per_client: int = Field(default=30, ge=1, le=10_000)
    """Messages one client may send in any minute."""

    @field_validator("workflow_id")
    @classmethod
    def _one_target(cls, workflow_id: str | None, info: ValidationInfo) -> str | None:
        if "agent_id" in info.data and (info.data["agent_id"] is None) == (workflow_id is None):
            raise ValueError("give agent_id or workflow_id, one of them")
        return workflow_id

    @field_validator("output_blocks")
    @classmethod
    def _blocks_of_a_workflow(cls, blocks: list[str], info: ValidationInfo) -> list[str]:
        if "workflow_id" not in info.data:
            return blocks  # the target is already refused
        if info.data["workflow_id"] is not None and not blocks:
            raise ValueError("a workflow deployment names its output_blocks, the answer")
        if info.data["workflow_id"] is None and blocks:
            raise ValueError("output_blocks are for workflow deployments")
        return blocks

    def updated(self, update: DeploymentUpdate) -> DeploymentSettings:
        """These settings with the update applied, validated as a whole by the same rules
        as a new deployment (``UserError`` naming the field). Naming a new target replaces
        the old one."""
        changes = update.model_dump(exclude_unset=True, exclude={"password"})
        current = self.model_dump()
        if "agent_id" in changes:
            current.update(workflow_id=None, output_blocks=[])
        if "workflow_id" in changes:
            current.update(agent_id=None)
        try:
            return DeploymentSettings.model_validate({**current, **changes})
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            raise UserError(f"{field}: {message_of(first)}", field=field) from None


class DeploymentCreate(DeploymentSettings):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "slug": "support",
                    "agent_id": "demo",
                    "title": "Ask us",
                    "greeting": "Hi! What can I do for you?",
                    "include_thinking": True,
                    "include_tool_calls": True,
                }
            ]
        }
    )

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
