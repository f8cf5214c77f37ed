"""knowledge_full_text

Full-text search over knowledge chunks, in the database itself, and chunks without a
vector (stored where the ``embeddings`` extra is not installed).

- SQLite: the FTS5 table ``kb_chunks_fts`` over ``kb_chunks.text`` (external content, so
  the text is not stored twice), kept in step by triggers on ``kb_chunks``. A later
  migration that recreates ``kb_chunks`` (a batch ALTER on SQLite) drops the triggers with
  the old table and must create them again.
- PostgreSQL: the generated column ``kb_chunks.search_vector`` (``to_tsvector('english',
  text)``) with a GIN index.

Existing chunks are indexed here.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SQLITE_TRIGGERS = {
    "kb_chunks_fts_insert": """
        CREATE TRIGGER kb_chunks_fts_insert AFTER INSERT ON kb_chunks BEGIN
            INSERT INTO kb_chunks_fts (rowid, text) VALUES (new.id, new.text);
        END""",
    "kb_chunks_fts_delete": """
        CREATE TRIGGER kb_chunks_fts_delete AFTER DELETE ON kb_chunks BEGIN
            INSERT INTO kb_chunks_fts (kb_chunks_fts, rowid, text)
            VALUES ('delete', old.id, old.text);
        END""",
    "kb_chunks_fts_update": """
        CREATE TRIGGER kb_chunks_fts_update AFTER UPDATE OF text ON kb_chunks BEGIN
            INSERT INTO kb_chunks_fts (kb_chunks_fts, rowid, text)
            VALUES ('delete', old.id, old.text);
            INSERT INTO kb_chunks_fts (rowid, text) VALUES (new.id, new.text);
        END""",
}


def upgrade() -> None:
    with op.batch_alter_table("kb_chunks", schema=None) as batch_op:
        batch_op.alter_column("embedding", existing_type=sa.LargeBinary(), nullable=True)

    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE kb_chunks ADD COLUMN search_vector tsvector "
            "GENERATED ALWAYS AS (to_tsvector('english', text)) STORED"
        )
        op.execute("CREATE INDEX ix_kb_chunks_search_vector ON kb_chunks USING gin (search_vector)")
    else:
        op.execute(
            "CREATE VIRTUAL TABLE kb_chunks_fts USING fts5(text, content='kb_chunks', "
            "content_rowid='id', tokenize='porter unicode61 remove_diacritics 2')"
        )
        for statement in _SQLITE_TRIGGERS.values():
            op.execute(statement)
        op.execute("INSERT INTO kb_chunks_fts (kb_chunks_fts) VALUES ('rebuild')")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_kb_chunks_search_vector")
        op.execute("ALTER TABLE kb_chunks DROP COLUMN search_vector")
    else:
        for trigger in _SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER {trigger}")
        op.execute("DROP TABLE kb_chunks_fts")

    # Revision 0008 has no chunk without a vector: documents stored without the embeddings
    # extra go (their text can be added again).
    op.execute(
        "DELETE FROM kb_documents WHERE id IN "
        "(SELECT document_id FROM kb_chunks WHERE embedding IS NULL)"
    )
    with op.batch_alter_table("kb_chunks", schema=None) as batch_op:
        batch_op.alter_column("embedding", existing_type=sa.LargeBinary(), nullable=False)
