"""console_sessions

What the console needs:

- ``console_sessions``: a browser's sign-in, made by exchanging an API key for a session
  cookie; only the cookie's digest is kept. A session ends at sign-out, at its expiry, or
  with its key (revoking a key signs out every browser that used it).
- indexes for the lists, newest first: runs by kind and creation, sessions by creation.
- ``runs.parent_run_id``: the run that started a run (an orchestration's coordinator run
  for its entities' runs; a workflow execution for its orchestration blocks' coordinator
  runs), so the console links them both ways. Null for runs started by a client, and for
  every run made before this revision.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column(
            "key_digest",
            sa.String(64),
            sa.ForeignKey("api_keys.digest", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False, index=True),
    )
    with op.batch_alter_table("runs") as runs:
        runs.add_column(sa.Column("parent_run_id", sa.String(40), nullable=True))
        runs.create_index("ix_runs_parent_run_id", ["parent_run_id"])
        runs.create_index("ix_runs_listing", ["kind", "created_at", "id"])
    op.create_index("ix_sessions_listing", "sessions", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_sessions_listing", "sessions")
    with op.batch_alter_table("runs") as runs:
        runs.drop_index("ix_runs_listing")
        runs.drop_index("ix_runs_parent_run_id")
        runs.drop_column("parent_run_id")
    op.drop_table("console_sessions")
