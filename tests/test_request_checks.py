"""What every request is checked for, on both stores: NUL in any path parameter or stored
text, non-finite numbers, and JSON nested past the one depth limit, each a 4xx naming the
field, never a 500."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.routing import APIRoute, iter_route_contexts

from agentstream.inputs import MAX_DEPTH
from agentstream.server import create_app
from conftest import LiveServer, make_settings, serve


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    """The same behaviour on both stores."""
    overrides = {}
    if request.param == "postgresql":
        overrides["database_url"] = request.getfixturevalue("postgres_url")
    with serve(make_settings(tmp_path, **overrides)) as live:
        yield live


WORKFLOW = {
    "id": "echo",
    "blocks": [
        {"id": "start", "type": "start"},
        {"id": "answer", "type": "response", "output": "<start.input>"},
    ],
    "edges": [{"from": "start", "to": "answer"}],
}


def nested(levels: int) -> Any:
    """Lists inside lists, ``levels`` deep."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def refusal(response: httpx.Response) -> tuple[int, str, str]:
    """Status, code and field of a refusal; the OpenAI-compatible routes name the field
    ``param``, as OpenAI does."""
    error = response.json()["error"]
    field = error["param"] if response.url.path.startswith("/v1/") else error["field"]
    assert error["message"].startswith(field + ": ")
    return response.status_code, error["code"], field


def test_nul_in_any_path_parameter_is_a_4xx_naming_it(server: LiveServer) -> None:
    """Every route with a path parameter, every parameter: a new route cannot miss it.
    No key is sent: the public chat's routes need none, and none of this reaches the store."""
    routes = iter_route_contexts(create_app(server.settings).routes)
    checked = []
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for route in routes:
            if not isinstance(route.original_route, APIRoute):
                continue
            assert route.path is not None
            assert route.methods is not None
            names = re.findall(r"{(\w+)}", route.path)
            for name in names:
                path = route.path
                for other in names:
                    path = path.replace(f"{{{other}}}", quote("a\x00" if other == name else "a"))
                for method in sorted(route.methods):
                    response = client.request(method, path)
                    assert refusal(response) == (422, "invalid_request", name), (method, path)
                    checked.append((method, route.path, name))
    assert ("POST", "/api/chat/{slug}", "slug") in checked
    assert ("GET", "/api/sessions/{session_id}", "session_id") in checked
    assert len(checked) > 30


def test_nul_in_a_static_path_is_a_4xx(server: LiveServer) -> None:
    response = httpx.get(server.url + "/static/chat%00.js")
    assert 400 <= response.status_code < 500


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/agents/demo/run/stream", {"message": "hi", "session_id": "s\x00"}, "session_id"),
        ("/api/knowledge-bases", {"name": "a\x00b"}, "name"),
        ("/api/knowledge-bases", {"name": "docs", "description": "\x00"}, "description"),
        ("/api/workflows/echo/run/stream", {"input": {"note": ["ok", "a\x00"]}}, "input.note.1"),
        ("/api/workflows/echo/run/stream", {"input": {"a\x00": 1}}, "input"),
        ("/api/chat/your-slug", {"input": "hi", "conversationId": "\x00"}, "conversationId"),
    ],
    ids=["session-id", "kb-name", "kb-description", "workflow-input", "key", "chat"],
)
def test_nul_in_body_text_is_a_422_naming_the_field(
    server: LiveServer, path: str, body: dict[str, Any], field: str
) -> None:
    with server.client() as client:
        assert client.put("/api/workflows/echo", json=WORKFLOW).status_code == 200
        bases = client.get("/api/knowledge-bases").json()
        response = client.post(path, json=body)
        assert refusal(response) == (422, "invalid_request", field)
        assert "NUL" in response.json()["error"]["message"]
        assert client.get("/api/knowledge-bases").json() == bases


def test_nul_in_an_uploaded_document_name_is_a_422(server: LiveServer) -> None:
    with server.client() as client:
        kb = client.post("/api/knowledge-bases", json={"name": "docs"}).json()["id"]
        response = client.post(
            f"/api/knowledge-bases/{kb}/documents",
            files={"file": ("notes.txt", b"Some notes.", "text/plain")},
            data={"name": "notes\x00.txt"},
        )
        assert refusal(response) == (422, "invalid_request", "name")
        assert client.get(f"/api/knowledge-bases/{kb}").json()["documents"] == 0


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (b'{"input": NaN}', "input"),
        (b'{"input": {"x": [1, Infinity]}}', "input.x.1"),
        (b'{"input": -Infinity}', "input"),
        (b'{"input": {"big": 1e999}}', "input.big"),
    ],
    ids=["nan", "infinity", "minus-infinity", "overflow"],
)
def test_non_finite_numbers_are_refused_at_input(
    server: LiveServer, content: bytes, field: str
) -> None:
    with server.client() as client:
        assert client.put("/api/workflows/echo", json=WORKFLOW).status_code == 200
        executions = client.get("/api/workflows/echo/executions").json()
        response = client.post(
            "/api/workflows/echo/run/stream",
            content=content,
            headers={"content-type": "application/json"},
        )
        assert refusal(response) == (422, "invalid_request", field)
        assert "finite" in response.json()["error"]["message"]
        assert client.get("/api/workflows/echo/executions").json() == executions


def test_input_at_the_depth_limit_runs_and_is_stored(server: LiveServer) -> None:
    deepest = nested(MAX_DEPTH)  # ``input`` is level 1 of the body
    with server.client() as client:
        assert client.put("/api/workflows/echo", json=WORKFLOW).status_code == 200
        response = client.post("/api/workflows/echo/run/stream", json={"input": deepest})
        assert response.status_code == 200
        execution_id = response.headers["X-Execution-Id"]
        execution = client.get(f"/api/workflows/executions/{execution_id}").json()
    assert (execution["status"], execution["input"]) == ("completed", deepest)


def deep_json(template: str, levels: int) -> bytes:
    """``template`` with ``DEEP`` replaced by lists nested so that the innermost one is at
    ``levels`` (the body itself is level 0)."""
    slot = template[: template.index("DEEP")]
    lists = levels - (slot.count("{") + slot.count("[")) + 1
    return template.replace("DEEP", "[" * lists + "]" * lists).encode()


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 256, 900, 5_000])
@pytest.mark.parametrize(
    ("method", "path", "template", "field"),
    [
        ("POST", "/api/workflows/echo/run/stream", '{"input": DEEP}', "input"),
        ("POST", "/api/agents/demo/run/stream", '{"message": DEEP}', "message"),
        ("PATCH", "/api/agents/demo", '{"model_settings": {"x": DEEP}}', "model_settings"),
        ("PUT", "/api/workflows/echo", '{"id": "echo", "blocks": DEEP}', "blocks"),
        ("PATCH", "/api/chat-deployments/your-slug", '{"outputs": DEEP}', "outputs"),
        ("POST", "/api/chat/your-slug", '{"input": "hi", "files": DEEP}', "files"),
        ("POST", "/api/workflows/echo/run/stream", "DEEP", "0"),
    ],
    ids=["workflow-input", "message", "agent", "workflow", "deployment", "chat", "body"],
)
def test_deep_nesting_is_refused_at_one_limit_everywhere(
    server: LiveServer, method: str, path: str, template: str, field: str, levels: int
) -> None:
    """Past the limit, whichever the route and however deep: 422 naming the top-level field
    (an array body's first element is ``0``; ``body`` when the JSON parser itself gives out
    first), and nothing changes."""
    with server.client() as client:
        assert client.put("/api/workflows/echo", json=WORKFLOW).status_code == 200
        before = client.get("/api/agents/demo").json()
        executions = client.get("/api/workflows/echo/executions").json()
        response = client.request(
            method,
            path,
            content=deep_json(template, levels),
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["field"] == (field if levels < 1_000 else "body")
        assert error["message"].endswith(f"nested deeper than {MAX_DEPTH} levels")
        assert client.get("/api/agents/demo").json() == before
        assert client.get("/api/workflows/echo/executions").json() == executions
