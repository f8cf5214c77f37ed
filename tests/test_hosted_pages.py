"""The hosted pages and their assets are served confined: a strict Content-Security-Policy
(this origin's files only, nothing inline), no framing, no Referer. The Chromium tests of
each page (test_chat_page, test_run_page) prove the pages work under it."""

from __future__ import annotations

import httpx
import pytest

from conftest import LiveServer


@pytest.mark.parametrize(
    "path",
    [
        "/chat/your-slug",
        "/console",
        "/console/runs/run_0",
        "/console/workflows/demo-pair/run",
        "/console/executions/wfx_0",
        "/static/console.js",
        "/static/chat.js",
        "/static/run.css",
    ],
)
def test_pages_and_assets_send_the_security_headers(server: LiveServer, path: str) -> None:
    response = httpx.get(server.url + path)
    assert response.status_code == 200
    policy = dict(
        directive.strip().split(" ", 1)
        for directive in response.headers["content-security-policy"].split(";")
    )
    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert "unsafe" not in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("/", "/console"),
        ("/workflows/demo-pair/run", "/console/workflows/demo-pair/run"),
        ("/workflows/executions/wfx_0", "/console/executions/wfx_0"),
    ],
)
def test_the_home_page_and_the_old_run_view_lead_to_the_console(
    server: LiveServer, old: str, new: str
) -> None:
    response = httpx.get(server.url + old)
    assert response.status_code in {307, 308}
    assert response.headers["location"] == new


def test_the_api_is_left_alone(server: LiveServer) -> None:
    response = httpx.get(server.url + "/api/chat/your-slug")
    assert response.status_code == 200
    assert "content-security-policy" not in response.headers
