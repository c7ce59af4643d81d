"""The Python API of a cluster: :class:`ClusterRegistry`, the registry's calls (``execute``,
``execute_stream``, the changelog, undo, settings, tunnels) for workspaces placed on a Ray
cluster (:mod:`.workspaces`), from any driver process (a trainer's workers, the HTTP front
door).

Each call is one actor call to the node service of the workspace's node (:mod:`.node`),
which runs it with the node's own registry, so results are the local API's, byte for byte.

A node lost (its raylet killed, its machine gone): Ray fails the calls to its actors
(``ActorDiedError``, or ``ActorUnavailableError`` while it is still deciding), and each
becomes :class:`~.errors.NodeLostError`, an infrastructure failure: ``execute`` returns it
as a result with ``data.error_kind == "infrastructure"``, the other methods raise it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import PurePath
from typing import Any

from ray.exceptions import RayActorError, RayTaskError

from sandbox.base import ExecControl, OutputCallback

from ...result import ToolResult
from ...streaming import MAX_BUFFERED, ToolOutput, stream_call
from .errors import NodeLostError
from .node import SANDBOX
from .workspaces import ClusterWorkspace, Placements, _cause, _Loc, _short, workspace_id

Arguments = dict[str, Any] | str | None

__all__ = ["ClusterRegistry", "ClusterWorkspace", "RemoteTunnel", "infrastructure_result", "workspace_id"]


def infrastructure_result(err: NodeLostError) -> ToolResult:
    """A lost node as a call's result (the registry's infrastructure channel)."""
    return ToolResult.fail(
        "Node lost (infrastructure failure, not a problem with the tool call; the workspace's node must be "
        f"brought back, or the work moved to a new workspace): {err}",
        data={"error_kind": "infrastructure", "exception": "NodeLostError", "node": err.node, "state": "lost"},
    )


def _forward(method: str) -> Callable[..., Awaitable[Any]]:
    async def forwarded(self: ClusterRegistry, workspace: str | PurePath, *args: Any, **kwargs: Any) -> Any:
        return await self.call(workspace, method, *args, **kwargs)

    forwarded.__name__ = method
    forwarded.__doc__ = f"``registry.{method}`` on the workspace's node (see :meth:`ClusterRegistry.call`)."
    return forwarded


class ClusterRegistry(Placements):
    """Workspaces on a Ray cluster, called as a local :class:`worker.ToolRegistry` is:
    :class:`~.workspaces.Placements` (``connect``, ``create_workspace``,
    ``get_workspace``, ``list_workspaces``, ``delete_workspace``) and the calls below."""

    async def execute(
        self,
        name: str,
        arguments: Arguments,
        workspace: str | PurePath,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ToolResult:
        """Run one tool call on the workspace's node (see ``ToolRegistry.execute``).
        Never raises for the call: a lost node is an infrastructure result. ``on_output``
        gets the command's output as it happens. ``control`` is not carried across nodes
        (a TypeError when given). Raises WorkspaceNotFound, InvalidWorkspaceId."""
        if control is not None:
            raise TypeError("control is not carried to a cluster's nodes; use the process tools")
        ws_id = workspace_id(workspace)
        try:
            loc = await self._locate(ws_id)
            if on_output is None:
                result: ToolResult = await self._node(
                    ws_id, loc, loc.service.execute.remote(ws_id, name, arguments, call_id, subtask_id)
                )
                return result
            return await self._streamed(ws_id, loc, name, arguments, call_id, subtask_id, on_output)
        except NodeLostError as e:
            return infrastructure_result(e)

    async def _streamed(
        self,
        ws_id: str,
        loc: _Loc,
        name: str,
        arguments: Arguments,
        call_id: str | None,
        subtask_id: str | None,
        on_output: OutputCallback,
    ) -> ToolResult:
        gen = loc.service.execute_stream.remote(ws_id, name, arguments, call_id, subtask_id)
        try:
            async for ref in gen:
                item = await self._node(ws_id, loc, ref)
                if isinstance(item, ToolOutput):
                    if item.data:
                        on_output(item.stream, item.data)
                else:
                    result: ToolResult = item
                    return result
        except RayActorError as e:
            self._locs.pop(ws_id, None)
            raise NodeLostError(ws_id, loc.node, _short(e)) from None
        except RayTaskError as e:
            raise _cause(e) from None
        raise NodeLostError(ws_id, loc.node, "the node's stream ended without a result")

    def execute_stream(
        self,
        name: str,
        arguments: Arguments,
        workspace: str | PurePath,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        max_buffered: int = MAX_BUFFERED,
    ) -> AsyncIterator[ToolOutput | ToolResult]:
        """:meth:`execute` as an async iterator: the output chunks as the command prints
        them on its node (in order; Ray's streaming generator holds at most a few chunks
        in flight, the rest waits on the node), then the ToolResult. As the local one,
        the call starts at once and a reader that stops early does not stop it."""

        def run(on_output: OutputCallback) -> Awaitable[ToolResult]:
            return self.execute(name, arguments, workspace, call_id=call_id, subtask_id=subtask_id, on_output=on_output)

        return stream_call(run, max_buffered=max_buffered)

    async def call(self, workspace: str | PurePath, method: str, *args: Any, **kwargs: Any) -> Any:
        """``registry.<method>(path, *args, **kwargs)`` on the workspace's node (a method
        of :data:`.node.REGISTRY_METHODS`). Raises what the node's registry raises,
        NodeLostError, WorkspaceNotFound."""
        ws_id = workspace_id(workspace)
        loc = await self._locate(ws_id)
        return await self._node(ws_id, loc, loc.service.call.remote(ws_id, method, args, kwargs))

    async def workspace_call(self, workspace: str | PurePath, part: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``workspace.<part>.<method>(...)`` on the node (``part``: sandbox, recorder);
        :data:`.node.SANDBOX` in ``args`` stands for the workspace's sandbox."""
        ws_id = workspace_id(workspace)
        loc = await self._locate(ws_id)
        return await self._node(ws_id, loc, loc.service.workspace_call.remote(ws_id, part, method, args, kwargs))

    # The registry's per-workspace methods, one line each (see node.REGISTRY_METHODS).
    workspace_settings = _forward("workspace_settings")
    configure_workspace = _forward("configure_workspace")
    egress_status = _forward("egress_status")
    stop = _forward("stop")

    async def changelog(self, workspace: str | PurePath, **filters: Any) -> list[Any]:
        """The workspace's changelog entries (``Changelog.log``: path, call_id,
        subtask_id, limit)."""
        entries: list[Any] = await self.workspace_call(workspace, "recorder", "log", **filters)
        return entries

    async def undo(self, workspace: str | PurePath, **selectors: Any) -> Any:
        """Undo on the workspace's node (``Changelog.undo``: entry, call_id, subtask_id,
        to, all, dry_run, force). Raises UndoConflictError, UndoRefusedError,
        EntryNotFoundError, ValueError as the local changelog does."""
        return await self.workspace_call(workspace, "recorder", "undo", SANDBOX, **selectors)

    async def diff(self, workspace: str | PurePath, path: str | None = None) -> str:
        """The unified diff of the workspace against its changelog (``Changelog.diff``)."""
        text: str = await self.workspace_call(workspace, "recorder", "diff", SANDBOX, path)
        return text

    async def open_tunnel(self, workspace: str | PurePath, port: int) -> RemoteTunnel:
        """A tunnel to ``port`` on the sandbox's loopback, through the node service
        (:class:`RemoteTunnel`). Raises AgentError (``connection_refused``),
        SandboxError, NodeLostError."""
        ws_id = workspace_id(workspace)
        loc = await self._locate(ws_id)
        tid = await self._node(ws_id, loc, loc.service.tunnel_open.remote(ws_id, port))
        return RemoteTunnel(self, ws_id, loc, tid)


class RemoteTunnel:
    """A sandbox tunnel on another node, read and written through its node service (the
    :class:`sandbox.tunnel.SandboxTunnel` interface: ``read``, ``write``, ``write_eof``,
    ``close``, ``error``). Each read is one actor call returning what the sandbox sent
    since the last (b"" at the end)."""

    def __init__(self, cluster: ClusterRegistry, ws_id: str, loc: _Loc, tid: int) -> None:
        self._cluster, self._ws, self._loc, self._tid = cluster, ws_id, loc, tid
        self.error: str | None = None

    async def _do(self, call: Awaitable[Any]) -> Any:
        try:
            return await self._cluster._node(self._ws, self._loc, call)
        except NodeLostError as e:
            self.error = str(e)
            from sandbox.errors import TunnelClosedError

            raise TunnelClosedError(str(e)) from None

    async def read(self) -> bytes:
        data: bytes = await self._do(self._loc.service.tunnel_read.remote(self._tid))
        if not data:
            self.error = await self._do(self._loc.service.tunnel_error.remote(self._tid))
        return data

    async def write(self, data: bytes) -> None:
        await self._do(self._loc.service.tunnel_write.remote(self._tid, bytes(data)))

    async def write_eof(self) -> None:
        await self._do(self._loc.service.tunnel_write_eof.remote(self._tid))

    async def close(self) -> None:
        try:
            await self._do(self._loc.service.tunnel_close.remote(self._tid))
        except Exception:  # the node may be gone: nothing left to close there
            pass
