"""Snapshot tools for an *orchestrating* agent over MCP (``loom-worker mcp --snapshot-tools``).

They are not registry tools, on purpose: a registry tool is what the agent working *in*
a workspace calls (HTTP ``execute``, the per-workspace MCP endpoint, ``tool_calls``), and
a fork is a new sandbox with its own CPU, memory and process limits, so an agent that
could fork itself could multiply its limits. These tools are offered only by a stdio MCP
server its operator starts with ``--snapshot-tools`` for an orchestrator (which then runs
each attempt's agent on a fork, with that fork's own ``loom-worker mcp --workspace``).
They reach the server's workspace and the forks made from it (their lineage is checked on
the host), never another directory, and they change no settings: a fork gets its
snapshot's, which the operator set.

    snapshot_create   {name?, with_scratch?, workspace?}     -> the snapshot
    snapshot_list     {workspace?}                           -> its snapshots, and its origin
    snapshot_delete   {snapshot, force?}
    workspace_fork    {snapshot?, count, workspace?}         -> the new workspaces' directories
    workspace_restore {snapshot, dry_run?, workspace?}       -> what changed, the undo call id
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandbox.errors import SandboxError

from ..changelog import ChangelogError
from .api import MAX_FORKS, Snapshots
from .errors import SnapshotError

_WS = "The workspace directory (default: the server's); only it and the forks made from it."


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateArgs(_Args):
    """Snapshot a workspace: its whole tree, settings and where its changelog stands."""

    name: str | None = Field(None, max_length=128, description="A name for the snapshot.")
    with_scratch: bool = Field(False, description="Also keep the sandbox's /tmp and $HOME.")
    workspace: str | None = Field(None, description=_WS)


class ListArgs(_Args):
    """List a workspace's snapshots (with their forks) and the snapshot it was forked from."""

    workspace: str | None = Field(None, description=_WS)


class DeleteArgs(_Args):
    """Delete a snapshot; refused while forks made from it live, unless forced."""

    snapshot: str = Field(min_length=1, max_length=128, description="The snapshot's id (snap-...) or name.")
    force: bool = Field(False, description="Delete even with live forks (they stay, independent).")


class ForkArgs(_Args):
    """Make COUNT independent workspaces from a snapshot (or from the workspace as it is now)."""

    snapshot: str | None = Field(None, max_length=128, description="Id or name; none: snapshot the workspace first.")
    count: int = Field(1, ge=1, le=MAX_FORKS, description="How many forks.")
    workspace: str | None = Field(None, description=_WS)


class RestoreArgs(_Args):
    """Put a workspace back to a snapshot byte for byte; undoable (the changelog records it)."""

    snapshot: str = Field(min_length=1, max_length=128, description="The snapshot's id or name.")
    dry_run: bool = Field(False, description="Only say what would change, with the diff.")
    workspace: str | None = Field(None, description=_WS)


_TOOLS: dict[str, tuple[type[_Args], types.ToolAnnotations]] = {
    "snapshot_create": (CreateArgs, types.ToolAnnotations(destructive_hint=False)),
    "snapshot_list": (ListArgs, types.ToolAnnotations(read_only_hint=True)),
    "snapshot_delete": (DeleteArgs, types.ToolAnnotations(destructive_hint=True)),
    "workspace_fork": (ForkArgs, types.ToolAnnotations(destructive_hint=False)),
    "workspace_restore": (RestoreArgs, types.ToolAnnotations(destructive_hint=True)),
}


class OrchestratorTools:
    """The tools above for the MCP server of ``home`` (a workspace directory)."""

    def __init__(self, snapshots: Snapshots, home: Path) -> None:
        self.snapshots = snapshots
        self.home = home.resolve()
        self.tools = [
            types.Tool(
                name=name,
                description=(model.__doc__ or "").strip(),
                input_schema=model.model_json_schema(),
                annotations=annotations,
            )
            for name, (model, annotations) in _TOOLS.items()
        ]
        self.names = frozenset(_TOOLS)

    async def _workspace(self, given: str | None) -> Path:
        """``given`` if it is the home workspace or descends from it by forks. Raises
        SnapshotError."""
        if given is None:
            return self.home
        path = Path(given).expanduser().resolve()
        seen = set()
        current = path
        while current != self.home:
            origin = await self.snapshots.origin(current) if current.is_dir() else None
            if origin is None or current in seen:
                raise SnapshotError(f"{given} is not this server's workspace nor a fork made from it")
            seen.add(current)
            current = Path((await self.snapshots.get(origin.snapshot)).workspace)
        return path

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Run one tool; every failure is a tool error the orchestrator can read."""
        model = _TOOLS[name][0]
        try:
            args: Any = model.model_validate(arguments)
            out = await self._run(name, args)
        except ValidationError as e:
            err = e.errors()[0]
            return _error(f"Invalid arguments for {name}: {'.'.join(map(str, err['loc']))}: {err['msg']}")
        except (SnapshotError, SandboxError, ChangelogError, OSError, ValueError) as e:
            return _error(f"{name} failed: {e}")
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(out, indent=1))], structured_content=out, is_error=False
        )

    async def _run(self, name: str, args: Any) -> dict[str, Any]:
        snaps = self.snapshots
        if name == "snapshot_delete":
            snap = await snaps.get(args.snapshot, self.home)
            await self._workspace(snap.workspace)  # only a snapshot of this lineage
            left = await snaps.delete(snap.id, force=args.force)
            return {"deleted": args.snapshot, "left_forks": left}
        ws = await self._workspace(args.workspace)
        if name == "snapshot_create":
            return (await snaps.create(ws, args.name, with_scratch=args.with_scratch)).model_dump()
        if name == "snapshot_list":
            origin = await snaps.origin(ws)
            found = [s.model_dump() for s in await snaps.list(ws)]
            return {"workspace": str(ws), "origin": origin.model_dump() if origin else None, "snapshots": found}
        if name == "workspace_fork":
            ref = args.snapshot or (await snaps.create(ws, "fork-base")).id
            made = await snaps.fork(ref, args.count, workspace=ws)
            return {"snapshot": ref, "workspaces": [str(p) for p in made]}
        done = await snaps.restore(ws, args.snapshot, dry_run=args.dry_run)
        return done.as_dict()


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=f"Error: {message}")], is_error=True)
