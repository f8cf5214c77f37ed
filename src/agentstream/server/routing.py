"""The app's routers and routes: FastAPI's, a router passed over at once by a request that
none of its routes' paths could be, a route that serves a valid request without FastAPI's
dependency solving."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi import routing as fastapi_routing
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import (
    get_typed_return_annotation,
    request_body_to_args,
    request_params_to_args,
)
from fastapi.exceptions import EndpointContext, RequestValidationError
from fastapi.params import Form
from fastapi.routing import APIRoute
from fastapi.sse import EventSourceResponse
from pydantic_core import PydanticUndefined as Undefined  # what FastAPI reads as no body
from starlette._utils import get_route_path  # the path routes match, as FastAPI's own do
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import Scope

from agentstream.server.validation import check_request, is_json
from agentstream.store.definitions_cache import one_request

__all__ = ["Route", "Router"]

_endpoint_context = fastapi_routing._extract_endpoint_context
"""Where an endpoint is, as FastAPI's handler reads it for its validation errors (cached by
the endpoint): bound here, so that a FastAPI without it fails at import, not at the first
invalid request."""


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

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(route_class=Route, **kwargs)

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


class Route(APIRoute):
    """An ``APIRoute`` whose first dependency is ``check_request`` (so no route of the app's
    misses it), and which serves a request itself where it can (``DirectCall``), as
    FastAPI's handler would: the same dependencies called in the same order, the same
    values, the same validation errors.

    FastAPI's handler solves each dependency recursively, with four parameter lists and a
    cache key apiece: a run start's three cost about half of its handler's 5,700 bytecodes
    (docs/benchmarks.md: served directly, a start costs 13 to 15% fewer instructions).
    """

    def __init__(
        self, path: str, endpoint: Callable[..., Any], *, dependencies: Any = None, **kwargs: Any
    ) -> None:
        checked = [Depends(check_request), *(dependencies or ())]
        super().__init__(path, endpoint, dependencies=checked, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The request's lookups of definitions (its key's, its agent's) share one read of
        their counter (``one_request``)."""
        handler = super().get_route_handler()
        direct = DirectCall.of(_served(self))

        async def handle(request: Request) -> Response:
            with one_request():
                response = None if direct is None else await direct.serve(request)
                return await handler(request) if response is None else response

        return handle


def _served(route: APIRoute) -> Any:
    """What FastAPI serves ``route`` as while it makes the route's handler: the route, or,
    where a router that holds it is included, the route with what the inclusion adds (the
    app's and the inclusion's dependencies, its response class, the app's dependency
    overrides). ``APIRoute.get_route_handler`` reads it the same way (FastAPI 0.165)."""
    served = fastapi_routing._effective_route_context_var.get()
    return served if served is not None and served.original_route is route else route


@dataclass(frozen=True, slots=True)
class DirectCall:
    """How a route serves a request without FastAPI's dependency solving: what is read from
    the request, and what is called with it, in FastAPI's order."""

    dependencies: tuple[tuple[str | None, Callable[..., Awaitable[Any]], str | None], ...]
    """Each dependency: the endpoint's parameter it fills (None: the route's), what is
    called, and its parameter for the request (None: it takes none). Each is called once
    a request, as FastAPI's cache has it."""
    params: tuple[tuple[Sequence[Any], Callable[[Request], Mapping[str, Any]]], ...]
    """Each kind of parameter the endpoint takes (path, query, header, cookie): its fields
    and where a request has them, in FastAPI's order."""
    body: list[Any]
    """The body's field, or none."""
    request_name: str | None
    endpoint: Callable[..., Awaitable[Response]]
    path: str
    """The route's path, as its validation errors name it."""
    overrides: Any
    """Whose ``dependency_overrides`` FastAPI's handler would use."""

    @classmethod
    def of(cls, route: Any) -> DirectCall | None:
        """None unless every dependency is ``async``, takes the request or nothing, and is
        cached as a plain ``Depends`` is; the body is one model read as JSON (or there is
        none); and the endpoint is ``async`` and returns a ``Response``, which FastAPI
        passes on as it is. ``route``: an ``APIRoute`` as FastAPI serves it (``_served``)."""
        dependant = route.dependant
        response_class = route.response_class
        if isinstance(response_class, DefaultPlaceholder):
            response_class = response_class.value
        returns = get_typed_return_annotation(route.endpoint)
        if (
            not _is_async(dependant)
            or _special(dependant)
            or len(dependant.body_params) > 1
            or any(isinstance(field.field_info, Form) for field in dependant.body_params)
            or not (inspect.isclass(returns) and issubclass(returns, Response))
            or issubclass(response_class, EventSourceResponse)
        ):
            return None
        dependencies = []
        for sub in dependant.dependencies:
            if sub.dependencies or _params(sub) or sub.body_params or _special(sub):
                return None
            if not _is_async(sub) or sub.concurrency is not None:
                return None
            if not sub.use_cache or sub.scope is not None:
                return None
            if sub.own_oauth_scopes or sub.parent_oauth_scopes:
                return None
            dependencies.append((sub.name, sub.call, sub.request_param_name))
        return cls(
            dependencies=tuple(dependencies),
            params=_params(dependant),
            body=dependant.body_params,
            request_name=dependant.request_param_name,
            endpoint=dependant.call,
            path=dependant.path,
            overrides=route.dependency_overrides_provider,
        )

    async def serve(self, request: Request) -> Response | None:
        """The endpoint's response; or None, with nothing called, where FastAPI's handler
        must answer: a body that is not JSON, or not read (it says why), an override of a
        dependency, FastAPI's telemetry on (its spans)."""
        if request.scope.get("fastapi.telemetry") is not None:
            return None
        if self.overrides is not None and self.overrides.dependency_overrides:
            return None
        body: Any = Undefined
        if self.body:
            try:
                if await request.body():  # read first, as FastAPI reads it
                    if not is_json(request.headers.get("content-type", "")):
                        return None
                    body = await request.json()
            except HTTPException:  # the body over its limit (``errors.BodyLimit``)
                raise
            except Exception:  # not JSON, or the client left
                return None
        values: dict[str, Any] = {}
        solved: dict[object, Any] = {}
        for name, dependency, request_name in self.dependencies:
            if dependency not in solved:
                arguments = {} if request_name is None else {request_name: request}
                solved[dependency] = await dependency(**arguments)
            if name is not None:
                values[name] = solved[dependency]
        errors: list[Any] = []
        for fields, received in self.params:
            found, wrong = request_params_to_args(fields, received(request))
            values.update(found)
            errors += wrong
        if self.body:  # one field: its value is the whole body (FastAPI embeds none)
            found, wrong = await request_body_to_args(self.body, body, embed_body_fields=False)
            values.update(found)
            errors += wrong
        if errors:  # as FastAPI raises it
            body = None if body is Undefined else body
            raise RequestValidationError(errors, body=body, endpoint_ctx=self._where(request))
        if self.request_name is not None:
            values[self.request_name] = request
        response = await self.endpoint(**values)
        if not isinstance(response, Response):  # FastAPI would have made it JSON
            raise TypeError(f"{self.endpoint.__qualname__} returned {response!r}, no Response")
        return response

    def _where(self, request: Request) -> EndpointContext:
        """Where the endpoint is, as a validation error names it (its file, line and
        function, by FastAPI's own reading, and the request's method and route)."""
        found = _endpoint_context(self.endpoint)
        if not self.path:
            return found
        mounted_at = request.scope.get("root_path", "").rstrip("/")
        return {**found, "path": f"{request.method} {mounted_at}{self.path}"}


def _params(
    dependant: Dependant,
) -> tuple[tuple[Sequence[Any], Callable[[Request], Mapping[str, Any]]], ...]:
    """The kinds of parameter ``dependant`` takes, each with where a request has them."""
    kinds = (
        (dependant.path_params, attrgetter("path_params")),
        (dependant.query_params, attrgetter("query_params")),
        (dependant.header_params, attrgetter("headers")),
        (dependant.cookie_params, attrgetter("cookies")),
    )
    return tuple((fields, received) for fields, received in kinds if fields)


def _special(dependant: Dependant) -> bool:
    """Whether ``dependant`` takes what only FastAPI's handler gives (a response to set
    headers on, background tasks, security scopes, a websocket)."""
    return any(
        name is not None
        for name in (
            dependant.websocket_param_name,
            dependant.http_connection_param_name,
            dependant.response_param_name,
            dependant.background_tasks_param_name,
            dependant.security_scopes_param_name,
        )
    )


def _is_async(dependant: Dependant) -> bool:
    """Whether calling ``dependant`` makes a coroutine (an ``async def``, or an object whose
    ``__call__`` is one): FastAPI would run anything else in a thread, or as a generator."""
    call = dependant.call
    if call is None or inspect.isclass(call):
        return False
    return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(type(call).__call__)
