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

from ..registry.contract import HoldsWorkspaces, LocalRegistry, ServiceRegistry
from ..service import CreatesConfigured, WorkspaceInfo, Workspaces
from ..workspace_settings import SettingsError, WorkspaceSettings
from .common import WS_ERRORS, WorkspaceId
from .state import ServiceDep

router = APIRouter(tags=["workspaces"])
_RESPONSES = {**WS_ERRORS, 422: {"description": "A refused setting; detail[0].loc names it"}}
_WS_PATH = "/v1/workspaces/{workspace_id}"


def _configurable(registry: LocalRegistry) -> LocalRegistry:
    """``registry``, when it keeps per-workspace settings. Raises SettingsError otherwise."""
    if registry.configs is None:
        raise SettingsError("settings", "this service has no per-workspace settings")
    return registry


@router.get(_WS_PATH, responses=_RESPONSES)
async def show(service: ServiceDep, workspace_id: WorkspaceId) -> dict[str, Any]:
    """The workspace: its path, its own settings and those its sandbox is made with."""
    path = await service.workspaces.locate(workspace_id)
    own, eff = await _configurable(service.local).workspace_settings(path)
    return {"id": workspace_id, "path": str(path), "settings": own.set_fields(), "effective": eff}


@router.patch(_WS_PATH, responses=_RESPONSES)
async def change(service: ServiceDep, workspace_id: WorkspaceId, body: WorkspaceSettings) -> dict[str, Any]:
    """Change the settings: a field given replaces the workspace's value, a field given
    as null goes back to the process default, a field left out stays as it is. The
    sandbox is recreated with them at the next call (files kept)."""
    path = await service.workspaces.locate(workspace_id)
    changes = {name: getattr(body, name) for name in body.model_fields_set}
    done = await _configurable(service.local).configure_workspace(path, changes)
    return {"id": workspace_id, **done.as_dict()}


async def create_with(
    registry: ServiceRegistry, workspaces: Workspaces, name: str | None, settings: WorkspaceSettings | None
) -> WorkspaceInfo:
    """``POST /v1/workspaces``: check the settings first (nothing is created when one is
    refused), then make the directory and store them (workspaces that keep their own
    settings, a cluster's, are given them). Raises SettingsError, InvalidWorkspaceId,
    WorkspaceExists."""
    if settings is None or not settings.set_fields():
        return await workspaces.create(name)
    if isinstance(workspaces, CreatesConfigured):
        return await workspaces.create_configured(name, settings)
    if not isinstance(registry, HoldsWorkspaces) or registry.configs is None:
        return await workspaces.create(name)  # (a service without per-workspace settings)
    await registry.check_settings(settings)
    info = await workspaces.create(name)
    try:
        await registry.configure_workspace(info.path, settings.set_fields())
    except BaseException:
        # Refused by what only the new directory can tell (allow_root and its owner):
        # the workspace was never handed out, so it goes with the refusal.
        await workspaces.delete_files(info.id)
        raise
    return info
