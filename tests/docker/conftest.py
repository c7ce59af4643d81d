"""Docker-tier fixtures: real engine, both runtimes where it applies."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.docker import DockerBackend
from sandbox.spec import SandboxSpec
from tests.conftest import POOL_ROOT, REQUIRE_DOCKER, SANDBOX_IMAGE, TEST_OWNER, gvisor_available
from tests.servers import serve_app
from worker.http import create_app
from worker.owner import OWNER_FILE
from worker.settings import Settings

pytestmark = pytest.mark.docker


def make_backend(runtime: str = "runc", **spec: object) -> DockerBackend:
    spec = {"image": SANDBOX_IMAGE, "runtime": runtime, "owner": TEST_OWNER, **spec}
    return DockerBackend(SandboxSpec(**spec), worker_id="test")  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def own_backend(runtime: str = "runc", **spec: object) -> AsyncIterator[DockerBackend]:
    """A backend with its own spec, whose containers are removed afterwards."""
    backend = make_backend(runtime, **spec)
    try:
        yield backend
    finally:
        await backend.remove_all_started()
        await backend.aclose()


@contextlib.asynccontextmanager
async def served(
    tmp_path: Path, token: str, workspace: str = "w", runtime: str = "runc", **settings: object
) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP service (uvicorn on a free port) on ``runtime``, over a workspace root under
    ``tmp_path`` holding ``workspace`` owned by uid 1000; an ``httpx.AsyncClient`` at its
    address with ``token``. Its sandboxes are stopped with it (its lifespan)."""
    root, data = tmp_path / "root", tmp_path / "data"
    (root / workspace).mkdir(parents=True)
    os.chown(root / workspace, 1000, 1000)
    data.mkdir()
    (data / OWNER_FILE).write_text(TEST_OWNER + "\n")  # the run's sandboxes are the run's
    config = Settings(
        workspace_root=root,
        data_dir=data,
        image=SANDBOX_IMAGE,
        runtime=runtime,
        catalog=False,
        api_token=token,
        **settings,  # type: ignore[arg-type]
    )
    headers = {"Authorization": f"Bearer {token}"}
    async with serve_app(create_app(config)) as url, httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as c:
        yield c


async def wait_ready(backend: DockerBackend, n: int, timeout: float = 60.0) -> dict[str, Any]:
    """Wait until ``backend``'s pool has ``n`` warm sandboxes ready; its status."""
    import asyncio

    assert backend.pool is not None
    await backend.start_pool()
    assert backend.pool.disabled is None, backend.pool.disabled
    deadline = asyncio.get_running_loop().time() + timeout
    while backend.pool.status()["ready"] < n:
        assert asyncio.get_running_loop().time() < deadline, backend.pool.status()
        await asyncio.sleep(0.05)
    return backend.pool.status()


@contextlib.asynccontextmanager
async def pooled_backend(
    runtime: str = "runc",
    size: int = 1,
    max_total: int = 8,
    ready: int | None = None,
    freeze: bool = False,
    mode: str = "fixed",
    **spec: object,
) -> AsyncIterator[DockerBackend]:
    """A backend with a warm pool of ``size`` per class (``ready`` of them waited for,
    default ``size``; gVisor's frozen while they wait with ``freeze``; ``mode`` "demand":
    sized by demand up to ``size``); its containers, warm ones too, are removed afterwards."""
    from sandbox.docker.pool import PoolConfig

    spec = {"image": SANDBOX_IMAGE, "runtime": runtime, "owner": TEST_OWNER, **spec}
    pool = PoolConfig(mode=mode, size=size, max_total=max_total, root=POOL_ROOT, freeze=freeze)
    backend = DockerBackend(SandboxSpec(**spec), worker_id="test", pool=pool)  # type: ignore[arg-type]
    try:
        await wait_ready(backend, size if ready is None else ready)
        yield backend
    finally:
        await backend.remove_all_started()
        await backend.aclose()


@contextlib.asynccontextmanager
async def own_registry(
    tmp_path: Path, runtime: str = "runc", *, stop: bool = True, **settings: object
) -> AsyncIterator[Any]:
    """A default registry (catalog off, data under ``tmp_path``) whose sandboxes are
    stopped afterwards (``stop``: False for an engine the test made unreachable; the test
    then removes what it started). ``settings`` are ``worker.settings.Settings`` fields."""
    from worker.registry import default_registry
    from worker.settings import Settings

    require_runtime(runtime)
    owner = tmp_path / "data" / OWNER_FILE
    if not owner.exists():  # the run's sandboxes are the run's (see TEST_OWNER)
        owner.parent.mkdir(parents=True, exist_ok=True)
        owner.write_text(TEST_OWNER + "\n")
    s = Settings(data_dir=tmp_path / "data", image=SANDBOX_IMAGE, runtime=runtime, catalog=False, **settings)  # type: ignore[arg-type]
    reg = default_registry(s)
    try:
        yield reg
    finally:
        for ws in reg.pool.opened() if stop else ():
            await reg.stop(ws)
        await reg.aclose()


def require_runtime(runtime: str) -> None:
    """Skip a gVisor test where gVisor is not installed; fail it in CI (REQUIRE_DOCKER=1)."""
    if runtime == "runsc" and not gvisor_available():
        if REQUIRE_DOCKER:
            pytest.fail("REQUIRE_DOCKER=1 but the runsc runtime is not registered with Docker")
        pytest.skip("gVisor (runsc) is not registered with Docker")


@pytest.fixture(params=["runc", "runsc"])
async def runtime_backend(request: pytest.FixtureRequest, docker_ready: None) -> AsyncIterator[DockerBackend]:
    """The same test on runc and on gVisor. gVisor is required in CI (REQUIRE_DOCKER=1)."""
    runtime = request.param
    require_runtime(runtime)
    backend = make_backend(runtime)
    try:
        yield backend
    finally:
        await backend.remove_all_started()
        await backend.aclose()


@pytest.fixture
def user_workspace(workspace: Path) -> Path:
    """A workspace owned by an ordinary uid (1000), as on a developer machine."""
    os.chown(workspace, 1000, 1000)
    return workspace
