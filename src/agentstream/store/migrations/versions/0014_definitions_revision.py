"""definitions_revision

``definitions_revision``: one row, one counter, which every change to an API key, an agent
or a chat deployment moves on, by triggers in the database itself: whoever makes the
change (this server, another process of a cluster, the ``agentstream keys`` commands, a
person with a SQL shell; not a restore with triggers disabled) moves it in the same
transaction. A process keeps what it looked up of those tables for as long as the counter
stays where it was (``agentstream.store.definitions_cache``).

A later migration that rebuilds one of these tables on SQLite (``batch_alter_table``
copies a table and drops the old one) drops its triggers with it: it must create them
again (``create_triggers``).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 10:00:00.000000
"""

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("api_keys", "agents", "chat_deployments")
_CHANGES = ("INSERT", "UPDATE", "DELETE")
_MOVE_ON = "UPDATE definitions_revision SET revision = revision + 1"


def create_triggers(table: str) -> None:
    """The triggers that move the counter on at every change to ``table``.

    For each row changed, not each statement: a save that changes nothing (an ``INSERT ...
    ON CONFLICT DO NOTHING`` that finds the row) then takes no lock on the counter, so a
    save, like a delete, locks the definition's row before the counter, and the two cannot
    deadlock. On PostgreSQL, ``TRUNCATE`` (which changes no row one by one) has a trigger
    of its own."""
    if op.get_bind().dialect.name == "sqlite":
        for change in _CHANGES:  # SQLite's triggers each take one kind of change
            op.execute(
                f"CREATE TRIGGER {table}_{change.lower()}_revises AFTER {change} ON {table} "
                f"BEGIN {_MOVE_ON}; END"
            )
    else:
        op.execute(
            f"CREATE TRIGGER {table}_revises AFTER {' OR '.join(_CHANGES)} ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION definitions_revised()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_truncate_revises AFTER TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION definitions_revised()"
        )


def upgrade() -> None:
    revisions = op.create_table(
        "definitions_revision",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("revision", sa.BigInteger(), nullable=False),
    )
    # From a random value: a counter made again (a downgrade, then an upgrade) never comes
    # back to a revision that a running process keeps what it looked up under.
    op.bulk_insert(revisions, [{"id": 1, "revision": secrets.randbits(62)}])
    if op.get_bind().dialect.name != "sqlite":
        op.execute(
            "CREATE FUNCTION definitions_revised() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN {_MOVE_ON}; RETURN NULL; END $$"
        )
    for table in TABLES:
        create_triggers(table)


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table in TABLES:
        if sqlite:
            for change in _CHANGES:
                op.execute(f"DROP TRIGGER {table}_{change.lower()}_revises")
        else:
            op.execute(f"DROP TRIGGER {table}_revises ON {table}")
            op.execute(f"DROP TRIGGER {table}_truncate_revises ON {table}")
    if not sqlite:
        op.execute("DROP FUNCTION definitions_revised()")
    op.drop_table("definitions_revision")
