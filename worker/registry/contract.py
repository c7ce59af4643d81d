"""What the service needs of a registry: :class:`ServiceRegistry`, the part every registry
the service runs over has (the local :class:`~.core.ToolRegistry`, a cluster's front
door's :class:`worker.integrations.ray.frontdoor.FrontRegistry`), and the optional parts
as capability Protocols, checked with ``isinstance`` where a route needs one.

The routes, the MCP server and the call runner use these and nothing else of a registry;
mypy checks both registries against them (each module declares ``_: type[...] =`` its
class). The tool listing is synchronous: it is a table in memory on every registry (a front
door's is a cache of the nodes', kept fresh by a task of its own), read on every MCP
``tools/list``; everything that reaches a sandbox, a node or a disk is ``async``.

- :class:`ServiceRegistry`: the tools (listed, got, registered, their schemas, told of a
  change), a call (``execute``), stopping a workspace's sandbox.
- :class:`HoldsWorkspaces`: the workspaces' own parts (sandbox, changelog, the harness
  API, the call journal, the settings, the egress record, the sandbox backend): a
  registry on the machine holding them. A cluster's front door has none: every route
  that needs them is carried to the workspace's node (:mod:`worker.integrations.ray.forward`).
- :class:`SearchesCatalog`: the tool catalog's search (``GET /v1/tools/search``).
- :class:`HasImages`: the engine(s) the image routes pull to.
- :class:`OpensTunnels`: a connection to a port of a workspace's sandbox (the port proxy).
- :class:`ObservesEgress`: who is told of each egress attempt (the service's metrics).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sandbox.base import ExecControl, OutputCallback

from ..result import ToolResult
from ..tool import Tool

if TYPE_CHECKING:
    from sandbox.base import SandboxBackend

    from ..calls import CallJournal
    from ..egress.log import EgressRecord
    from ..harness import SandboxHandle
    from ..workspace import Workspace
    from ..workspace_settings import Configs, Configured, WorkspaceSettings
    from .execution import Arguments


@runtime_checkable
class ServiceRegistry(Protocol):
    """What every registry the service runs over does (see the module docstring)."""

    @property
    def tools_version(self) -> int:
        """Moves whenever the tool list changes."""
        ...

    def names(self) -> list[str]: ...

    def get(self, name: str) -> Tool | None: ...

    def register(self, tool: Tool) -> None:
        """Raises ValueError for a name another tool has."""
        ...

    def all_schemas(self, fmt: str = "openai", *, native: bool = False) -> list[dict[str, Any]]:
        """Raises ValueError for an unknown format."""
        ...

    def subscribe_tools(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the tool list changes; returns the unsubscribe."""
        ...

    async def execute(
        self,
        name: str,
        arguments: Arguments,
        workspace: Path | str | None = None,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ToolResult:
        """One tool call; its failures are results."""
        ...

    async def stop(self, path: Path | str) -> bool:
        """Stop the workspace's sandbox; whether one was running."""
        ...


@runtime_checkable
class HoldsWorkspaces(Protocol):
    """A registry on the machine holding the workspaces (see the module docstring)."""

    @property
    def backend(self) -> SandboxBackend | None: ...

    @property
    def configs(self) -> Configs | None:
        """Per-workspace settings; None where they are not kept."""
        ...

    @property
    def journal(self) -> CallJournal | None: ...

    async def workspace(self, path: Path | str) -> Workspace: ...

    def sandbox(self, path: Path | str) -> SandboxHandle: ...

    def egress_status(self, path: Path | str, *, limit: int = 100, verdict: str | None = None) -> dict[str, Any]: ...

    async def workspace_settings(self, path: Path | str) -> tuple[WorkspaceSettings, dict[str, Any]]: ...

    async def configure_workspace(self, path: Path | str, changes: dict[str, Any]) -> Configured: ...

    async def check_settings(self, new: WorkspaceSettings, before: WorkspaceSettings | None = None) -> None: ...


class LocalRegistry(ServiceRegistry, HoldsWorkspaces, Protocol):
    """A registry with its workspaces' parts: what a route under a workspace uses."""


@runtime_checkable
class SearchesCatalog(Protocol):
    """A registry with the tool catalog's search (its ``catalog_tools`` None when off)."""

    @property
    def catalog_tools(self) -> CatalogSearch | None: ...


class CatalogSearch(Protocol):
    async def search(self, registry: Any, args: Any, *, has_workspace: bool | None = None) -> dict[str, Any]:
        """``tool_search``'s output. Raises InvalidQueryError and the catalog's errors."""
        ...


@runtime_checkable
class HasImages(Protocol):
    """A registry whose image routes pull to ``images`` (an :class:`sandbox.base.
    ImageInventory` and :class:`sandbox.base.PullWatcher` when it pulls)."""

    @property
    def images(self) -> object | None: ...


class PortTunnel(Protocol):
    """A connection to a port of a sandbox (:class:`sandbox.tunnel.SandboxTunnel`, or a
    front door's to a node's sandbox); ``error`` says why it ended, when it failed."""

    error: str | None

    async def read(self) -> bytes:
        """What the server sent (b"" at its end)."""
        ...

    async def write(self, data: bytes) -> None: ...

    async def write_eof(self) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class OpensTunnels(Protocol):
    """A registry reaching a port of a workspace's sandbox."""

    async def open_tunnel(self, path: Path | str, port: int) -> PortTunnel:
        """Raises AgentError (``connection_refused``: nothing listens), SandboxError."""
        ...


@runtime_checkable
class ObservesEgress(Protocol):
    """A registry telling observers of every egress attempt."""

    @property
    def egress_observers(self) -> list[Callable[[EgressRecord], None]]: ...


__all__ = [
    "CatalogSearch",
    "HasImages",
    "HoldsWorkspaces",
    "LocalRegistry",
    "ObservesEgress",
    "OpensTunnels",
    "PortTunnel",
    "SearchesCatalog",
    "ServiceRegistry",
]
