"""What every list endpoint shares: the query parameters of a page (a time range, a cursor,
a limit) and the cursor of the next one (``store.pages``)."""

from __future__ import annotations

from base64 import urlsafe_b64decode, urlsafe_b64encode
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Protocol

from fastapi import Query

from agentstream.errors import UserError
from agentstream.store.paging import Page

__all__ = ["next_cursor", "page_of"]


async def page_of(
    since: datetime | None = None,
    until: datetime | None = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> Page:
    """A page of rows created from ``since`` and before ``until`` (ISO 8601; without a zone,
    UTC), after ``cursor`` (a page's ``next_cursor``): a FastAPI dependency."""
    return Page(
        since=_utc(since, "since"),
        until=_utc(until, "until"),
        after=None if cursor is None else _read_cursor(cursor),
        limit=limit,
    )


class _Listed(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def created_at(self) -> datetime: ...


def next_cursor(rows: Sequence[_Listed], page: Page) -> str | None:
    """The cursor of the page after ``rows``; None when ``rows`` is the last page."""
    if len(rows) < page.limit:
        return None
    last = rows[-1]
    return urlsafe_b64encode(f"{last.created_at.isoformat()}|{last.id}".encode()).decode()


def _utc(moment: datetime | None, field: str) -> datetime | None:
    if moment is None:
        return None
    try:  # a time zone can take the year 1 or 9999 past what a datetime holds
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except OverflowError:
        raise UserError("is out of the range of dates this API keeps", field=field) from None


def _read_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, row_id = urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        moment = _utc(datetime.fromisoformat(created), "cursor")
    except ValueError:
        raise UserError("is not a cursor this API gave", field="cursor") from None
    assert moment is not None
    return moment, row_id
