"""E2B's control plane (its OpenAPI, ``spec/openapi.yml`` in e2b-dev/E2B): a sandbox is
created, connected to, described and killed. (Being completed: lists, timeouts, pause,
metrics, snapshots and forks.)"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from worker.http.state import Service

from .target import SandboxNotFound, target_of

#: The envd version loom answers as (E2B's SDKs turn features on by it).
ENVD_VERSION = "0.5.7"
DEFAULT_TEMPLATE = "base"

router = APIRouter(include_in_schema=False)


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def error(status: int, message: str) -> JSONResponse:
    """An error as E2B's API answers one."""
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _sandbox(service: Service, sandbox_id: str, template: str) -> dict[str, Any]:
    return {
        "templateID": template,
        "sandboxID": sandbox_id,
        "clientID": "loom",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": service.access.envd_token(sandbox_id),
        # (E2B's token for a sandbox whose ports are not public, as loom's never are; the
        # code interpreter's SDK sends it, and no other, on its context requests: the
        # guard takes it as the access token, worker.auth.)
        "trafficAccessToken": service.access.envd_token(sandbox_id),
        "domain": None,
    }


@router.post("/sandboxes")
@router.post("/v2/sandboxes")
async def create(request: Request) -> Response:
    service = _service(request)
    body = await request.json()
    template = str(body.get("templateID") or DEFAULT_TEMPLATE)
    info = await service.workspaces.create("i" + secrets.token_hex(10))
    return JSONResponse(_sandbox(service, info.id, template), status_code=201)


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect(request: Request, sandbox_id: str) -> Response:
    service = _service(request)
    try:
        await target_of(request, sandbox_id)
    except SandboxNotFound as e:
        return error(404, str(e))
    return JSONResponse(_sandbox(service, sandbox_id, DEFAULT_TEMPLATE), status_code=200)


@router.delete("/sandboxes/{sandbox_id}")
async def kill(request: Request, sandbox_id: str) -> Response:
    service = _service(request)
    try:
        t = await target_of(request, sandbox_id)
    except SandboxNotFound as e:
        return error(404, str(e))
    await service.local.stop(t.path)
    await service.workspaces.release(sandbox_id)
    return Response(status_code=204)


def routes(settings: Any) -> list[Any]:
    return list(router.routes)
