"""What E2B's API has and loom-worker does not offer, answered 501 in E2B's shape, each
naming the part and saying what loom has instead; and E2B's 404 (or 405) for any other
path under E2B's prefixes, never FastAPI's ``{"detail": ...}`` (E2B's SDKs fail on it).

=====================================  =================================================
paths                                  why
=====================================  =================================================
/sandboxes/{id}/logs, /v2/.../logs     loom keeps no sandbox log: commands' output is
                                       their answer, and each call is in the workspace's
                                       call journal (GET /v1/workspaces/{id}/calls)
/templates..., /v2/templates...,       templates are images (LOOM_E2B_TEMPLATES): built
/v3/templates...                       with Docker, not through E2B's API
/volumes...                            the sandbox's files are its workspace
/secrets...                            loom's secrets: PUT /v1/workspaces/{id}/secrets/{name}
/teams..., /api-keys..., /access-      one service, one token (LOOM_API_TOKEN)
tokens..., /nodes...
=====================================  =================================================

This router is matched after every other E2B route (``DELETE /templates/{id}`` of a
snapshot is :mod:`.snapshots`').
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Match

from .answers import error

router = APIRouter(include_in_schema=False)
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]

#: (path prefixes, what is not offered, why): one row of the module docstring's table.
UNOFFERED: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        ("/templates", "/v2/templates", "/v3/templates"),
        "the templates API (building, listing and changing templates)",
        "a template is an image named in LOOM_E2B_TEMPLATES (base and code-interpreter-v1 are LOOM_IMAGE); "
        "build images with Docker",
    ),
    (("/volumes",), "volumes", "a sandbox's files are its workspace; snapshots and forks copy them"),
    (
        ("/secrets",),
        "the secrets API",
        "loom's secrets never enter the sandbox: PUT /v1/workspaces/{id}/secrets/{name} (docs/secrets.md)",
    ),
    (("/teams",), "teams", "one service has one API key, its token (LOOM_API_TOKEN)"),
    (("/api-keys", "/access-tokens"), "API keys and access tokens", "the API key is the service's token"),
    (("/nodes",), "nodes", "a cluster is loom's Ray integration (loom-worker serve --ray, docs/ray.md)"),
)
LOGS = (
    "sandbox logs",
    "loom keeps no sandbox log: a command's output is its answer, and every call is in the workspace's "
    "call journal (GET /v1/workspaces/{id}/calls)",
)
#: E2B's own prefixes whose other paths are E2B's 404.
UNKNOWN = ("/sandboxes", "/v2/sandboxes", "/snapshots")


def _refuse(what: str, why: str) -> JSONResponse:
    return error(501, f"{what} is not offered by loom-worker: {why}")


@router.get("/sandboxes/{sandbox_id}/logs")
@router.get("/v2/sandboxes/{sandbox_id}/logs")
async def logs(sandbox_id: str) -> Response:
    return _refuse(*LOGS)


def _unoffered(what: str, why: str) -> object:
    async def endpoint(request: Request) -> Response:
        return _refuse(what, why)

    return endpoint


for _prefixes, _what, _why in UNOFFERED:
    for _prefix in _prefixes:
        router.add_api_route(_prefix, _unoffered(_what, _why), methods=METHODS)  # type: ignore[arg-type]
        router.add_api_route(_prefix + "/{rest:path}", _unoffered(_what, _why), methods=METHODS)  # type: ignore[arg-type]


async def _unknown(request: Request) -> Response:
    """E2B's 404 for a path it does not have; 405 (``Allow``) for a path it has with
    another method."""
    allowed: set[str] = set()
    for route in request.app.router.routes:
        if getattr(route, "endpoint", None) is _unknown:
            continue
        match, _ = route.matches(request.scope)
        if match is Match.PARTIAL:
            allowed |= set(getattr(route, "methods", None) or ())
    if allowed:
        methods = ", ".join(sorted(allowed))
        response = error(405, f"{request.method} is not allowed on {request.url.path} (allowed: {methods})")
        response.headers["Allow"] = methods
        return response
    return error(404, f"no route {request.method} {request.url.path} in E2B's API")


for _prefix in UNKNOWN:
    router.add_api_route(_prefix, _unknown, methods=METHODS)
    router.add_api_route(_prefix + "/{rest:path}", _unknown, methods=METHODS)


__all__ = ["LOGS", "UNOFFERED", "router"]
