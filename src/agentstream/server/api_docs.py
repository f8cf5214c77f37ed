"""The API's documentation pages, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), with their
scripts and styles served from this server (the ``fastapi-offline`` package ships them), so
they work without internet and load nothing from another origin."""

from __future__ import annotations

import base64
import hashlib
import re
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import HTMLResponse

from agentstream.server.pages import PAGE_HEADERS, StaticAssets

__all__ = ["ASSETS_URL", "install_api_docs"]

ASSETS_URL = "/docs/assets"
ASSETS = Path(str(files("fastapi_offline").joinpath("static")))


def docs_headers(html: str) -> dict[str, str]:
    """The hosted pages' headers with a policy of their own: still nothing from another
    origin, but the one inline script FastAPI's page configures Swagger UI with (allowed by
    its hash, not ``'unsafe-inline'``), and inline styles, which both UIs inject at run
    time. ReDoc runs its search in a worker made from a ``blob:`` URL; the Redocly logo it
    loads from a CDN is refused, and ReDoc then leaves it out."""
    hashes = [_source_hash(s) for s in re.findall(r"<script>(.*?)</script>", html, re.DOTALL)]
    policy = "; ".join(
        [
            "default-src 'none'",
            " ".join(["script-src 'self'", *hashes]),
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",
            "font-src 'self'",
            "connect-src 'self'",  # the OpenAPI document, and "Try it out"
            "worker-src blob:",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )
    return {**PAGE_HEADERS, "Content-Security-Policy": policy}


def _source_hash(script: str) -> str:
    """The CSP source that allows this inline script and no other."""
    return f"'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"


def _page(generated: HTMLResponse) -> tuple[str, dict[str, str]]:
    """FastAPI's page and the headers to serve it with."""
    html = bytes(generated.body).decode()
    return html, docs_headers(html)


def install_api_docs(app: FastAPI) -> None:
    """Serve ``/docs``, ``/redoc`` and their assets (create ``app`` with ``docs_url`` and
    ``redoc_url`` set to ``None``, so FastAPI's CDN pages are not there as well)."""
    openapi_url = app.openapi_url or "/openapi.json"
    favicon = f"{ASSETS_URL}/favicon.png"
    swagger = _page(
        get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=favicon,
        )
    )
    redoc = _page(
        get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=favicon,
            with_google_fonts=False,
        )
    )
    app.mount(ASSETS_URL, StaticAssets(ASSETS), name="api-docs")  # nosniff, like the pages' assets

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return HTMLResponse(swagger[0], headers=swagger[1])

    @app.get("/redoc", include_in_schema=False)
    async def redoc_page() -> HTMLResponse:
        return HTMLResponse(redoc[0], headers=redoc[1])
