"""Persistence: SQLite by default, PostgreSQL by URL, schema managed by Alembic."""

from agentstream.store.store import Store

__all__ = ["Store"]
