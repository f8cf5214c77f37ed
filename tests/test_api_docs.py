"""The API docs work offline and say the truth: /docs and /redoc load only this server's
assets, and the OpenAPI document declares the key schemes and the errors really sent."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from conftest import LiveServer

CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_docs_pages_load_only_assets_this_server_serves(server: LiveServer, path: str) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as http:
        html = http.get(path)
        assert html.status_code == 200
        policy = html.headers["content-security-policy"].split("; ")
        scripts = next(d for d in policy if d.startswith("script-src "))
        assert "'unsafe-inline'" not in scripts  # the one inline script is allowed by hash
        assert not re.search(r"https?://", html.text)  # no CDN, no other host
        assets = re.findall(r'(?:src|href)="([^"]+)"', html.text)
        assert assets
        for url in assets:
            asset = http.get(url)
            assert asset.status_code == 200, url
            suffix = url[url.rfind(".") :]
            assert asset.headers["content-type"].startswith(CONTENT_TYPES[suffix]), url
            assert asset.headers["x-content-type-options"] == "nosniff"


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    ]


def test_openapi_declares_the_key_schemes_where_the_server_asks_for_a_key(
    server: LiveServer,
) -> None:
    """An operation is documented as needing a key exactly when it answers 401 without one."""
    with httpx.Client(base_url=server.url, timeout=10) as http:
        document = http.get("/openapi.json").json()
        schemes = document["components"]["securitySchemes"]
        assert schemes["apikey"] == {
            "type": "apiKey",
            "in": "header",
            "name": "apikey",
            "description": "An API key",
        }
        assert schemes["bearer"]["type"] == "http"
        assert schemes["bearer"]["scheme"] == "bearer"
        for method, path, operation in _operations(document):
            url = re.sub(r"\{[^}]+\}", "nothing", path)
            status = http.request(method, url, json={}).status_code
            secured = operation.get("security") == [{"apikey": []}, {"bearer": []}]
            assert (status == 401) == secured, (method, path, status)
        for scheme in ({"apikey": server.key}, {"Authorization": f"Bearer {server.key}"}):
            assert http.get("/api/agents", headers=scheme).status_code == 200


def test_openapi_documents_the_error_body_the_server_sends(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as http:
        raw = http.get("/openapi.json").text
        document = httpx.Response(200, text=raw).json()
        assert "HTTPValidationError" not in raw
        assert "ValidationError" not in document["components"]["schemas"]
        for method, path, operation in _operations(document):
            responses = operation["responses"]
            if "security" in operation:
                assert "401" in responses, (method, path)
            if "{" in path:
                assert "404" in responses, (method, path)
            if "requestBody" in operation or operation.get("parameters"):
                assert "422" in responses, (method, path)
            shape = "OpenAIError" if path.startswith("/v1/") else "Error"
            for status, response in responses.items():
                if status[0] in "45":
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": f"#/components/schemas/{shape}"}, (method, path)
        schemas = document["components"]["schemas"]
        key = {"apikey": server.key}
        refused = {
            ("get", "/api/agents", 401): http.get("/api/agents"),
            ("get", "/api/agents/{agent_id}", 404): http.get("/api/agents/nobody", headers=key),
            ("post", "/api/agents", 422): http.post("/api/agents", json={"id": 7}, headers=key),
            ("post", "/api/agents", 409): http.post(
                "/api/agents", json={"id": "demo", "model": "offline"}, headers=key
            ),
            ("get", "/v1/models/{model}", 404): http.get("/v1/models/nobody", headers=key),
            ("post", "/v1/chat/completions", 422): http.post(
                "/v1/chat/completions", json={"model": "demo"}, headers=key
            ),
        }
    for (method, path, status), response in refused.items():
        assert response.status_code == status, (method, path)
        assert str(status) in document["paths"][path][method]["responses"], (method, path)
        shape = "OpenAIError" if path.startswith("/v1/") else "Error"
        body = response.json()
        assert set(body) == set(schemas[shape]["required"])
        detail = schemas[f"{shape}Detail"]
        assert set(detail["required"]) <= set(body["error"]) <= set(detail["properties"])


def test_swagger_ui_tries_an_operation_with_the_demo_key(server: LiveServer, page: Any) -> None:
    """In a browser without network: authorize with the demo key, run GET /api/agents."""
    page.goto(f"{server.url}/docs")
    page.get_by_role("button", name="Authorize").first.click()
    page.locator("#api_key_value").fill(server.key)
    page.get_by_role("button", name="Apply credentials").first.click()
    page.locator(".modal-ux button.btn-done").first.click()
    operation = page.locator("#operations-agents-list_agents_api_agents_get")
    operation.locator(".opblock-summary").click()
    operation.get_by_role("button", name="Try it out").click()
    operation.get_by_role("button", name="Execute").click()
    status = operation.locator(".live-responses-table tbody .response-col_status").first
    status.wait_for()
    assert status.inner_text().strip() == "200"


REDOCLY_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
"""ReDoc's side menu always shows Redocly's logo from their CDN (no option hides it): the
page's policy refuses it, and ReDoc then leaves the image out (its ``onError``)."""


@pytest.mark.csp_refuses(REDOCLY_LOGO)
def test_redoc_shows_every_operation_without_network(server: LiveServer, page: Any) -> None:
    """In a browser without network, ReDoc renders the document: a section per operation,
    the menu, and a streaming operation's frames named."""
    document = httpx.get(f"{server.url}/openapi.json").json()
    ids = [operation["operationId"] for _, _, operation in _operations(document)]
    refused_logo: list[str] = []
    page.on("requestfailed", lambda r: refused_logo.append(r.url))
    page.goto(f"{server.url}/redoc")
    page.locator(f'[id="operation/{ids[-1]}"]').wait_for(state="attached")
    for operation_id in ids:
        assert page.locator(f'[id="operation/{operation_id}"]').count() == 1, operation_id
    tags = {tag for _, _, operation in _operations(document) for tag in operation["tags"]}
    menu = page.get_by_role("menuitem")
    assert {menu.nth(i).inner_text().strip() for i in range(menu.count())} >= tags
    run = page.locator('[id="operation/run_stream_api_agents__agent_id__run_stream_post"]')
    run.get_by_role("button", name="200").click()
    shown = run.inner_text()
    assert "text/event-stream" in shown
    assert "NativeFrame: one of StartFrame, StepStartedFrame" in shown
    assert set(refused_logo) <= {REDOCLY_LOGO}
