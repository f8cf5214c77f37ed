"""Callers that wait, each on a future of its own, for what another task does for them
(a group's write, a shared read).

A future of its own, not one shared through ``asyncio.shield``: a caller cancelled
cancels only its own, and the others resume in the turn after they are told, where the
shield's callback costs each a turn more (tens of milliseconds once the process is at a
whole core).
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

__all__ = ["tell"]

T = TypeVar("T")


def tell(waiter: asyncio.Future[T], outcome: T | Exception) -> None:
    """``outcome`` to the caller waiting on ``waiter`` (an error, raised to it), unless it
    is done already: cancelled with its caller."""
    if waiter.done():
        return
    if isinstance(outcome, Exception):
        waiter.set_exception(outcome)
    else:
        waiter.set_result(outcome)
