"""Serving the dashboard: ``/`` (the page) and ``/ui/*`` (its scripts and styles).

The assets are plain files shipped in the package (``static/``), built by nobody: no
bundler, no CDN, nothing fetched at install time. They hold no data, so they are served
without a token (:mod:`worker.auth` lists them as public); everything the page shows
comes from the public API with the token the user signs in with. Starlette's
``StaticFiles`` serves them with ETags, so a reload costs a few 304s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

from .guard import ASSETS_PREFIX, PAGE, DashboardHeaders

STATIC = Path(__file__).parent / "static"

router = APIRouter()


@router.get(PAGE, include_in_schema=False)
async def index() -> Response:
    """The dashboard's page."""
    # no-cache: the page names its assets, which may change with the package
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


class _Assets(StaticFiles):
    """The dashboard's scripts, styles and images (``StaticFiles``, with ETags)."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"  # revalidated (ETag): never stale after an upgrade
        return response


def mount(app: FastAPI) -> None:
    """Serve the dashboard on ``app``: its page, its assets, their response headers."""
    app.include_router(router)
    app.mount(ASSETS_PREFIX.rstrip("/"), _Assets(directory=STATIC, follow_symlink=False), name="dashboard")
    app.add_middleware(DashboardHeaders)
