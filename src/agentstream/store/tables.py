"""The database schema, as SQLAlchemy 2 declarative tables."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "AgentRow",
    "ApiKeyRow",
    "ApprovalRow",
    "Base",
    "ChatCodeRow",
    "ChunkRow",
    "ConsoleSessionRow",
    "ContextHandlerRow",
    "DefinitionsRevisionRow",
    "DeploymentRow",
    "DocumentRow",
    "KnowledgeBaseRow",
    "MessageRow",
    "RunEventRow",
    "RunRow",
    "ServerProcessRow",
    "ServerSecretRow",
    "SessionRow",
    "WorkflowRow",
    "digest",
]


def digest(secret: str) -> str:
    """What is kept of a secret (an API key, a console session, a sign-in code): its
    SHA-256, in hex, never the secret itself."""
    return hashlib.sha256(secret.encode()).hexdigest()


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    """SHA-256 of the key: the key itself is never stored."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class DefinitionsRevisionRow(Base):
    """One row: a counter that triggers move on at every change to ``api_keys``, ``agents``
    and ``chat_deployments``, whoever makes it (migration 0014)."""

    __tablename__ = "definitions_revision"

    id: Mapped[int] = mapped_column(primary_key=True)
    revision: Mapped[int] = mapped_column(BigInteger)


class ConsoleSessionRow(Base):
    """A browser signed in to the console with an API key; ends with the key."""

    __tablename__ = "console_sessions"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Of the session cookie (``digest``): the cookie itself is never stored."""
    key_digest: Mapped[str] = mapped_column(
        ForeignKey("api_keys.digest", ondelete="CASCADE"), index=True
    )
    """The key's digest, not its id: an id can be given again to a later key (SQLite
    reuses the highest), a digest cannot."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[float] = mapped_column(Float, index=True)
    """Seconds since the epoch."""


class AgentRow(Base):
    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    """Bumped on every change, so a deployment can pin what it was made from."""
    spec: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SessionRow(Base):
    __tablename__ = "sessions"
    __table_args__ = (Index("ix_sessions_listing", "created_at", "id"),)  # newest first

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(100), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class MessageRow(Base):
    """The conversation memory: final-turn text, tool calls and tool results, never preamble."""

    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"), index=True
    )
    run_id: Mapped[str] = mapped_column(String(40))
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    tool_calls: Mapped[list[Any]] = mapped_column()
    tool_call_id: Mapped[str | None] = mapped_column(String(100))
    provider_state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """What the provider needs replayed (e.g. signed thinking blocks), for the next run."""


_LIVE_RUN = text("status IN ('running', 'awaiting_approval')")
"""A conversation has at most one of these at a time, whichever process started it."""


class ServerProcessRow(Base):
    """A serving process and its lease: while ``lease_until`` (seconds since the epoch) is
    ahead, its runs are its own; once it has passed, any process ends them."""

    __tablename__ = "server_processes"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    address: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    lease_until: Mapped[float] = mapped_column(Float, index=True)


class RunRow(Base):
    """One run of a program: an agent run (``run_…``) or a workflow execution (``wfx_…``).

    The columns of one kind are null on the other's rows. No foreign key to ``workflows``:
    a draft's definition was never saved, and executions outlive a deleted workflow;
    ``definition`` is the snapshot that ran."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    kind: Mapped[str] = mapped_column(String(10))
    """``agent`` or ``workflow``."""
    status: Mapped[str] = mapped_column(String(20), index=True)
    input: Mapped[Any] = mapped_column(JSON, nullable=True)
    """An agent's message (a string), or the workflow's start input (any JSON)."""
    content: Mapped[str | None] = mapped_column(Text)
    """An agent's answer."""
    result: Mapped[Any] = mapped_column(JSON, nullable=True)
    """A workflow's result."""
    error: Mapped[str | None] = mapped_column(Text)
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    agent_id: Mapped[str | None] = mapped_column(String(100), index=True)
    agent_version: Mapped[int | None] = mapped_column(Integer)
    session_id: Mapped[str | None] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"), index=True
    )
    paused_state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """While awaiting approval: what the run needs to continue (agent, messages, step)."""
    reasoning_requested: Mapped[bool | None] = mapped_column(Boolean)

    workflow_id: Mapped[str | None] = mapped_column(String(100), index=True)
    workflow_version: Mapped[int | None] = mapped_column(Integer)
    """The saved version that ran; None for a draft."""
    draft: Mapped[bool | None] = mapped_column(Boolean)
    definition: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    owner: Mapped[str | None] = mapped_column(String(40), index=True)
    """The process that runs it, or last ran it (``ServerProcessRow``)."""
    parent_run_id: Mapped[str | None] = mapped_column(String(40), index=True)
    """The run that started it: a coordinator run for its entities' runs, an execution for
    its orchestration blocks' runs. No foreign key: a run outlives its parent's deletion."""

    __table_args__ = (
        Index("ix_runs_listing", "kind", "created_at", "id"),  # newest first (``paging``)
        Index(
            "runs_one_live_per_session",
            "session_id",
            unique=True,
            sqlite_where=_LIVE_RUN,
            postgresql_where=_LIVE_RUN,
        ),
    )


class RunEventRow(Base):
    """A persisted event of a run of either kind (never a token delta)."""

    __tablename__ = "run_events"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(40))
    ts: Mapped[float] = mapped_column(Float)
    payload: Mapped[dict[str, Any]] = mapped_column()


class DeploymentRow(Base):
    """A chat deployment with the snapshot of the agent or workflow it serves."""

    __tablename__ = "chat_deployments"

    slug: Mapped[str] = mapped_column(String(63), primary_key=True)
    settings: Mapped[dict[str, Any]] = mapped_column()
    password_hash: Mapped[str | None] = mapped_column(String(200))
    agent_spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """The agent as it was when deployed: later edits need a redeploy."""
    agent_version: Mapped[int | None] = mapped_column(Integer)
    workflow_definition: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Or the workflow as it was when deployed."""
    workflow_version: Mapped[int | None] = mapped_column(Integer)
    entities: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """An orchestration's entity agents as they were when deployed: {id: {spec, version}}."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ChatCodeRow(Base):
    """A one-time code mailed to an address invited to a chat, kept as its digest until it
    is redeemed, expires or runs out of tries: any process redeems what any process sent."""

    __tablename__ = "chat_codes"

    slug: Mapped[str] = mapped_column(String(63), primary_key=True)
    email: Mapped[str] = mapped_column(String(320), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    """SHA-256 of the code: the code itself is never stored."""
    expires_at: Mapped[float] = mapped_column(Float, index=True)
    """Seconds since the epoch, like ``lease_until``."""
    tries_left: Mapped[int] = mapped_column(Integer)


class ServerSecretRow(Base):
    """A secret every process over this database uses alike (the key that signs chat
    cookies), made by whichever process needed it first."""

    __tablename__ = "server_secrets"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ApprovalRow(Base):
    """A tool call that waited for a person's decision, and the decision."""

    __tablename__ = "approvals"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    call_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    tool_name: Mapped[str] = mapped_column(String(100))
    tool_input: Mapped[dict[str, Any]] = mapped_column()
    decision: Mapped[str] = mapped_column(String(10))
    """pending, approved or denied."""
    reason: Mapped[str | None] = mapped_column(Text)
    decided_by: Mapped[str | None] = mapped_column(String(200))
    requested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class KnowledgeBaseRow(Base):
    __tablename__ = "knowledge_bases"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text)
    embedding_model: Mapped[str] = mapped_column(String(100))
    """The model its vectors come from: a query must be embedded by the same one."""
    dimensions: Mapped[int] = mapped_column(Integer)
    revision: Mapped[int] = mapped_column(Integer)
    """Bumped by every change to its chunks, so a process knows its cached vectors are stale."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class DocumentRow(Base):
    __tablename__ = "kb_documents"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    knowledge_base_id: Mapped[str] = mapped_column(
        ForeignKey("knowledge_bases.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(300))
    media_type: Mapped[str] = mapped_column(String(100))
    characters: Mapped[int] = mapped_column(Integer)
    chunk_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ChunkRow(Base):
    """A passage of a document with its embedding (float32, unit length).

    Its text is also indexed for full-text search, outside this model because the two
    databases differ (migration 0010): the FTS5 table ``kb_chunks_fts`` on SQLite, the
    generated column ``search_vector`` on PostgreSQL.
    """

    __tablename__ = "kb_chunks"

    id: Mapped[int] = mapped_column(primary_key=True)
    knowledge_base_id: Mapped[str] = mapped_column(
        ForeignKey("knowledge_bases.id", ondelete="CASCADE"), index=True
    )
    document_id: Mapped[str] = mapped_column(
        ForeignKey("kb_documents.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(Integer)
    start: Mapped[int] = mapped_column(Integer)
    end: Mapped[int] = mapped_column(Integer)
    page: Mapped[int | None] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary)
    """None when stored without the ``embeddings`` extra; computed at its base's next search
    with it."""


class ContextHandlerRow(Base):
    """What a knowledge search retrieved during a run: the citations of its answer."""

    __tablename__ = "context_handlers"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    call_id: Mapped[str] = mapped_column(String(100))
    query: Mapped[str] = mapped_column(Text)
    citations: Mapped[list[Any]] = mapped_column()
    """The passages as retrieved (a copy: deleting a document later does not change them)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class WorkflowRow(Base):
    """A saved workflow definition; ``version`` goes up with each change."""

    __tablename__ = "workflows"

    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    definition: Mapped[dict[str, Any]] = mapped_column()
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
