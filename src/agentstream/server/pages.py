"""The hosted pages (the public chat, the workflow run view) and their static assets, served
with headers that confine them: only this origin's scripts, styles and API, no framing by
other sites, no URL (with its execution or chat id) leaked in ``Referer``."""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

__all__ = ["PAGE_HEADERS", "WEB", "StaticAssets", "page"]

WEB = Path(str(files("agentstream.web")))

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",  # the pages' scripts are files in /static: nothing inline
        "style-src 'self'",  # so are their styles (scripts set positions through the CSSOM)
        "img-src 'self' data:",
        "connect-src 'self'",  # the API they call and stream from
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",  # frame-ancestors, for browsers that predate it
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def page(name: str) -> FileResponse:
    """The page ``name`` from the web directory, with ``PAGE_HEADERS``."""
    return FileResponse(WEB / name, headers=PAGE_HEADERS)


class StaticAssets(StaticFiles):
    """The pages' scripts and styles, with the same headers (``nosniff`` matters most: a
    script is only ever run as the type it is served as)."""

    def __init__(self) -> None:
        super().__init__(directory=WEB)

    def file_response(
        self,
        full_path: str | os.PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(PAGE_HEADERS)
        return response
