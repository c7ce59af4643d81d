"""The changelog over HTTP: ``GET .../changelog``, ``GET .../diff``, ``POST .../undo``.

Same options as ``loom-worker log|diff|undo``. The changelog of a workspace is the recorder
its registry workspace writes through (so the service records every change a tool makes,
shell commands included); :class:`ChangelogPool` hands the registry one per workspace.
Diff and undo run through the workspace's sandbox, under the same per-workspace lock and
global limit as tool calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sandbox.errors import SandboxError

from ..changelog import (
    Changelog,
    ChangelogError,
    Durability,
    Entry,
    EntryNotFoundError,
    Limits,
    Summary,
    UndoConflictError,
    UndoRefusedError,
    UndoResult,
)
from ..quoting import quote_path, unquote_path
from ..result import safe_text
from ..service import Workspaces
from .app import WorkspaceId


class ChangelogPool:
    """One open :class:`Changelog` per workspace, for ``ToolRegistry(recorder_factory=...)``."""

    def __init__(self, data_dir: Path, durability: Durability = "full", *, limits: Limits | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.durability: Durability = durability
        self.limits = limits
        self._open: dict[Path, Changelog] = {}

    def recorder(self, root: Path) -> Changelog:
        """The changelog of ``root``. Raises ChangelogStorageError."""
        cl = self._open.get(root)
        if cl is None:
            cl = self._open[root] = Changelog.open(
                self.data_dir, root, limits=self.limits, durability=None if self.limits else self.durability
            )
        return cl

    async def aclose(self) -> None:
        for cl in self._open.values():
            await cl.aclose()
        self._open.clear()


class UndoRequest(BaseModel):
    """Exactly one selector: entry, call_id, subtask_id, to, or all."""

    model_config = ConfigDict(extra="forbid")

    entry: int | None = Field(None, ge=1, le=(1 << 63) - 1, description="One entry.")
    call_id: str | None = Field(None, min_length=1, max_length=256, description="Every entry of a call id.")
    subtask_id: str | None = Field(None, min_length=1, max_length=256, description="Every entry of a subtask.")
    to: int | None = Field(None, ge=0, le=(1 << 63) - 1, description="Everything after entry N (0 = everything).")
    all: bool = Field(False, description="Everything.")
    dry_run: bool = Field(False, description="Return the diff it would apply; change nothing.")
    force: bool = Field(False, description="Overwrite files that changed since the entry.")


class DiffOut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    diff: str


class _NoChangelog(Exception):
    pass


def add_routes(app: FastAPI, workspaces: Workspaces, auth: list[Any], responses: dict[int | str, Any]) -> None:
    """Mount the three routes on ``app`` (whose state holds ``runner`` and ``registry``)."""
    responses = {
        **responses,
        409: {"description": "Undo conflict or refusal, or no changelog recorded by this service"},
        503: {"description": "The sandbox is unavailable"},
    }

    async def changelog_and_box(request: Request, ws_id: str) -> tuple[Path, Changelog, Any]:
        path = workspaces.path(ws_id)
        ws = await request.app.state.registry.workspace(path)
        if not isinstance(ws.recorder, Changelog):
            raise _NoChangelog
        return path, ws.recorder, ws.sandbox

    @app.exception_handler(_NoChangelog)
    async def _no_changelog(_r: Request, _e: Exception) -> JSONResponse:
        return JSONResponse({"detail": "This service records no changelog"}, status_code=409)

    @app.exception_handler(UndoConflictError)
    async def _conflict(_r: Request, e: Exception) -> JSONResponse:
        conflicts = getattr(e, "conflicts", [])
        return JSONResponse({"detail": str(e), "conflicts": conflicts}, status_code=409)

    @app.exception_handler(UndoRefusedError)
    async def _refused(_r: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=409)

    @app.exception_handler(EntryNotFoundError)
    async def _no_entry(_r: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=404)

    @app.exception_handler(SandboxError)
    async def _sandbox(_r: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"detail": f"Sandbox unavailable: {e}"}, status_code=503)

    @app.exception_handler(ChangelogError)
    async def _changelog(_r: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"detail": f"Changelog unavailable: {e}"}, status_code=503)

    ws_path = "/v1/workspaces/{workspace_id}"

    @app.get(f"{ws_path}/changelog", tags=["changelog"], dependencies=auth, responses=responses)
    async def changelog(
        request: Request,
        workspace_id: WorkspaceId,
        path: str | None = Query(None, max_length=4096, description="Only entries for this path."),
        call_id: str | None = Query(None, max_length=256),
        subtask_id: str | None = Query(None, max_length=256),
        limit: int | None = Query(None, ge=1, le=100_000, description="Only the last N entries."),
    ) -> list[Entry]:
        _p, cl, _box = await changelog_and_box(request, workspace_id)
        path = None if path is None else unquote_path(path)
        return [e.shown() for e in await cl.log(path=path, call_id=call_id, subtask_id=subtask_id, limit=limit)]

    @app.get(f"{ws_path}/changelog/{{entry_id}}/members", tags=["changelog"], dependencies=auth, responses=responses)
    async def members(
        request: Request, workspace_id: WorkspaceId, entry_id: int = PathParam(ge=0, le=(1 << 63) - 1)
    ) -> list[str]:
        """The paths a group entry stands for (``detail`` says ``group: ...``), quoted as
        the changelog quotes paths; [] for any other entry. 404 for an unknown entry."""
        _p, cl, _box = await changelog_and_box(request, workspace_id)
        return [quote_path(p) for p in await cl.members(entry_id)]

    @app.get(f"{ws_path}/diff", tags=["changelog"], dependencies=auth, responses=responses)
    async def diff(
        request: Request,
        workspace_id: WorkspaceId,
        path: str | None = Query(None, max_length=4096, description="Only this workspace-relative path."),
        summary: bool = Query(False, description="Created/modified/deleted/renamed paths instead of a diff."),
    ) -> DiffOut | Summary:
        p, cl, box = await changelog_and_box(request, workspace_id)
        if summary:
            return (await cl.summary()).shown()
        async with request.app.state.runner.lock(p):
            return DiffOut(diff=safe_text(await cl.diff(box, None if path is None else unquote_path(path))))

    @app.post(f"{ws_path}/undo", tags=["changelog"], dependencies=auth, responses=responses)
    async def undo(request: Request, workspace_id: WorkspaceId, body: UndoRequest) -> UndoResult:
        selectors = [
            body.entry is not None,
            body.call_id is not None,
            body.subtask_id is not None,
            body.to is not None,
            body.all,
        ]
        if sum(selectors) != 1:
            return JSONResponse(  # type: ignore[return-value]
                {
                    "detail": [
                        {
                            "loc": ["body"],
                            "type": "value_error",
                            "msg": "give exactly one of entry, call_id, subtask_id, to, all",
                        }
                    ]
                },
                status_code=422,
            )
        p, cl, box = await changelog_and_box(request, workspace_id)
        runner = request.app.state.runner
        async with runner.slot(), runner.lock(p):
            try:
                result = await cl.undo(
                    box,
                    entry=body.entry,
                    call_id=body.call_id,
                    subtask_id=body.subtask_id,
                    to=body.to,
                    all=body.all,
                    dry_run=body.dry_run,
                    force=body.force,
                )
                return result.shown()
            except ValueError as e:
                return JSONResponse(  # type: ignore[return-value]
                    {"detail": [{"loc": ["body"], "type": "value_error", "msg": str(e)}]}, status_code=422
                )


__all__ = ["ChangelogPool", "UndoRequest", "add_routes"]
