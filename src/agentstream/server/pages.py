"""The hosted pages (the public chat, the workflow run view) and their static assets, served
with headers that confine them: only this origin's scripts, styles and API, no framing by
other sites, no URL (with its execution or chat id) leaked in ``Referer``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path

from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

__all__ = ["PAGE_HEADERS", "WEB", "StaticAssets", "page", "script"]

WEB = Path(str(files("agentstream.web")))


def _policy(frame_ancestors: str, images: Sequence[str] = ()) -> str:
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",  # the pages' scripts are files in /static: nothing inline
            "style-src 'self'",  # so are their styles (scripts set positions through the CSSOM)
            " ".join(["img-src 'self' data:", *images]),
            "connect-src 'self'",  # the API they call and stream from
            "base-uri 'none'",
            "form-action 'self'",
            f"frame-ancestors {frame_ancestors}",
        ]
    )


CONTENT_SECURITY_POLICY = _policy("'none'")

PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",  # frame-ancestors, for browsers that predate it
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def page(
    name: str, *, embed_origins: Sequence[str] = (), image_origins: Sequence[str] = ()
) -> FileResponse:
    """The page ``name`` from the web directory, with ``PAGE_HEADERS``; one that the sites
    ``embed_origins`` may show in a frame of theirs (and no other site), and that shows
    images from ``image_origins`` too (a deployment's logo)."""
    headers = dict(PAGE_HEADERS)
    if embed_origins:
        del headers["X-Frame-Options"]
    headers["Content-Security-Policy"] = _policy(" ".join(embed_origins) or "'none'", image_origins)
    return FileResponse(WEB / name, headers=headers)


def script(name: str) -> FileResponse:
    """A script other sites include (``widget.js``): served as what it is, and nothing more."""
    return FileResponse(
        WEB / name,
        media_type="text/javascript",
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "max-age=300"},
    )


class StaticAssets(StaticFiles):
    """The pages' scripts and styles (or the files of another ``directory``, such as the API
    docs' assets), with the same headers (``nosniff`` matters most: a script is only ever run
    as the type it is served as)."""

    def __init__(self, directory: Path = WEB) -> None:
        super().__init__(directory=directory)

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
