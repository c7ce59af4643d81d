"""Serving the dashboard: ``/`` (the page) and ``/ui/*`` (its scripts and styles).

The assets are plain files shipped in the package (``static/``), built by nobody: no
bundler, no CDN, nothing fetched at install time. They hold no data, so they are served
without a token; everything the page shows comes from the public API with the token the
user signs in with. Starlette's ``StaticFiles`` serves them with ETags, so a reload costs
a few 304s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

from .guard import Guard

STATIC = Path(__file__).parent / "static"


class _Assets(StaticFiles):
    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"  # revalidated (ETag): never stale after an upgrade
        return response


def mount(app: FastAPI, *, token_required: bool, on_reject: Callable[[str], None] | None = None) -> None:
    """Serve the dashboard on ``app`` and guard every route (:class:`Guard`)."""

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        # no-cache: the page names its assets, which may change with the package
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/ui", _Assets(directory=STATIC, follow_symlink=False), name="dashboard")
    app.add_middleware(Guard, token_required=token_required, on_reject=on_reject)
