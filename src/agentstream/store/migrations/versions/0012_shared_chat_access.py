"""shared_chat_access

What chat access needs to be the same in every process that shares the database:

- ``chat_codes``: the one-time codes mailed for sign-in (their digests), so a code mailed
  by one process is redeemed on any other, once.
- ``server_secrets``: the generated key that signs chat cookies, so a cookie set by one
  process is accepted by all (before, each data directory kept its own ``secret-key``
  file; the server adopts it at its first start on this revision).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "chat_codes",
        sa.Column("slug", sa.String(63), primary_key=True),
        sa.Column("email", sa.String(320), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False, index=True),
        sa.Column("tries_left", sa.Integer(), nullable=False),
    )
    op.create_table(
        "server_secrets",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("server_secrets")
    op.drop_table("chat_codes")
