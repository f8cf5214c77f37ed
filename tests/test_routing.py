"""The app's routers (``server.routing.Router``): a request is matched against the routes of
the routers whose routes' fixed starts its path holds, not every route before; and it is
routed as FastAPI routes it (found, 404, 405)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from agentstream.server import agents, chat, openai
from agentstream.server.routing import Router
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
