"""Times as the store keeps them: aware, in UTC."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["now", "utc"]


def now() -> datetime:
    return datetime.now(UTC)


def utc(moment: datetime) -> datetime:
    """SQLite drops the zone on the way back: every time we store is UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
