"""The service's life: at startup it opens the registry (the Docker one, recording every
change in the changelog, unless the caller gave one), the call runner and the MCP server;
at shutdown it stops the sandboxes it used (``LOOM_STOP_SANDBOXES_ON_EXIT``) and closes
what it opened."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from sandbox.logs import get_logger

from .. import default_registry
from ..mcp_server import HttpMcp
from ..registry.contract import ObservesEgress, ServiceRegistry
from ..registry.core import ToolRegistry
from ..registry.recovery import reconcile_interrupted
from ..service import CallRunner
from ..settings import Settings
from .changelog import ChangelogPool
from .state import service_of

log = get_logger("worker.http")

#: Opens the service's registry for its life (``create_app(registry_factory=...)``).
RegistryFactory = Callable[[Settings], AbstractAsyncContextManager[ServiceRegistry]]


@asynccontextmanager
async def default_registry_cm(settings: Settings) -> AsyncIterator[Any]:
    """The Docker registry, recording every change in the changelog under LOOM_DATA_DIR
    (no daemon is contacted before the first call)."""
    pool = ChangelogPool(settings.data_dir, settings.durability, limits=settings.changelog_limits())
    try:
        async with default_registry(settings, recorder_factory=pool.recorder) as registry:
            yield registry
    finally:
        await pool.aclose()


def lifespan(
    registry: ServiceRegistry | None, registry_factory: RegistryFactory | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: ``registry`` when given (it stays the caller's to close), else
    the one ``registry_factory`` (default :func:`default_registry_cm`) opens."""

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[None]:
        service = service_of(app)
        settings = service.settings
        async with AsyncExitStack() as stack:
            if registry is not None:
                reg: ServiceRegistry = registry
            else:
                reg = await stack.enter_async_context((registry_factory or default_registry_cm)(settings))
            service.workspaces.ensure_root()
            if isinstance(reg, ObservesEgress):
                reg.egress_observers.append(service.metrics.observe_egress)
            runner = CallRunner(reg, service.metrics, max_concurrent=settings.max_concurrent_calls)
            mcp = HttpMcp(
                reg,
                runner,
                service.workspaces,
                native_tools=service.settings.mcp_native_tools,
                max_message=service.settings.max_body_bytes,
            )
            await stack.enter_async_context(mcp.run())
            service.start(reg, runner, mcp)
            log.info("service.started", workspace_root=str(service.workspaces.root), auth=service.access.token_required)
            # What a crashed worker's commands changed is recorded now, not only at the
            # next call on each workspace (off the startup path: it may start sandboxes).
            recon = (
                asyncio.create_task(reconcile_interrupted(reg, settings.data_dir))
                if isinstance(reg, ToolRegistry)
                else None
            )
            try:
                yield
            finally:
                if recon is not None:
                    recon.cancel()
                if settings.stop_sandboxes_on_exit:
                    await stop_opened(reg, runner, parallel=settings.max_parallel_starts)
                service.stop()
                log.info("service.stopped")

    return run


async def stop_sandbox(registry: ServiceRegistry, path: Path) -> bool:
    """Stop the sandbox of ``path``; whether one was running. Never raises: an
    infrastructure failure is logged (a delete must not turn into a 500)."""
    try:
        return bool(await registry.stop(path))
    except Exception as e:
        log.warning("sandbox.stop_failed", workspace=str(path), error=str(e)[:300])
        return False


async def stop_opened(registry: ServiceRegistry, runner: CallRunner, *, parallel: int) -> None:
    """Stop every sandbox the service opened, ``parallel`` at a time (bounded like starts:
    each stop is an engine call, a gVisor one takes seconds under load), and forget each.
    One at a time, a service holding many workspaces outlasted the grace an orchestrator
    gives it (350 gVisor forks took minutes) and left the rest running. Never raises.

    "Opened": what the routes marked (``runner.opened``) and every workspace this
    process's registry holds, so a route that starts a sandbox without marking it (a
    read, a diff, an undo, a call refused once the sandbox had started) leaves none
    running past the service."""
    held = registry.pool.opened() if isinstance(registry, ToolRegistry) else {}
    gate = asyncio.Semaphore(max(1, parallel))

    async def one(path: Path) -> None:
        async with gate:
            await stop_sandbox(registry, path)
            runner.forget(path)

    await asyncio.gather(*(one(p) for p in sorted(set(runner.opened) | set(held))))
