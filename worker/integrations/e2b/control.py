"""E2B's control plane (its OpenAPI, ``spec/openapi.yml`` in e2b-dev/E2B): the routes
E2B's SDKs call to make, find, time and end sandboxes. Both spellings the SDKs have used
are served (2.45 and older create, connect and list under ``/sandboxes``, 2.63 under
``/v2/sandboxes``):

    POST   /sandboxes, /v2/sandboxes                  create            201 Sandbox
    GET    /sandboxes                                 list (running)    200 [ListedSandbox]
    GET    /v2/sandboxes                              list (paged)      200 [ListedSandbox]
    GET    /sandboxes/{id}                            info              200 SandboxDetail
    DELETE /sandboxes/{id}                            kill              204
    POST   /sandboxes/{id}/connect, /v2/.../connect   connect/resume    200 running, 201 resumed
    POST   /sandboxes/{id}/resume                     resume (older)    201
    POST   /sandboxes/{id}/timeout                    set the lifetime  204
    POST   /sandboxes/{id}/refreshes                  extend it         204
    POST   /sandboxes/{id}/pause                      pause             204 (409 paused)
    PUT    /sandboxes/{id}/network                    egress rules      204

Metrics (:mod:`.usage`), snapshots and forks (:mod:`.snapshots`) and what loom does not
offer (:mod:`.refusals`: 501, and E2B's 404 for any other path under its prefixes) are
beside these; :func:`routes` gives them all, in the order they are matched. How E2B's
conventions map onto loom's (templates, ``/home/user``, env vars, network): :mod:`.
conventions`; the records and lifetimes: :mod:`.records`, :mod:`.plane`.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from worker.http.settings import create_with
from worker.workspace_settings import parse

from . import refusals, snapshots, usage
from .answers import ENVD_VERSION, E2BError, answered, detail_json, error, listed_json, read_json, sandbox_json
from .conventions import (
    NewSandbox,
    Timeout,
    check_timeout,
    egress_of,
    parse_body,
    plan_create,
    template_image,
    unknown_template,
)
from .listing import page, parse_query
from .plane import Plane, plane_of
from .records import DEFAULT_TIMEOUT, SandboxRecord, new_sandbox_id

router = APIRouter(include_in_schema=False)
#: The older resume's lifetime when none is given (E2B's ResumedSandbox).
RESUME_TIMEOUT = 15
_IDEMPOTENCY_KEY = re.compile(r"[a-z0-9-]{1,255}")


async def _plane(request: Request) -> Plane:
    return await plane_of(request.app).ready()


def _created(plane: Plane, rec: SandboxRecord, status: int = 201) -> JSONResponse:
    return JSONResponse(sandbox_json(rec, plane.envd_token(rec.id)), status_code=status)


# -- create ---------------------------------------------------------------------------------


async def _create(request: Request, default_timeout: int) -> Response:
    plane = await _plane(request)
    settings = plane.settings
    body = parse_body(NewSandbox, await read_json(request))
    key = request.headers.get("idempotency-key")
    if key is not None:
        if not _IDEMPOTENCY_KEY.fullmatch(key):
            raise E2BError(400, "Idempotency-Key: 1-255 lowercase letters, digits and hyphens")
        made = plane.by_key(key)
        if made is not None:
            rec = plane.store.get(made)
            if rec is not None and rec.alive(time.time()):
                return _created(plane, rec)
    plan = plan_create(settings, body, default_timeout=default_timeout)
    parse(plan.settings)  # (a refused env var is a 400 before anything is made)
    async with plane.creating():
        image = template_image(settings, plan.template)
        claimed = await plane.warm.take() if image is not None and plane.warm.fits(plan.settings, image) else None
        if claimed is not None:
            sandbox_id, path = claimed
        else:
            sandbox_id = new_sandbox_id()
            path, image = await _workspace(plane, sandbox_id, plan.template, image, plan.settings)
        now = time.time()
        rec = SandboxRecord(
            id=sandbox_id,
            template=plan.template,
            image=image,
            metadata=plan.metadata,
            env_vars=plan.env_vars,
            started_at=now,
            end_at=now + plan.timeout,
            timeout=plan.timeout,
            allow_internet_access=plan.allow_internet_access,
            network=plan.network,
            auto_pause=plan.auto_pause,
            auto_resume=plan.auto_resume,
            idempotency_key=key,
        )
        try:
            await plane.register(rec, path)
        except BaseException:
            await plane.discard(sandbox_id, path)
            raise
        finally:
            plane.warm.taken(sandbox_id)
    plane.warm.fill_soon()
    return _created(plane, rec)


async def _workspace(
    plane: Plane, sandbox_id: str, template: str, image: str | None, own: dict[str, Any]
) -> tuple[Path, str]:
    """A new workspace for sandbox ``sandbox_id``: of ``image`` (the template's), else a
    fork of the snapshot ``template`` names; and its image. Raises E2BError 404 (neither),
    SettingsError, the snapshots' and the sandbox's errors."""
    service, settings = plane.service, plane.settings
    if image is None:
        snap = await snapshots.find(service, template)
        if snap is None:
            raise unknown_template(settings, template)
        path = (await snapshots.sandbox_from(service, snap.id, [sandbox_id], own))[0]
        return path, str(snap.settings.get("image") or settings.image)
    if image != settings.image:
        own = {**own, "image": image}
    info = await create_with(service.registry, service.workspaces, sandbox_id, parse(own))
    return Path(info.path), image


@router.post("/v2/sandboxes")
@answered
async def create(request: Request) -> Response:
    """Create a sandbox: a new workspace (its id the sandbox's), its container starting
    in the background; answered at once with E2B's ``Sandbox`` (201)."""
    return await _create(request, 300)


@router.post("/sandboxes")
@answered
async def create_v1(request: Request) -> Response:
    """The older create (E2B's ``NewSandbox``: a 15 s lifetime when none is given)."""
    return await _create(request, 15)


# -- find -----------------------------------------------------------------------------------


async def _listed(plane: Plane, request: Request, *, paged: bool) -> Response:
    query = parse_query(request.query_params, paged=paged)
    found = [(rec, path) for rec, path in await plane.sandboxes() if query.matches(rec)]
    shown, token = page(
        found,
        lambda item: (item[0].started_at, item[0].id),
        descending=query.descending,
        limit=query.limit,
        token=query.next_token,
    )
    sizes = await asyncio.to_thread(plane.sizes, [path for _rec, path in shown])
    headers = {}
    if query.states is None or "running" in query.states:  # (E2B's: only when running ones were asked for)
        headers["X-Total-Running"] = str(sum(1 for rec, _ in found if rec.state == "running"))
    if token is not None:
        headers["X-Next-Token"] = token
    return JSONResponse([listed_json(rec, sizes[path]) for rec, path in shown], headers=headers)


@router.get("/v2/sandboxes")
@answered
async def list_sandboxes(request: Request) -> Response:
    """Sandboxes, running and paused, newest first, filtered and paged (:mod:`.listing`)."""
    return await _listed(await _plane(request), request, paged=True)


@router.get("/sandboxes")
@answered
async def list_sandboxes_v1(request: Request) -> Response:
    """The older list: running sandboxes, filtered by metadata only, in one page."""
    return await _listed(await _plane(request), request, paged=False)


@router.get("/sandboxes/{sandbox_id}")
@answered
async def info(request: Request, sandbox_id: str) -> Response:
    """E2B's ``SandboxDetail``: template, metadata, start and end, state, CPU, memory and
    disk, network and lifecycle as asked."""
    plane = await _plane(request)
    path, rec = await plane.find(sandbox_id)
    sizes = await asyncio.to_thread(plane.sizes, [path])
    return JSONResponse(detail_json(rec, sizes[path], plane.envd_token(sandbox_id)))


# -- lifetimes ------------------------------------------------------------------------------


@router.delete("/sandboxes/{sandbox_id}")
@answered
async def kill(request: Request, sandbox_id: str) -> Response:
    """Kill: its container removed, gone for E2B's API (204); 404 when there is none."""
    plane = await _plane(request)
    path, rec = await plane.find(sandbox_id)
    await plane.kill(rec, path)
    return Response(status_code=204)


async def _connect(request: Request, sandbox_id: str, *, resume_only: bool = False) -> Response:
    plane = await _plane(request)
    body = parse_body(Timeout, await read_json(request))
    # E2B's defaults when none is given: connect's 300 s (ConnectSandbox), the older
    # resume's 15 s (ResumedSandbox).
    default = RESUME_TIMEOUT if resume_only else DEFAULT_TIMEOUT
    timeout = check_timeout(plane.settings, default if body.timeout is None else body.timeout)
    path, rec = await plane.find(sandbox_id)
    if rec.state == "paused":
        rec = await plane.resume(rec, path, timeout)
        return _created(plane, rec, 201)
    if resume_only:
        raise E2BError(409, f"sandbox {sandbox_id!r} is already running")
    # E2B's connect only ever extends a lifetime (one with no end stays without).
    end = time.time() + timeout
    if rec.end_at is not None and end > rec.end_at:
        rec = rec.model_copy(update={"end_at": end, "timeout": timeout})
        await plane.save(rec)
    plane.start_soon(sandbox_id, path)  # (its container may have stopped: idle, a restart)
    return _created(plane, rec, 200)


@router.post("/v2/sandboxes/{sandbox_id}/connect")
@router.post("/sandboxes/{sandbox_id}/connect")
@answered
async def connect(request: Request, sandbox_id: str) -> Response:
    """Connect: a running sandbox's lifetime extended to ``timeout`` from now if that is
    later (200); a paused one resumed with it (201)."""
    return await _connect(request, sandbox_id)


@router.post("/sandboxes/{sandbox_id}/resume")
@answered
async def resume(request: Request, sandbox_id: str) -> Response:
    """The older resume: a paused sandbox running again (201); 409 when it runs."""
    return await _connect(request, sandbox_id, resume_only=True)


@router.post("/sandboxes/{sandbox_id}/timeout")
@answered
async def set_timeout(request: Request, sandbox_id: str) -> Response:
    """Its lifetime: ``timeout`` seconds from now, shorter or longer than before (204)."""
    plane = await _plane(request)
    body = parse_body(Timeout, await read_json(request))
    if body.timeout is None:
        raise E2BError(400, "timeout: required (seconds from now)")
    timeout = check_timeout(plane.settings, body.timeout)
    _path, rec = await plane.find(sandbox_id)
    await plane.save(rec.model_copy(update={"end_at": time.time() + timeout, "timeout": timeout}))
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes")
@answered
async def refresh(request: Request, sandbox_id: str) -> Response:
    """Keep it alive ``duration`` more seconds from now (at most 3600), if that is later
    than its end (204)."""
    plane = await _plane(request)
    body = parse_body(Timeout, await read_json(request))
    duration = 60 if body.duration is None else body.duration
    if duration > 3600:
        raise E2BError(400, "duration: at most 3600 seconds")
    _path, rec = await plane.find(sandbox_id)
    end = time.time() + duration
    if rec.end_at is not None and end > rec.end_at:
        await plane.save(rec.model_copy(update={"end_at": end}))
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/pause")
@answered
async def pause(request: Request, sandbox_id: str) -> Response:
    """Pause: its container stopped, its files kept, its processes ended; 409 when paused
    already. Whatever ``memory`` asks (E2B's SDKs before 2.5x ask for it on every pause),
    loom keeps no memory: the paused sandbox's ``pauseMode`` says ``filesystem``."""
    plane = await _plane(request)
    parse_body(Timeout, await read_json(request))
    path, rec = await plane.find(sandbox_id)
    await plane.pause(rec, path)
    return Response(status_code=204)


@router.put("/sandboxes/{sandbox_id}/network")
@answered
async def update_network(request: Request, sandbox_id: str) -> Response:
    """Replace its egress rules (E2B's ``SandboxNetworkUpdateConfig``, mapped as at create:
    :func:`.conventions.egress_of`); new connections follow them at once. Going from no
    network at all to some (or back) starts the sandbox's container again at its next use
    (files kept, processes not)."""
    plane = await _plane(request)
    raw = await read_json(request)
    if not isinstance(raw, dict):
        raise E2BError(400, "the body is a JSON object (SandboxNetworkUpdateConfig)")
    allow = raw.get("allow_internet_access")
    network = {k: v for k, v in raw.items() if k != "allow_internet_access"}
    egress = egress_of(plane.settings, allow if isinstance(allow, bool) else None, network)
    path, rec = await plane.find(sandbox_id)
    await plane.service.local.configure_workspace(path, {"egress": egress})
    await plane.save(
        rec.model_copy(
            update={"network": network or None, "allow_internet_access": allow if isinstance(allow, bool) else None}
        )
    )
    return Response(status_code=204)


def routes(settings: Any) -> list[Any]:
    """Every route of E2B's control plane, in the order they are matched (the catch-all
    of :mod:`.refusals` last)."""
    # /sandboxes/metrics before /sandboxes/{id}; DELETE /templates/{id} (a snapshot)
    # before the templates' 501.
    return [
        *usage.router.routes,
        *router.routes,
        *snapshots.router.routes,
        *refusals.router.routes,
    ]


__all__ = ["ENVD_VERSION", "error", "routes"]
