"""The service's state as the routes reach it: one typed :class:`Service` on
``app.state.service``, handed to a route by the :data:`ServiceDep` dependency (and to the
plain ASGI endpoints, the port proxy and the MCP endpoint, by :func:`service_of`).

The settings, the workspaces, the metrics and the access rules exist from
:func:`worker.http.create_app` on; the registry, the call runner and the MCP server from
the app's startup (its lifespan) to its shutdown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request

from sandbox.base import RestartCounter
from sandbox.capabilities import WarmPoolReporter

from ..auth import Access
from ..metrics import Metrics
from ..registry.contract import HoldsWorkspaces, LocalRegistry, ServiceRegistry
from ..service import CallRunner, Workspaces
from ..settings import Settings

if TYPE_CHECKING:
    from pathlib import Path

    from ..mcp_server import HttpMcp
    from ..snapshots import Snapshots


class NotStartedError(RuntimeError):
    """A route ran before the app's startup (its lifespan) or after its shutdown."""


class NotHeldHere(RuntimeError):
    """A route needing a workspace's parts ran on a service whose registry does not hold
    them (a cluster's front door carries those routes to the workspace's node): 501."""


@dataclass(eq=False)
class Service:
    """What the routes share."""

    settings: Settings
    workspaces: Workspaces
    access: Access
    metrics: Metrics = field(init=False)  # its gauges read this object: made after it
    _registry: ServiceRegistry | None = None
    _runner: CallRunner | None = None
    _mcp: HttpMcp | None = None
    _snapshots: Snapshots | None = None
    _local: LocalRegistry | None = None

    def start(self, registry: ServiceRegistry, runner: CallRunner, mcp: HttpMcp) -> None:
        self._registry, self._runner, self._mcp = registry, runner, mcp
        # (checked once: a Protocol's isinstance looks up each of its members)
        self._local = registry if isinstance(registry, HoldsWorkspaces) else None
        if self._local is not None:  # DELETE ...?delete_files of an overlay fork removes the fork
            self.workspaces.fork_remover = self._remove_fork

    async def _remove_fork(self, path: Path) -> None:
        await self.snapshots.remove_fork(path)

    def stop(self) -> None:
        self._registry = self._runner = self._mcp = self._local = None
        self._snapshots = None

    @property
    def snapshots(self) -> Snapshots:
        """The snapshots of the service's workspaces (made at first use). Raises NotStartedError."""
        if self._snapshots is None:
            from ..snapshots import Snapshots

            self._snapshots = Snapshots.from_settings(self.local, self.settings)
        return self._snapshots

    @property
    def started(self) -> bool:
        return self._runner is not None

    @property
    def registry(self) -> ServiceRegistry:
        """The registry calls run through. Raises NotStartedError."""
        if self._registry is None:
            raise NotStartedError("the service is not running (its lifespan has not started)")
        return self._registry

    @property
    def local(self) -> LocalRegistry:
        """The registry, holding the workspaces' parts (what a route under a workspace
        uses). Raises NotStartedError, NotHeldHere."""
        if self._local is None:
            if self._registry is None:
                raise NotStartedError("the service is not running (its lifespan has not started)")
            raise NotHeldHere("this service does not hold its workspaces' parts: their nodes answer this route")
        return self._local

    @property
    def runner(self) -> CallRunner:
        """The call runner (order per workspace, the global limit). Raises NotStartedError."""
        if self._runner is None:
            raise NotStartedError("the service is not running (its lifespan has not started)")
        return self._runner

    @property
    def mcp(self) -> HttpMcp:
        """The MCP streamable-HTTP server. Raises NotStartedError."""
        if self._mcp is None:
            raise NotStartedError("the service is not running (its lifespan has not started)")
        return self._mcp

    def sandboxes_open(self) -> int:
        """Sandboxes this service has used and not stopped (0 before startup)."""
        return len(self._runner.opened) if self._runner is not None else 0

    def sandbox_restarts(self) -> int:
        """Sandboxes the registry's backend restarted after losing them (0 before startup)."""
        registry = self._registry
        backend = registry.backend if isinstance(registry, HoldsWorkspaces) else None
        return backend.restarts if isinstance(backend, RestartCounter) else 0

    def warm_pool(self) -> dict[str, Any] | None:
        """The backend's warm pool (ready, starting, claims, misses, declined), None without one."""
        registry = self._registry
        backend = registry.backend if isinstance(registry, HoldsWorkspaces) else None
        return backend.pool_status() if isinstance(backend, WarmPoolReporter) else None

    def reject(self, reason: str) -> None:
        """Count a refused request in ``loom_http_rejected_total``."""
        self.metrics.rejected.labels(reason=reason).inc()


def service_of(app: Any) -> Service:
    """The :class:`Service` of an app made by :func:`worker.http.create_app`."""
    service: Service = app.state.service
    return service


async def _service(request: Request) -> Service:
    # async: a plain function dependency would run in a thread for every request.
    return service_of(request.app)


#: The service, as a route parameter: ``service: ServiceDep``.
ServiceDep = Annotated[Service, Depends(_service)]
