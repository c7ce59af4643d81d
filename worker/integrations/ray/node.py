"""The node service: one detached named actor per Ray node that offers sandboxes, owning
that node's :func:`worker.default_registry` (its Docker engine, data directory,
workspaces, changelogs, egress gateway and fast channels, exactly as a local worker has
them), configured by the environment ``ray start`` ran with on that node.

Nobody starts it by hand: the first workspace placed on a node creates it with
``get_if_exists=True``, pinned to that node by ``NodeAffinitySchedulingStrategy(soft=False)``
(:func:`node_service`), so concurrent creators end up with the one actor. Its
name is :func:`.names.node_service_name` of the node id.

Its parts: :mod:`.nodebase` (settings, registry, the workspaces placed here),
:mod:`.nodeapp` (its own HTTP service, for a front door's forwarded requests; tool
listings; image pulls), :mod:`.nodesnap` (snapshots and forks), and here the calls: tool
calls (also streamed), the registry's per-workspace methods (:data:`REGISTRY_METHODS`:
one line carries another), the workspace's sandbox and changelog methods, the tunnels of
a front door's port proxy, and the operations. The calls are served both as Ray actor
calls and on the node's call channel (:mod:`.channel`), which drivers use for
:data:`CHANNEL_OPS` when they can reach it.

What a method raises reaches the driver as it was raised (:mod:`.portable`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sandbox.base import RestartCounter
from sandbox.capabilities import tunnels

from ...registry.core import ToolRegistry
from ...result import ToolResult
from ...streaming import ToolOutput
from .channel import ChannelServer
from .names import node_service_name
from .nodesnap import NodeSnapshots
from .portable import portable

#: Registry methods a driver may call on a workspace, each taking the workspace's path
#: first (``registry.<name>(path, *args, **kwargs)``). One line carries a new one.
REGISTRY_METHODS: dict[str, Callable[..., Any]] = {
    "workspace_settings": ToolRegistry.workspace_settings,
    "configure_workspace": ToolRegistry.configure_workspace,
    "egress_status": ToolRegistry.egress_status,
    "stop": ToolRegistry.stop,
}

#: The parts of a workspace (:class:`worker.Workspace`) whose methods a driver may call
#: (``workspace_call``): its sandbox and its changelog.
PARTS = frozenset({"sandbox", "recorder"})

#: Stands, in the arguments of a ``workspace_call``, for the workspace's own sandbox (the
#: changelog's ``undo(sandbox, ...)`` and ``diff(sandbox, ...)`` take it).
SANDBOX = "\x00loom:sandbox"

#: The methods served on the call channel (request and answer; streams stay on Ray).
CHANNEL_OPS = frozenset(
    {
        "ping",
        "execute",
        "http_begin",
        "http_next",
        "http_cancel",
        "e2b_begin",
        "e2b_request",
        "ws_begin",
        "ws_next",
        "ws_send",
        "ws_close",
        "call",
        "workspace_call",
        "tunnel_open",
        "tunnel_read",
        "tunnel_write",
        "tunnel_write_eof",
        "tunnel_error",
        "tunnel_close",
    }
)


class NodeService(NodeSnapshots):
    """The loom worker of one Ray node (used as a Ray actor; see the module docstring)."""

    def __init__(self, node_id: str, namespace: str) -> None:
        super().__init__(node_id, namespace)
        self._tunnels: dict[int, Any] = {}
        self._next_tunnel = 0
        self._channel = ChannelServer(self._on_channel, CHANNEL_OPS)

    async def channel(self) -> dict[str, Any]:
        """Where this node's call channel listens (started on first ask), and its key:
        ``{"host", "port", "key"}``. Raises OSError."""
        host, port = await self._channel.start(ray.util.get_node_ip_address())
        return {"host": host, "port": port, "key": self._channel.key}

    async def _on_channel(self, op: str, args: tuple[Any, ...]) -> Any:
        out = getattr(self, op)(*args)
        return await out if inspect.isawaitable(out) else out

    # -- calls ----------------------------------------------------------------------------

    async def _native(self, name: str, native: bool) -> Any:
        reg = await self._reg()
        if native:
            # The driver registered the vendors' tool (worker.native.install): so does the node.
            from ...native import install

            install(reg, (name,))
        return reg

    async def execute(
        self,
        ws_id: str,
        name: str,
        arguments: Any,
        call_id: str | None,
        subtask_id: str | None,
        native: bool = False,
    ) -> ToolResult:
        """One tool call, as ``registry.execute`` runs it (never raises for the call)."""
        path = await self._path(ws_id)
        reg = await self._native(name, native)
        result: ToolResult = await reg.execute(name, arguments, path, call_id=call_id, subtask_id=subtask_id)
        return result

    # 16 chunks in flight at most: the node's registry buffers the rest (worker.streaming).
    @ray.method(num_returns="streaming", _generator_backpressure_num_objects=16)
    async def execute_stream(
        self,
        ws_id: str,
        name: str,
        arguments: Any,
        call_id: str | None,
        subtask_id: str | None,
        native: bool = False,
    ) -> AsyncIterator[ToolOutput | ToolResult]:
        """``registry.execute_stream``: the output chunks as they come, then the result."""
        path = await self._path(ws_id)
        reg = await self._native(name, native)
        async for item in reg.execute_stream(name, arguments, path, call_id=call_id, subtask_id=subtask_id):
            yield item

    async def call(self, ws_id: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``registry.<method>(path, *args, **kwargs)`` for a method of
        :data:`REGISTRY_METHODS`. Raises ValueError for another name, and what the method
        raises."""
        if method not in REGISTRY_METHODS:
            raise ValueError(f"{method!r} is not a registry method forwarded to nodes")
        path = await self._path(ws_id)
        out = REGISTRY_METHODS[method](await self._reg(), path, *args, **kwargs)
        return await out if inspect.isawaitable(out) else out

    async def workspace_call(
        self, ws_id: str, part: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``workspace.<part>.<method>(*args, **kwargs)`` (``part``: sandbox or recorder),
        with :data:`SANDBOX` in ``args`` standing for the workspace's sandbox. Raises
        ValueError for a part or method not offered, and what the method raises."""
        if part not in PARTS or method.startswith("_"):
            raise ValueError(f"{part}.{method} is not offered to drivers")
        ws = await (await self._reg()).workspace(await self._path(ws_id))
        target = getattr(getattr(ws, part), method)
        args = tuple(ws.sandbox if a == SANDBOX else a for a in args)
        out = target(*args, **kwargs)
        return await out if inspect.isawaitable(out) else out

    # -- tunnels (the port proxy of a front door on another node) --------------------------

    async def tunnel_open(self, ws_id: str, port: int) -> int:
        """Open a tunnel to ``port`` on the sandbox's loopback; its id. Raises AgentError
        (``connection_refused``: nothing listens), SandboxError."""
        ws = await (await self._reg()).workspace(await self._path(ws_id))
        tunnel = await tunnels(ws.sandbox).open_tunnel(port)
        self._next_tunnel += 1
        self._tunnels[self._next_tunnel] = tunnel
        return self._next_tunnel

    def _tunnel(self, tid: int) -> Any:
        from sandbox.errors import TunnelClosedError

        tunnel = self._tunnels.get(tid)
        if tunnel is None:
            raise TunnelClosedError(f"tunnel {tid} is closed")
        return tunnel

    async def tunnel_read(self, tid: int) -> bytes:
        data: bytes = await self._tunnel(tid).read()
        return data

    async def tunnel_write(self, tid: int, data: bytes) -> None:
        await self._tunnel(tid).write(data)

    async def tunnel_write_eof(self, tid: int) -> None:
        await self._tunnel(tid).write_eof()

    async def tunnel_error(self, tid: int) -> str | None:
        tunnel = self._tunnels.get(tid)
        return None if tunnel is None else tunnel.error

    async def tunnel_close(self, tid: int) -> None:
        tunnel = self._tunnels.pop(tid, None)
        if tunnel is not None:
            await tunnel.close()

    # -- operations -----------------------------------------------------------------------

    async def metrics(self) -> dict[str, Any]:
        """This node's numbers: workspaces placed, sandboxes open, their restarts, tunnels."""
        reg = self._registry
        backend = None if reg is None else reg.backend
        return {
            "node_id": self.node_id,
            "workspaces": len(self._hosted),
            "sandboxes_open": 0 if reg is None else len(reg.pool.opened()),
            "sandbox_restarts": backend.restarts if isinstance(backend, RestartCounter) else 0,
            "tunnels_open": len(self._tunnels),
        }

    async def gc(self) -> list[str]:
        """``loom-worker gc`` on this node: remove its exited sandboxes, those of vanished
        workspaces and of other worker versions. Returns the containers removed. Raises
        SandboxUnavailableError."""
        from sandbox.docker import DockerBackend
        from sandbox.spec import SandboxSpec

        backend = DockerBackend(SandboxSpec(**self.settings.sandbox_spec_kwargs()), base_url=self.settings.docker_host)
        try:
            removed: list[str] = await backend.gc()
        finally:
            await backend.aclose()
        return removed

    async def shutdown(self) -> None:
        """Close the registry (the node's sandboxes keep running, as a stopped worker's do)."""
        await self._channel.close()
        for tid in list(self._tunnels):
            await self.tunnel_close(tid)
        await self._stack.aclose()
        self._registry = self._app = None


def _carried(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, with what it raises made portable (:mod:`.portable`) before Ray pickles it."""
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def agen(*args: Any, **kwargs: Any) -> Any:
            try:
                async for item in fn(*args, **kwargs):
                    yield item
            except Exception as e:
                raise portable(e) from None

        return agen
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def coro(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except Exception as e:
                raise portable(e) from None

        return coro

    @functools.wraps(fn)
    def plain(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise portable(e) from None

    return plain


#: :class:`NodeService` with every public method :func:`_carried` (found by this name when
#: Ray pickles the actor class).
CarriedNodeService = type(
    "CarriedNodeService",
    (NodeService,),
    {
        **{n: _carried(f) for n, f in inspect.getmembers(NodeService, inspect.isfunction) if not n.startswith("_")},
        "__module__": __name__,
        "__qualname__": "CarriedNodeService",
        "__doc__": NodeService.__doc__,
    },
)

#: The actor class (``num_cpus=0``: it waits on sandboxes, it does not compute).
NodeServiceActor: Any = ray.remote(num_cpus=0, max_restarts=0)(CarriedNodeService)


def node_service(node_id: str, namespace: str) -> Any:
    """The handle of node ``node_id``'s service, created (pinned to it) when it has none.
    Blocking (a call to Ray's control store): call it off the event loop."""
    return NodeServiceActor.options(
        name=node_service_name(node_id),
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(node_id, namespace)


__all__ = [
    "CHANNEL_OPS",
    "PARTS",
    "REGISTRY_METHODS",
    "SANDBOX",
    "CarriedNodeService",
    "NodeService",
    "NodeServiceActor",
    "node_service",
]
