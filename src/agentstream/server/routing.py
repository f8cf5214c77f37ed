"""The app's routers: FastAPI's, passed over at once by a request that none of their routes'
paths could be."""

from __future__ import annotations

import re

from fastapi import APIRouter
from starlette._utils import get_route_path  # the path routes match, as FastAPI's own do
from starlette.routing import Match
from starlette.types import Scope

__all__ = ["Router"]


class Router(APIRouter):
    """An ``APIRouter`` that a request passes at once unless its path holds the fixed start
    of one of the router's routes' paths (the part before their first parameter).

    FastAPI matches a request against every route of every router included before the one
    it is for, and against the routes before its own in that router twice: a regular
    expression each, with bookkeeping in the scope around it (about 200 bytecodes a
    route). A public chat message went through 43 routes before its own, a tenth of a
    trivial request's CPU. A route is served under a path that holds its fixed start,
    wherever the router is included (under a prefix of its own too); a router with a route
    that starts with a parameter is never passed over.

    Within a router, the routes that start runs come first (``agents``, ``chat``,
    ``openai``): the routes before them cost those requests as much again.
    """

    _starts: tuple[int, re.Pattern[str]] | None = None
    """How many routes the pattern was made from, and the pattern of their fixed starts."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if self._route_starts().search(get_route_path(scope)) is None:
            return Match.NONE, {}
        return super().matches(scope)

    def _route_starts(self) -> re.Pattern[str]:
        """Any of the routes' fixed starts, made again when the number of routes changed (the
        app's routes are all added before it serves)."""
        if self._starts is None or self._starts[0] != len(self.routes):
            starts = {getattr(route, "path", "").partition("{")[0] for route in self.routes}
            pattern = re.compile("|".join(map(re.escape, sorted(starts))))
            self._starts = (len(self.routes), pattern)
        return self._starts[1]
