"""HTTP routes for one workspace's own sandbox settings (see :mod:`worker.workspace_settings`).

    GET    /v1/workspaces/{id}            its settings and the effective ones
    PATCH  /v1/workspaces/{id}            {"memory": "2g", "image": null, ...}: change them
    (and ``POST /v1/workspaces`` takes {"name"?, "settings"?}: see :func:`create_with`)

A refused value (:class:`~worker.workspace_settings.SettingsError`) is a 422 whose
``detail`` names the field (the error table, :mod:`.errors`), as FastAPI's own validation
errors do (``{"detail": [{"loc": ["body", "memory"], "msg": ...}]}``); nothing is stored.
A change takes effect at the workspace's next call, which recreates its container (the
files are kept); the answer says so.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ..service import Workspaces
from ..workspace_settings import SettingsError, WorkspaceSettings
from .common import WS_ERRORS, WorkspaceId
from .state import ServiceDep

router = APIRouter(tags=["workspaces"])
_RESPONSES = {**WS_ERRORS, 422: {"description": "A refused setting; detail[0].loc names it"}}
_WS_PATH = "/v1/workspaces/{workspace_id}"


def _configurable(registry: Any) -> Any:
    """``registry``, when it keeps per-workspace settings. Raises SettingsError otherwise."""
    if getattr(registry, "configs", None) is None:
        raise SettingsError("settings", "this service has no per-workspace settings")
    return registry


@router.get(_WS_PATH, responses=_RESPONSES)
async def show(service: ServiceDep, workspace_id: WorkspaceId) -> dict[str, Any]:
    """The workspace: its path, its own settings and those its sandbox is made with."""
    path = await service.workspaces.locate(workspace_id)
    own, eff = await _configurable(service.registry).workspace_settings(path)
    return {"id": workspace_id, "path": str(path), "settings": own.set_fields(), "effective": eff}


@router.patch(_WS_PATH, responses=_RESPONSES)
async def change(service: ServiceDep, workspace_id: WorkspaceId, body: WorkspaceSettings) -> dict[str, Any]:
    """Change the settings: a field given replaces the workspace's value, a field given
    as null goes back to the process default, a field left out stays as it is. The
    sandbox is recreated with them at the next call (files kept)."""
    path = await service.workspaces.locate(workspace_id)
    changes = {name: getattr(body, name) for name in body.model_fields_set}
    done = await _configurable(service.registry).configure_workspace(path, changes)
    return {"id": workspace_id, **done.as_dict()}


async def create_with(
    registry: Any, workspaces: Workspaces, name: str | None, settings: WorkspaceSettings | None
) -> Any:
    """``POST /v1/workspaces``: check the settings first (nothing is created when one is
    refused), then make the directory and store them. Raises SettingsError,
    InvalidWorkspaceId, WorkspaceExists."""
    if settings is not None and settings.set_fields() and getattr(registry, "configs", None) is not None:
        await registry.check_settings(settings)
    info = await workspaces.create(name)
    if settings is not None and settings.set_fields() and getattr(registry, "configs", None) is not None:
        try:
            await registry.configure_workspace(info.path, settings.set_fields())
        except BaseException:
            # Refused by what only the new directory can tell (allow_root and its owner):
            # the workspace was never handed out, so it goes with the refusal.
            await workspaces.delete_files(info.id)
            raise
    return info
