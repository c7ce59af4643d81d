"""The Python API of a cluster: :class:`ClusterRegistry`, the registry's calls (``execute``,
``execute_stream``, the changelog, undo, settings, snapshots and forks, tunnels) for
workspaces placed on a Ray cluster (:mod:`.workspaces`), from any driver process (a
trainer's workers, the HTTP front door).

Each call runs on the workspace's node, with the node's own registry, so results are the
local API's, byte for byte. Request/answer calls go over the node's call channel
(:mod:`.channel`: a TCP connection to the node service, authenticated with a key Ray
hands out), or as Ray actor calls when the channel cannot be reached (``direct=False``
forces those); streams are Ray's streaming generators.

A node lost (its raylet killed, its machine gone): Ray fails the calls to its actors
(``ActorDiedError``, or ``ActorUnavailableError`` while it is still deciding), a channel
breaks; each becomes :class:`~.errors.NodeLostError`, an infrastructure failure:
``execute`` returns it as a result with ``data.error_kind == "infrastructure"``, the
other methods raise it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import PurePath
from typing import Any

from ray.exceptions import RayActorError, RayTaskError

from sandbox.base import ExecControl, OutputCallback

from ...result import ToolResult
from ...streaming import MAX_BUFFERED, ToolOutput, stream_call
from ...tool import Tool
from . import gcs
from .channel import Channel, ChannelBroken, ChannelClosed
from .errors import CallInterruptedError, ClusterError, NodeLostError
from .names import DEFAULT_NAMESPACE
from .node import SANDBOX
from .snapshots import ClusterSnapshots
from .workspaces import ClusterWorkspace, Placements, _cause, _Loc, _short, workspace_id

Arguments = dict[str, Any] | str | None

#: Seconds a driver waits for a node's channel to connect; one that cannot is not tried
#: again for UNREACHABLE_SECONDS (its calls go as Ray actor calls meanwhile).
CONNECT_SECONDS = 3.0
UNREACHABLE_SECONDS = 30.0

__all__ = ["ClusterRegistry", "ClusterWorkspace", "RemoteTunnel", "infrastructure_result", "workspace_id"]


def infrastructure_result(err: ClusterError) -> ToolResult:
    """A lost node (or a call cut from it) as a call's result (the registry's
    infrastructure channel)."""
    node = err.node if isinstance(err, (NodeLostError, CallInterruptedError)) else None
    if isinstance(err, NodeLostError):
        return ToolResult.fail(
            "Node lost (infrastructure failure, not a problem with the tool call; the workspace's node must be "
            f"brought back, or the work moved to a new workspace): {err}",
            data={"error_kind": "infrastructure", "exception": "NodeLostError", "node": node, "state": "lost"},
        )
    return ToolResult.fail(
        f"Infrastructure failure (not a problem with the tool call): {err}",
        data={"error_kind": "infrastructure", "exception": type(err).__name__, "node": node},
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
    ``get_workspace``, ``list_workspaces``, ``delete_workspace``), the calls below, and
    :attr:`snapshots` (:class:`~.snapshots.ClusterSnapshots`). ``direct=False``: every
    call as a Ray actor call (no node channel)."""

    def __init__(self, *, namespace: str = DEFAULT_NAMESPACE, place_timeout: float = 30.0, direct: bool = True) -> None:
        super().__init__(namespace=namespace, place_timeout=place_timeout)
        self.direct = direct
        self._channels: dict[str, Channel] = {}
        self._opening: dict[tuple[str, int], asyncio.Lock] = {}  # by node and event loop
        self._unreachable: dict[str, float] = {}
        #: The vendors' native tools registered here (``worker.native.install``).
        self._native: dict[str, Tool] = {}
        #: Snapshots, forks and restore of the cluster's workspaces.
        self.snapshots = ClusterSnapshots(self)

    async def aclose(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        await super().aclose()

    # -- the vendors' native tools (worker.native.install registers them here) -------------

    def get(self, name: str) -> Tool | None:
        """A native tool registered here (the nodes run every other tool themselves)."""
        return self._native.get(name)

    def register(self, tool: Tool) -> None:
        """Register one of the vendors' native tools (:mod:`worker.native`): its calls ask
        the node to register it too. Raises ValueError for any other tool (a node runs
        the tools its own settings give it: built-in, catalog, custom)."""
        from ...native import native_tools

        if tool.name in self._native:
            raise ValueError(f"Tool '{tool.name}' is already registered")
        if tool not in native_tools():
            raise ValueError(f"only the vendors' native tools are registered with a cluster, not {tool.name!r}")
        self._native[tool.name] = tool

    # -- calls ----------------------------------------------------------------------------

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
        native = name in self._native
        try:
            loc = await self._locate(ws_id)
            if on_output is None:
                result: ToolResult = await self._invoke(
                    ws_id, loc, "execute", ws_id, name, arguments, call_id, subtask_id, native
                )
                return result
            return await self._streamed(ws_id, loc, (name, arguments, call_id, subtask_id, native), on_output)
        except (NodeLostError, CallInterruptedError) as e:
            return infrastructure_result(e)

    async def _streamed(self, ws_id: str, loc: _Loc, call: tuple[Any, ...], on_output: OutputCallback) -> ToolResult:
        gen = loc.service.execute_stream.remote(ws_id, *call)
        try:
            async for ref in gen:
                item = await self._node(ws_id, loc.node, ref)
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
        NodeLostError, CallInterruptedError, WorkspaceNotFound."""
        ws_id = workspace_id(workspace)
        loc = await self._locate(ws_id)
        return await self._invoke(ws_id, loc, "call", ws_id, method, args, kwargs)

    async def workspace_call(self, workspace: str | PurePath, part: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``workspace.<part>.<method>(...)`` on the node (``part``: sandbox, recorder);
        :data:`.node.SANDBOX` in ``args`` stands for the workspace's sandbox."""
        ws_id = workspace_id(workspace)
        loc = await self._locate(ws_id)
        return await self._invoke(ws_id, loc, "workspace_call", ws_id, part, method, args, kwargs)

    async def node_call(self, workspace: str | PurePath, method: str, *args: Any) -> Any:
        """The node service's ``method(ws_id, *args)`` for the workspace, as a Ray actor
        call. Raises what it raises there, NodeLostError, WorkspaceNotFound."""
        ws_id = workspace_id(workspace)
        loc = await self._locate(ws_id)
        return await self._node(ws_id, loc.node, getattr(loc.service, method).remote(ws_id, *args))

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
        tid = await self._invoke(ws_id, loc, "tunnel_open", ws_id, port)
        return RemoteTunnel(self, ws_id, loc, tid)

    async def node_invoke(self, node: str, op: str, *args: Any) -> Any:
        """The node service's ``op(*args)`` on ``node``, for a request that names no
        workspace placed yet (E2B's create and list: :mod:`.e2bfront`), as
        :meth:`_invoke` carries it. Raises what the node raised, NodeLostError,
        CallInterruptedError."""
        label = f"(a request to node {node})"
        return await self._invoke(label, _Loc(node, "", await self._service(node), ""), op, *args)

    # -- the way to the node ----------------------------------------------------------------

    async def _invoke(self, ws_id: str, loc: _Loc, op: str, *args: Any) -> Any:
        """The node service's ``op(*args)``: on its channel when it can be reached, else
        as a Ray actor call. Raises what the node raised, NodeLostError,
        CallInterruptedError (the channel broke during the call, the node alive)."""
        channel = await self._channel(ws_id, loc) if self.direct else None
        if channel is not None:
            try:
                return await channel.call(op, *args)
            except ChannelClosed:
                pass  # not sent: as a Ray actor call below
            except ChannelBroken as e:
                self._channels.pop(loc.node, None)
                # Did the node die? Ray knows (NodeLostError); else only the connection did.
                await self._node(ws_id, loc.node, loc.service.ping.remote())
                raise CallInterruptedError(ws_id, loc.node, str(e)) from None
        return await self._node(ws_id, loc.node, getattr(loc.service, op).remote(*args))

    async def _channel(self, ws_id: str, loc: _Loc) -> Channel | None:
        channel = self._channels.get(loc.node)
        if channel is not None and channel.usable:
            return channel
        if time.monotonic() < self._unreachable.get(loc.node, 0.0):
            return None
        lock = self._opening.setdefault((loc.node, id(asyncio.get_running_loop())), asyncio.Lock())
        async with lock:
            channel = self._channels.get(loc.node)
            if channel is not None and channel.usable:
                return channel
            node = loc.node

            async def alive() -> bool:
                return await asyncio.to_thread(gcs.node_alive, node)

            try:
                where = await self._node(ws_id, node, loc.service.channel.remote())
                channel = await Channel.open(
                    where["host"], where["port"], where["key"], timeout=CONNECT_SECONDS, watch=alive
                )
            except (OSError, TimeoutError):
                self._unreachable[node] = time.monotonic() + UNREACHABLE_SECONDS
                return None
            self._channels[node] = channel
            return channel


class RemoteTunnel:
    """A sandbox tunnel on another node, read and written through its node service (the
    :class:`sandbox.tunnel.SandboxTunnel` interface: ``read``, ``write``, ``write_eof``,
    ``close``, ``error``). Each read is one call returning what the sandbox sent since
    the last (b"" at the end)."""

    def __init__(self, cluster: ClusterRegistry, ws_id: str, loc: _Loc, tid: int) -> None:
        self._cluster, self._ws, self._loc, self._tid = cluster, ws_id, loc, tid
        self.error: str | None = None
        self.closed = False  # (the Tunnel protocol's: set once closed from here or broken)

    async def _do(self, op: str, *args: Any) -> Any:
        try:
            return await self._cluster._invoke(self._ws, self._loc, op, self._tid, *args)
        except (NodeLostError, CallInterruptedError) as e:
            self.error, self.closed = str(e), True
            from sandbox.errors import TunnelClosedError

            raise TunnelClosedError(str(e)) from None

    async def read(self) -> bytes:
        data: bytes = await self._do("tunnel_read")
        if not data:
            self.error = await self._do("tunnel_error")
        return data

    async def write(self, data: bytes) -> None:
        await self._do("tunnel_write", bytes(data))

    async def write_eof(self) -> None:
        await self._do("tunnel_write_eof")

    async def close(self) -> None:
        self.closed = True
        try:
            await self._do("tunnel_close")
        except Exception:  # the node may be gone: nothing left to close there
            pass
