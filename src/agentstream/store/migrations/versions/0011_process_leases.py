"""process_leases

Runs owned through leases, so that several processes can share one database:

- ``server_processes``: each serving process, with the time its lease runs out; a process
  renews it while it lives, and whoever finds it run out ends that process's runs.
- ``runs.owner``: the process that runs the run, or last ran it.
- one live run per session (``running`` or ``awaiting_approval``), held by the database, so
  two processes cannot both start a run in one conversation.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LIVE = sa.text("status IN ('running', 'awaiting_approval')")


def upgrade() -> None:
    op.create_table(
        "server_processes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_until", sa.Float(), nullable=False, index=True),
    )
    with op.batch_alter_table("runs") as runs:
        runs.add_column(sa.Column("owner", sa.String(40), nullable=True))
        runs.create_index("ix_runs_owner", ["owner"])
    op.create_index(
        "runs_one_live_per_session",
        "runs",
        ["session_id"],
        unique=True,
        sqlite_where=_LIVE,
        postgresql_where=_LIVE,
    )


def downgrade() -> None:
    op.drop_index("runs_one_live_per_session", table_name="runs")
    with op.batch_alter_table("runs") as runs:
        runs.drop_index("ix_runs_owner")
        runs.drop_column("owner")
    op.drop_table("server_processes")
