"""The service's workspaces, directories under ``LOOM_WORKSPACE_ROOT`` (:class:`worker.service.Workspaces`):

    POST   /v1/workspaces            {"name"?, "settings"?}   creates <root>/<id>
    GET    /v1/workspaces
    DELETE /v1/workspaces/{id}?delete_files=false              stops its sandbox

(A workspace's own settings, ``GET``/``PATCH /v1/workspaces/{id}``: :mod:`.settings`.)
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from pydantic import Field

from sandbox.logs import get_logger

from ..service import WORKSPACE_ID_PATTERN
from ..workspace_settings import SettingsError, WorkspaceSettings
from .common import ERRORS, WS_ERRORS, Problem, StrictModel, WorkspaceId
from .lifespan import stop_sandbox
from .settings import create_with
from .state import ServiceDep

log = get_logger("worker.http")

router = APIRouter(tags=["workspaces"])


class CreateWorkspace(StrictModel):
    name: str | None = Field(None, pattern=WORKSPACE_ID_PATTERN, description="Id to use (random when absent).")
    settings: WorkspaceSettings | None = Field(
        None, description="Its own sandbox settings (image, runtime, limits, env, CA bundle); see PATCH."
    )


class WorkspaceOut(StrictModel):
    id: str
    path: str = Field(description="Absolute path on the host (identical inside the worker container).")
    node: str | None = Field(None, description="Ray's id of the node holding it (a cluster's service only).")
    state: str | None = Field(None, description="ready, or lost when its node died (a cluster's service only).")


@router.post(
    "/v1/workspaces",
    status_code=201,
    responses={**ERRORS, 409: {"model": Problem, "description": "Name already taken"}},
)
async def create_workspace(service: ServiceDep, body: CreateWorkspace | None = None) -> WorkspaceOut:
    try:
        info = await create_with(
            service.registry, service.workspaces, body.name if body else None, body.settings if body else None
        )
    except SettingsError as e:  # a field of the body's "settings"
        raise SettingsError(f"settings.{e.field}", e.message) from None
    log.info("workspace.created", workspace_id=info.id)
    return WorkspaceOut(id=info.id, path=info.path, node=info.node, state=info.state)


@router.get("/v1/workspaces", responses=ERRORS)
async def list_workspaces(service: ServiceDep) -> list[WorkspaceOut]:
    return [WorkspaceOut(id=w.id, path=w.path, node=w.node, state=w.state) for w in await service.workspaces.list()]


@router.delete("/v1/workspaces/{workspace_id}", responses=WS_ERRORS)
async def delete_workspace(
    service: ServiceDep,
    workspace_id: WorkspaceId,
    delete_files: bool = Query(False, description="Also delete the directory and its files."),
) -> dict[str, Any]:
    path = await service.workspaces.locate(workspace_id)
    runner = service.runner
    async with runner.lock(path):
        stopped = await stop_sandbox(service.registry, path)
        runner.forget(path)
        if delete_files:
            await service.workspaces.delete_files(workspace_id)
        await service.workspaces.release(workspace_id)
    log.info("workspace.deleted", workspace_id=workspace_id, files_deleted=delete_files)
    return {"id": workspace_id, "sandbox_stopped": stopped, "files_deleted": delete_files}
