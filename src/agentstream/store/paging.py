"""Lists a page at a time, newest first, with a keyset over creation time and id: a page
goes on where the last one ended, so rows created meanwhile never shift a page or show twice."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TypeVarTuple

from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import InstrumentedAttribute

__all__ = ["Page", "newest_first"]

Ts = TypeVarTuple("Ts")


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    """Rows created from ``since`` and before ``until``, after the row ``after`` (its
    creation time and id: where the previous page ended), at most ``limit`` of them."""

    since: datetime | None = None
    until: datetime | None = None
    after: tuple[datetime, str] | None = None
    limit: int = 50


def newest_first(
    query: Select[*Ts],
    page: Page,
    created: InstrumentedAttribute[datetime],
    key: InstrumentedAttribute[str],
) -> Select[*Ts]:
    """``query`` narrowed to ``page``, newest first, by the columns ``created`` and ``key``."""
    if page.since is not None:
        query = query.where(created >= page.since)
    if page.until is not None:
        query = query.where(created < page.until)
    if page.after is not None:
        moment, last = page.after
        query = query.where(or_(created < moment, and_(created == moment, key < last)))
    return query.order_by(created.desc(), key.desc()).limit(page.limit)
