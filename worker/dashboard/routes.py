"""Serving the dashboard: ``/`` (the page) and ``/ui/*`` (its scripts and styles).

The assets are plain files shipped in the package (``static/``), built by nobody: no
bundler, no CDN, nothing fetched at install time. They hold no data, so they are served
without a token (:mod:`worker.auth` lists them as public); everything the page shows
comes from the public API with the token the user signs in with. Starlette's
``StaticFiles`` serves them with ETags, so a reload costs a few 304s. The page itself is
answered whole each time: it carries its response's style nonce (:mod:`.guard`).

``static/vendor/`` holds third-party files kept as their packages ship them (xterm.js,
loaded by the Terminal tab only): ``static/vendor/MANIFEST.json`` names each package, its
version and the hash of every file, checked by the tests; ``static/LICENSE.txt`` lists
their licences.
"""

from __future__ import annotations

import functools
import secrets
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.responses import HTMLResponse, Response
from starlette.staticfiles import StaticFiles

from .guard import ASSETS_PREFIX, PAGE, DashboardHeaders, page_csp

STATIC = Path(__file__).parent / "static"

router = APIRouter()


#: Where the page's text holds its response's style nonce (see :mod:`.guard`).
NONCE_MARK = "{{style-nonce}}"


@functools.cache
def _page() -> str:
    return (STATIC / "index.html").read_text(encoding="utf-8")


@router.get(PAGE, include_in_schema=False)
async def index() -> Response:
    """The dashboard's page."""
    nonce = secrets.token_urlsafe(18)
    # no-cache and no validator: each answer has its own nonce (the page names its
    # assets, which may change with the package)
    return HTMLResponse(
        _page().replace(NONCE_MARK, nonce),
        headers={"Cache-Control": "no-cache", "Content-Security-Policy": page_csp(nonce)},
    )


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
