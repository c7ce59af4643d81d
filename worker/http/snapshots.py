"""Snapshots, forks and restore over HTTP (an ``APIRouter``; see :mod:`worker.snapshots`).

    GET    /v1/workspaces/{id}/snapshots              its snapshots, and where it was forked from
    POST   /v1/workspaces/{id}/snapshots              {"name"?, "with_scratch"?}  -> 201 the snapshot
    GET    /v1/workspaces/{id}/snapshots/{ref}        one (id or name): size, files, parent, forks
    DELETE /v1/workspaces/{id}/snapshots/{ref}?force= 409 with live forks unless forced
    POST   /v1/workspaces/{id}/fork                   {"snapshot"?, "count"}  -> 201 the new workspaces
    POST   /v1/workspaces/{id}/restore                {"snapshot", "dry_run"?}  recorded: undo reverts it

Forks are new workspaces of the service (under ``LOOM_WORKSPACE_ROOT``, ids
``<id>-<6 hex>``). A snapshot is reachable here only through a workspace of this service,
its own or (for restore) any of the service's. The routes take the workspace's place in
the service's per-workspace order, as calls do. Refusals: 404 no such snapshot, 409 live
forks or a limit (``LOOM_MAX_SNAPSHOTS``, ``LOOM_MAX_SNAPSHOT_BYTES``), 507 the disk
filled (the partial copy removed), 503 the sandbox or the store failed.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from ..quoting import quote_path
from ..service import WORKSPACE_ID_PATTERN, Workspaces
from ..snapshots import (
    MAX_FORKS,
    Snapshot,
    SnapshotNotFoundError,
    Snapshots,
)
from .common import WorkspaceId
from .state import service_of

NAME_PATTERN = WORKSPACE_ID_PATTERN
SnapshotRef = Annotated[str, PathParam(pattern=NAME_PATTERN, description="Snapshot id (snap-...) or name.")]

router = APIRouter(
    tags=["snapshots"],
    responses={
        404: {"description": "No such workspace or snapshot"},
        409: {"description": "Live forks (delete without force), or a snapshot limit"},
        503: {"description": "The sandbox or the snapshot store failed"},
        507: {"description": "The disk filled during the copy; nothing was kept"},
    },
)


class CreateSnapshot(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, pattern=NAME_PATTERN, description="A name (else only its id).")
    with_scratch: bool = Field(False, description="Also keep the sandbox's /tmp and $HOME.")


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    snapshot: str | None = Field(
        None, pattern=NAME_PATTERN, description="The snapshot (id or name); none: snapshot the workspace first."
    )
    count: int = Field(1, ge=1, le=MAX_FORKS, description="How many forks.")


class RestoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    snapshot: str = Field(pattern=NAME_PATTERN, description="The snapshot (id or name).")
    dry_run: bool = Field(False, description="Return what it would change and the diff; change nothing.")


class SnapshotList(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workspace: str
    origin: dict[str, Any] | None = Field(None, description="The snapshot this workspace was forked from.")
    snapshots: list[Snapshot]


class ForkedWorkspace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    path: str


class Forked(BaseModel):
    model_config = ConfigDict(extra="forbid")
    snapshot: str
    workspaces: list[ForkedWorkspace]


class RestoreOut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    snapshot: str
    call_id: str | None = Field(description='Undo it with POST .../undo {"call_id": ...}; null for a dry run.')
    dry_run: bool
    created: list[str]
    modified: list[str]
    removed: list[str]
    failed: list[str]
    entries: list[int]
    diff: str


def _snapshots(request: Request) -> Snapshots:
    return service_of(request.app).snapshots


async def _own(snaps: Snapshots, workspaces: Workspaces, ref: str, path: Path | None) -> Snapshot:
    """Snapshot ``ref`` (by name among ``path``'s), only if of a workspace of this service.
    Raises SnapshotNotFoundError."""
    snap = await snaps.shown(await snaps.get(ref, path))
    if Path(snap.workspace).parent != workspaces.root or snap.deleted is not None:
        raise SnapshotNotFoundError(f"no snapshot {ref!r}")
    return snap


@router.get("/v1/workspaces/{workspace_id}/snapshots")
async def list_snapshots(request: Request, workspace_id: WorkspaceId) -> SnapshotList:
    """The workspace's snapshots, oldest first, each with its forks; ``origin``: the
    snapshot this workspace was forked from."""
    path = await service_of(request.app).workspaces.locate(workspace_id)
    snaps = _snapshots(request)
    found = [await snaps.shown(s) for s in await snaps.list(path)]
    origin = await snaps.origin(path)
    if origin is not None:  # (an overlay fork is named by its directory, not the engine's mountpoint)
        origin.workspace = await snaps.shown_path(origin.workspace)
    return SnapshotList(workspace=workspace_id, origin=None if origin is None else origin.model_dump(), snapshots=found)


@router.post("/v1/workspaces/{workspace_id}/snapshots", status_code=201)
async def create_snapshot(request: Request, workspace_id: WorkspaceId, body: CreateSnapshot | None = None) -> Snapshot:
    """Snapshot the workspace: its whole tree, settings, where its changelog stands."""
    path = await service_of(request.app).workspaces.locate(workspace_id)
    body = body or CreateSnapshot()
    runner = service_of(request.app).runner
    snaps = _snapshots(request)
    async with runner.slot(), runner.lock(path):
        return await snaps.shown(await snaps.create(path, body.name, with_scratch=body.with_scratch))


@router.get("/v1/workspaces/{workspace_id}/snapshots/{ref}")
async def show_snapshot(request: Request, workspace_id: WorkspaceId, ref: SnapshotRef) -> Snapshot:
    workspaces = service_of(request.app).workspaces
    path = await workspaces.locate(workspace_id)
    return await _own(_snapshots(request), workspaces, ref, path)


@router.delete("/v1/workspaces/{workspace_id}/snapshots/{ref}")
async def delete_snapshot(
    request: Request,
    workspace_id: WorkspaceId,
    ref: SnapshotRef,
    force: bool = Query(False, description="Even with live forks (they stay, independent)."),
) -> dict[str, Any]:
    """Delete a snapshot's files; its lineage is kept. ``left``: the live forks it leaves."""
    workspaces = service_of(request.app).workspaces
    path = await workspaces.locate(workspace_id)
    snaps = _snapshots(request)
    snap = await _own(snaps, workspaces, ref, path)
    left = await snaps.delete(snap.id, force=force)
    return {"id": snap.id, "deleted": True, "left": left}


@router.post("/v1/workspaces/{workspace_id}/fork", status_code=201)
async def fork(request: Request, workspace_id: WorkspaceId, body: ForkRequest) -> Forked:
    """``count`` new workspaces from a snapshot (or from the workspace as it is now), each
    with its own files, settings, changelog (starting at the snapshot) and sandbox."""
    workspaces = service_of(request.app).workspaces
    path = await workspaces.locate(workspace_id)
    snaps = _snapshots(request)
    runner = service_of(request.app).runner
    async with runner.slot():
        if body.snapshot is None:
            async with runner.lock(path):
                snap = await snaps.create(path, "fork-base")
        else:
            snap = await _own(snaps, workspaces, body.snapshot, path)
        base = Path(await snaps.shown_path(snap.workspace)).name[:48]  # an overlay fork's: its id, not "_data"
        names = [f"{base}-{secrets.token_hex(3)}" for _ in range(body.count)]
        made = await snaps.fork(snap.id, body.count, into=workspaces.root, names=names)
        # an overlay fork's files show on the host while its sandbox runs (stopped at exit)
        runner.opened.update(made)
        await snaps.mount_all(made)
    return Forked(snapshot=snap.id, workspaces=[ForkedWorkspace(id=p.name, path=str(p)) for p in made])


@router.post("/v1/workspaces/{workspace_id}/restore")
async def restore(request: Request, workspace_id: WorkspaceId, body: RestoreRequest) -> RestoreOut:
    """Put the workspace back to a snapshot byte for byte; every change is recorded as one
    call of the changelog (``call_id``), so ``POST .../undo {"call_id"}`` reverts it."""
    workspaces = service_of(request.app).workspaces
    path = await workspaces.locate(workspace_id)
    snaps = _snapshots(request)
    runner = service_of(request.app).runner
    snap = await _own(snaps, workspaces, body.snapshot, path)
    async with runner.slot(), runner.lock(path):
        done = await snaps.restore(path, snap.id, dry_run=body.dry_run)
    from ..result import safe_text

    out = done.as_dict()
    out["diff"] = safe_text(out["diff"])
    for key in ("created", "modified", "removed", "failed"):
        out[key] = [quote_path(p) for p in out[key]]
    return RestoreOut(**out)
