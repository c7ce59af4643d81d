"""E2B's snapshots and forks, mapped onto loom's (:mod:`worker.snapshots`):

    POST   /sandboxes/{id}/snapshots   {"name"?}            201 SnapshotInfo
    GET    /snapshots?sandboxID&name&limit&nextToken        200 [SnapshotInfo], X-Next-Token
    DELETE /templates/{snapshotID}                          204; 404 none
    POST   /sandboxes/{id}/fork        {"timeout"?, "count"?}   201 [SandboxForkResult]

An E2B snapshot is a loom snapshot of the sandbox's workspace: its files (``/home/user``),
its settings and where its changelog stood; its ``snapshotID`` is loom's id, its
``names`` the name it was given. Neither memory nor processes are kept (whatever
``memory`` asks), nor ``/tmp``. ``Sandbox.create(<snapshot id or name>)`` makes a sandbox
from one: a fork, a new workspace with its own files and a changelog that starts at the
snapshot. ``fork`` snapshots the sandbox and makes ``count`` such sandboxes at once (the
snapshot itself is then deleted: each fork's files are its own).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from worker.http.state import Service
from worker.service import WORKSPACE_ID_PATTERN, check_workspace_id
from worker.snapshots import MAX_FORKS, Snapshot, SnapshotNotFoundError

from .answers import E2BError, answered, read_json, sandbox_json
from .conventions import _Body, base_settings, check_timeout, parse_body, template_image
from .listing import limit_of, page
from .plane import Plane, plane_of
from .records import new_sandbox_id

router = APIRouter(include_in_schema=False)
#: A fork's lifetime when none is asked (E2B's ``SandboxForkRequest``).
FORK_TIMEOUT = 15


class SnapshotRequest(_Body):
    name: str | None = Field(None, min_length=1, max_length=64)
    memory: bool | None = None


class ForkRequest(_Body):
    timeout: int | None = Field(None, ge=0)
    count: int = Field(1, ge=1, le=100)


def info_json(snap: Snapshot) -> dict[str, Any]:
    """E2B's ``SnapshotInfo``."""
    return {"snapshotID": snap.id, "names": [snap.name] if snap.name else []}


async def _ours(service: Service, snap: Snapshot) -> Snapshot | None:
    """``snap`` as users see it (a sandbox made from a snapshot is an overlay fork on an
    ext4 host: named by its directory under the root, not the engine's mountpoint), when
    it is a live snapshot of one of the service's workspaces; else None."""
    snap = await service.snapshots.shown(snap)
    return snap if Path(snap.workspace).parent == service.workspaces.root and snap.deleted is None else None


async def find(service: Service, ref: str) -> Snapshot | None:
    """The live snapshot of one of the service's workspaces that ``ref`` (an id, or a name:
    the newest of that name; a ``:tag`` ignored) names, or None."""
    for name in dict.fromkeys([ref, ref.rsplit(":", 1)[0]]):
        try:
            check_workspace_id(name)
            snap = await service.snapshots.get(name)
        except (SnapshotNotFoundError, ValueError):
            continue
        if (ours := await _ours(service, snap)) is not None:
            return ours
    return None


async def sandbox_from(
    service: Service, snapshot_id: str, sandbox_ids: list[str], settings: dict[str, Any]
) -> list[Path]:
    """New workspaces ``sandbox_ids`` from snapshot ``snapshot_id`` (all or none), each given
    ``settings`` on top of the snapshot's. Raises SnapshotNotFoundError,
    SnapshotDiskFullError, SettingsError, the sandbox's errors."""
    async with service.runner.slot():
        made = await service.snapshots.fork(
            snapshot_id, len(sandbox_ids), into=service.workspaces.root, names=sandbox_ids
        )
    try:
        for path in made:
            await service.local.configure_workspace(path, settings)
    except BaseException:
        for path in made:  # (all or none, as the forks themselves)
            with contextlib.suppress(Exception):
                await service.workspaces.delete_files(path.name)
        raise
    return made


async def _plane(request: Request) -> Plane:
    return await plane_of(request.app).ready()


@router.post("/sandboxes/{sandbox_id}/snapshots")
@answered
async def create_snapshot(request: Request, sandbox_id: str) -> Response:
    """Snapshot the sandbox's workspace (running or paused): 201 with its id and names."""
    plane = await _plane(request)
    body = parse_body(SnapshotRequest, await read_json(request))  # (``memory``: loom keeps the files only)
    if body.name is not None:
        try:
            check_workspace_id(body.name)
        except ValueError:
            raise E2BError(400, f"name: {body.name!r} does not match {WORKSPACE_ID_PATTERN}") from None
    path, _rec = await plane.find(sandbox_id)
    service = plane.service
    async with service.runner.slot(), service.runner.lock(path):
        snap = await service.snapshots.create(path, body.name)
    return JSONResponse(info_json(snap), status_code=201)


@router.get("/snapshots")
@answered
async def list_snapshots(request: Request) -> Response:
    """The snapshots of the service's sandboxes, newest first, filtered by ``sandboxID``
    and ``name`` (a name or an id), paged as sandboxes are."""
    plane = await _plane(request)
    service = plane.service
    params = request.query_params
    of, name = params.get("sandboxID") or None, params.get("name") or None
    found = [ours for s in await service.snapshots.list() if (ours := await _ours(service, s)) is not None]
    if of is not None:
        found = [s for s in found if Path(s.workspace).name == of]
    if name is not None:
        wanted = {name, name.rsplit(":", 1)[0]}
        found = [s for s in found if s.id in wanted or s.name in wanted]
    shown, token = page(
        found, lambda s: (s.created, s.id), descending=True, limit=limit_of(params), token=params.get("nextToken")
    )
    headers = {"X-Next-Token": token} if token else {}
    return JSONResponse([info_json(s) for s in shown], headers=headers)


@router.delete("/templates/{template_id}")
@answered
async def delete_snapshot(request: Request, template_id: str) -> Response:
    """Delete a snapshot (E2B deletes snapshots as templates): 204; 404 when there is no
    such snapshot. Sandboxes made from it keep their own files. A template that is an
    image is not deleted through E2B's API (501)."""
    plane = await _plane(request)
    if template_image(plane.settings, template_id) is not None:
        raise E2BError(
            501,
            f"deleting template {template_id!r} is not offered by loom-worker: templates are images named in "
            "LOOM_E2B_TEMPLATES",
        )
    snap = await find(plane.service, template_id)
    if snap is None:
        raise E2BError(404, f"snapshot {template_id!r} not found")
    await plane.service.snapshots.delete(snap.id, force=True)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork")
@answered
async def fork(request: Request, sandbox_id: str) -> Response:
    """``count`` new sandboxes with the sandbox's files as they are now, its template,
    metadata, environment and network; each with its own workspace and a lifetime of
    ``timeout`` (15 s when none is asked, as E2B's). All are made or none (the error is
    the answer's)."""
    plane = await _plane(request)
    body = parse_body(ForkRequest, await read_json(request))
    if body.count > MAX_FORKS:
        raise E2BError(400, f"count: at most {MAX_FORKS} forks at once on loom-worker")
    timeout = check_timeout(plane.settings, FORK_TIMEOUT if body.timeout is None else body.timeout)
    path, rec = await plane.find(sandbox_id)
    service = plane.service
    if plane.running() + body.count > plane.settings.e2b_max_sandboxes:
        raise E2BError(
            429,
            f"{body.count} more would be more than the {plane.settings.e2b_max_sandboxes} E2B sandboxes this "
            "service runs at once (LOOM_E2B_MAX_SANDBOXES)",
            retry=False,
        )
    async with service.runner.slot(), service.runner.lock(path):
        snap = await service.snapshots.create(path, None)
    try:
        ids = [new_sandbox_id() for _ in range(body.count)]
        made = await sandbox_from(service, snap.id, ids, base_settings(plane.settings))
    finally:
        await service.snapshots.delete(snap.id, force=True)
    now = time.time()
    out = []
    for new_id, new_path in zip(ids, made, strict=True):
        new = rec.model_copy(
            update={
                "id": new_id,
                "started_at": now,
                "end_at": now + timeout,
                "timeout": timeout,
                "state": "running",
                "paused_at": None,
                "killed_at": None,
                "idempotency_key": None,
                "adopted": False,
            }
        )
        await plane.register(new, new_path)
        out.append({"sandbox": sandbox_json(new, plane.envd_token(new_id))})
    return JSONResponse(out, status_code=201)


__all__ = ["FORK_TIMEOUT", "find", "info_json", "router", "sandbox_from"]
