"""The app's routers (``server.routing.Router``): a request is matched against the routes of
the routers whose routes' fixed starts its path holds, not every route before; and it is
routed as FastAPI routes it (found, 404, 405)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import fastapi.dependencies.utils
import fastapi.routing
import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, field_validator

from agentstream.config import Settings
from agentstream.server import agents, chat, create_app, openai
from agentstream.server.errors import install_error_handlers
from agentstream.server.routing import DirectCall, Route, Router
from agentstream.server.validation import check_request
from fakes.server import run_app


def test_a_request_is_matched_only_against_the_routers_its_path_lies_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = Router(prefix="/api/first")
    second = Router(prefix="/api/second")
    unprefixed = Router()

    @first.get("/{name}")
    async def first_item(name: str) -> dict[str, str]:
        return {"first": name}

    @first.post("/{name}/run")
    async def first_run(name: str) -> dict[str, str]:
        return {"ran": name}

    @second.get("/{name}")
    async def second_item(name: str) -> dict[str, str]:
        return {"second": name}

    @unprefixed.get("/api/other/{name}")
    async def other(name: str) -> dict[str, str]:
        return {"other": name}

    app = FastAPI()
    for router in (first, unprefixed, second):
        app.include_router(router)

    tried: Counter[str] = Counter()
    matches = APIRoute.matches

    def counted(route: APIRoute, scope: Any) -> Any:
        tried[route.path] += 1
        return matches(route, scope)

    monkeypatch.setattr(APIRoute, "matches", counted)
    with run_app(app, name="The app") as url, httpx.Client(base_url=url) as client:
        assert client.get("/api/second/b").json() == {"second": "b"}
        assert set(tried) == {"/api/second/{name}"}, "first's and the unprefixed one's skipped"
        tried.clear()
        assert client.get("/api/first/a").json() == {"first": "a"}
        assert client.post("/api/first/a/run").json() == {"ran": "a"}
        assert client.get("/api/other/c").json() == {"other": "c"}
        assert client.get("/api/first/a/run").status_code == 405
        assert client.get("/api/firstly/a").status_code == 404
        assert client.get("/api/third/a").status_code == 404
        assert tried["/api/second/{name}"] == 0

    @unprefixed.get("/{page}")  # added once requests came: the router is never passed over
    async def page(page: str) -> dict[str, str]:
        return {"page": page}

    with run_app(app, name="The app") as url, httpx.Client(base_url=url) as client:
        assert client.get("/api/other/c").json() == {"other": "c"}
        assert client.get("/anything").json() == {"page": "anything"}

    nested = FastAPI()
    nested.include_router(second, prefix="/v2")  # served under another prefix too
    with run_app(nested, name="The app") as url, httpx.Client(base_url=url) as client:
        assert client.get("/v2/api/second/b").json() == {"second": "b"}


@pytest.mark.parametrize(
    ("router", "path"),
    [
        (agents.router, "/api/agents/{agent_id}/run/stream"),
        (chat.router, "/api/chat/{slug}"),
        (openai.router, "/v1/chat/completions"),
    ],
)
def test_the_routes_that_start_runs_come_first_in_their_routers(router: Router, path: str) -> None:
    """FastAPI matches a request twice against each route before its own in its router."""
    first = router.routes[0]
    assert isinstance(first, APIRoute)
    assert (first.path, first.methods) == (path, {"POST"})


calls: list[str] = []
"""What the apps below called, in order."""


class Item(BaseModel):
    text: str
    count: int = 1

    @field_validator("text")
    @classmethod
    def _not_shouted(cls, text: str) -> str:
        calls.append("validate")
        if text.isupper():
            raise ValueError("is shouted")
        return text


async def everywhere() -> None:
    calls.append("app")


async def included(request: Request) -> None:
    calls.append("included")
    if request.headers.get("x-in") == "no":
        raise HTTPException(403, "not in")


async def guard(request: Request) -> None:
    calls.append("guard")
    if request.headers.get("x-key") != "k":
        raise HTTPException(401, "no key")


async def caller(request: Request) -> str:
    calls.append("caller")
    return "someone"


async def echo(
    name: Annotated[str, PathParam(max_length=5)],
    item: Item,
    request: Request,
    who: Annotated[str, Depends(caller)],
    again: Annotated[str, Depends(caller)],
    tag: Annotated[str | None, Header(alias="x-tag")] = None,
) -> Response:
    """Every kind of value a route served directly takes."""
    return JSONResponse(
        {
            "name": name,
            "item": item.model_dump(),
            "who": who,
            "again": again,
            "tag": tag,
            "method": request.method,
        }
    )


def _app(router_class: type[APIRouter], **app: Any) -> FastAPI:
    """``echo`` at ``/a/b/items/{name}``, behind dependencies of the app, of the router's
    inclusion in a router included in the app, and of the router; a plain ``APIRouter``
    checks its requests as ``Route`` does."""
    checked = [Depends(check_request)] if router_class is APIRouter else []
    router = router_class(dependencies=[*checked, Depends(guard)])
    router.add_api_route("/items/{name}", echo, methods=["POST"])
    outer = APIRouter()
    outer.include_router(router, prefix="/b", dependencies=[Depends(included)])
    served = FastAPI(dependencies=[Depends(everywhere)], **app)
    install_error_handlers(served)
    served.include_router(outer, prefix="/a")
    return served


async def someone_else(request: Request) -> str:
    calls.append("someone else")
    return "someone else"


BAD_OR_ODD: list[tuple[dict[str, str], bytes]] = [
    ({"content-type": "application/json"}, b'{"text": "hi", "count": "2"}'),
    ({"content-type": "Application/JSON; charset=utf-8"}, b'{"text": "hi"}'),
    ({"content-type": "application/merge-patch+json"}, b'{"text": "hi"}'),
    ({"content-type": "application/x/+json"}, b'{"text": "hi"}'),
    ({"content-type": "text/plain"}, b'{"text": "hi"}'),
    ({}, b'{"text": "hi"}'),
    ({"content-type": "application/json"}, b""),
    ({"content-type": "application/json"}, b"null"),
    ({"content-type": "application/json"}, b"[]"),
    ({"content-type": "application/json"}, b'{"text": "hi"'),
    ({"content-type": "application/json"}, b'{"text": "\xff"}'),
    ({"content-type": "application/json"}, b'{"text": "HI"}'),
    ({"content-type": "application/json"}, b'{"count": "many"}'),
    ({"content-type": "application/json"}, b'{"text": "h\\u0000i"}'),
    ({"content-type": "application/json", "x-key": ""}, b'{"text": "hi"}'),
    ({"content-type": "application/json", "x-key": ""}, b'{"text": "HI"}'),
    ({"content-type": "application/json", "x-in": "no"}, b'{"count": "many"}'),
]


@pytest.mark.parametrize(("headers", "body"), BAD_OR_ODD)
@pytest.mark.parametrize("path", ["/a/b/items/x", "/a/b/items/toolong", "/a/b/items/x%00"])
@pytest.mark.parametrize("overridden", [False, True])
def test_a_route_answers_as_fastapis_own_route_does(
    headers: dict[str, str], body: bytes, path: str, overridden: bool
) -> None:
    """Valid, invalid, refused in a dependency, or all at once: a ``Route`` gives the
    answer a plain ``APIRoute`` gives, and calls what it calls (the dependencies of the
    app, of the inclusions and of the route, the body's validator, an override), in the
    same order."""
    answers = []
    for router_class in (APIRouter, Router):
        calls.clear()
        app = _app(router_class)
        if overridden:
            app.dependency_overrides[caller] = someone_else
        with run_app(app, name="The app") as url, httpx.Client(base_url=url) as client:
            response = client.post(path, content=body, headers={"x-key": "k", **headers})
        sent = {name: value for name, value in response.headers.items() if name != "date"}
        answers.append((response.status_code, sent, response.json(), list(calls)))
    assert answers[0] == answers[1]


@pytest.mark.parametrize("mounted_at", ["", "/m"])
def test_a_validation_error_names_the_endpoint_as_fastapis_does(
    mounted_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a log of the error says (``str``): the errors, and where the endpoint is (its
    file, line and function, the method and the route's whole path, under the path the app
    is mounted at). FastAPI keeps where each endpoint is, and its handler writes the last
    path into what it keeps: a ``Route`` goes first, with nothing kept; it answers with no
    dependency solved."""
    monkeypatch.setattr(fastapi.routing, "_endpoint_context_cache", {})
    solved = []
    solve = fastapi.dependencies.utils.solve_dependencies  # as fastapi.routing calls it

    async def counted(**kwargs: Any) -> Any:
        solved.append(kwargs["dependant"].call)
        return await solve(**kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted)
    said = []
    for router_class in (Router, APIRouter):
        app = _app(router_class)

        async def told(_request: Request, exc: Exception) -> Response:
            return PlainTextResponse(str(exc), status_code=422)

        app.add_exception_handler(RequestValidationError, told)
        served = app
        if mounted_at:
            served = FastAPI()
            served.mount(mounted_at, app)
        with run_app(served, name="The app") as url, httpx.Client(base_url=url) as client:
            answer = client.post(
                f"{mounted_at}/a/b/items/toolong", json={"text": "HI"}, headers={"x-key": "k"}
            )
        said.append(answer.text)
        if router_class is Router:
            assert solved == []
    assert solved, "FastAPI's own route solves its dependencies"
    assert said[0] == said[1]
    assert f'File "{__file__}", line' in said[0]
    assert f"in echo\n    POST {mounted_at}/a/b/items/{{name}}" in said[0]


def test_with_fastapis_telemetry_on_a_route_is_traced_as_fastapi_traces_it() -> None:
    """Its dependencies and its endpoint in spans of their own: FastAPI's handler serves
    it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = []
    for router_class in (APIRouter, Router):
        exporter.clear()
        app = _app(router_class, telemetry={"tracer_provider": provider})
        with run_app(app, name="The app") as url, httpx.Client(base_url=url) as client:
            client.post("/a/b/items/x", json={"text": "hi"}, headers={"x-key": "k"})
        spans.append(sorted(span.name for span in exporter.get_finished_spans()))
    assert "fastapi.endpoint" in spans[0]
    assert spans[0] == spans[1]


def test_a_valid_request_is_served_without_fastapis_dependency_solving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nor an invalid one; a body that is not sent as JSON goes to FastAPI's handler."""
    solves = Counter[str]()
    solve = fastapi.dependencies.utils.solve_dependencies  # as fastapi.routing calls it

    async def counted(**kwargs: Any) -> Any:
        solves[kwargs["dependant"].call.__name__] += 1
        return await solve(**kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted)
    app = _app(Router)
    with run_app(app, name="The app") as url, httpx.Client(base_url=url) as client:
        valid = client.post(
            "/a/b/items/x", json={"text": "hi"}, headers={"x-key": "k", "x-tag": "t"}
        )
        assert valid.json() == {
            "name": "x",
            "item": {"text": "hi", "count": 1},
            "who": "someone",
            "again": "someone",
            "tag": "t",
            "method": "POST",
        }
        assert not solves
        refused = client.post("/a/b/items/x", json={"text": "HI"}, headers={"x-key": "k"})
        assert refused.status_code == 422
        assert not solves
        not_json = client.post("/a/b/items/x", content=b"{}", headers={"x-key": "k"})
        assert not_json.status_code == 422
        assert solves["echo"] == 1


def test_every_route_of_the_app_checks_its_request_first(tmp_path: Path) -> None:
    """``check_request`` comes with the route class (``Route``), for the app's own routes
    too."""
    app = create_app(Settings(data_dir=tmp_path))
    routes = [
        context
        for context in iter_route_contexts(app.routes)
        if isinstance(context.original_route, APIRoute)
    ]
    assert len(routes) > 60
    for context in routes:
        assert isinstance(context.original_route, Route), context.path
        assert context.dependant.dependencies[0].call is check_request, context.path


def test_an_endpoint_that_returns_no_response_is_an_error_not_served_again() -> None:
    """FastAPI would make what it returned JSON; a ``Route`` serves a ``Response`` only,
    as its endpoint's annotation says, and does not hand the request on after calling it."""

    async def forgetful(request: Request) -> Response:
        calls.append("endpoint")
        return None  # type: ignore[return-value]

    router = Router()
    router.add_api_route("/forgetful", forgetful, methods=["POST"])
    app = FastAPI()
    app.include_router(router)
    calls.clear()
    with pytest.raises(TypeError, match="forgetful returned None"), TestClient(app) as client:
        client.post("/forgetful")
    assert calls == ["endpoint"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/agents/{agent_id}/run/stream",
        "/api/chat/{slug}",
        "/v1/chat/completions",
        "/v1/responses",
        "/api/agents/{agent_id}/ui-messages",
        "/api/agents/{agent_id}/ag-ui",
        "/api/workflows/{workflow_id}/run/stream",
    ],
)
def test_the_routes_that_start_runs_are_served_directly(tmp_path: Path, path: str) -> None:
    """Their dependencies take the request alone and they return a ``Response``: a valid
    start skips FastAPI's dependency solving (a sixth of a run start's instructions)."""
    app = create_app(Settings(data_dir=tmp_path))
    (served,) = [
        context
        for context in iter_route_contexts(app.routes)
        if context.path == path and context.methods == {"POST"}
    ]
    assert isinstance(served.original_route, Route)
    assert DirectCall.of(served) is not None
