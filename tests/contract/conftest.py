"""The tool contract suite: every test here runs on the local backend (fast, no Docker)
and on the real Docker sandbox (marked ``docker``; skips without an engine unless
``REQUIRE_DOCKER=1``): the default image under runc, and three more images under runc and
gVisor. Those three are why the agent brings its own interpreter: ``minimal`` (Debian with
python3), ``busybox`` (nothing but a static busybox: no python3, no libc) and ``musl``
(musl as its only C library)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import MINIMAL_IMAGE
from worker import ToolRegistry

IMAGES = {"minimal": MINIMAL_IMAGE, "busybox": "loom-test-busybox:latest", "musl": "loom-test-musl:latest"}
VARIANTS = [
    pytest.param(("local", None, None), id="local"),
    pytest.param(("docker", None, "runc"), id="docker", marks=pytest.mark.docker),
    # A warm sandbox claimed by the workspace (issue 44): the same suite as a fresh one.
    pytest.param(("pooled", None, "runc"), id="pooled", marks=pytest.mark.docker),
    pytest.param(("pooled", None, "runsc"), id="pooled-runsc", marks=pytest.mark.docker),
] + [
    pytest.param(("docker", image, runtime), id=f"{name}-{runtime}", marks=pytest.mark.docker)
    for name, image in IMAGES.items()
    for runtime in ("runc", "runsc")
]


@pytest.fixture(params=VARIANTS)
def registry(request: pytest.FixtureRequest) -> ToolRegistry:
    """A ToolRegistry with the tools on the local backend or a Docker sandbox.

    The backend fixture closes its connections (and removes Docker containers).
    """
    kind, image, _runtime = request.param
    name = f"{kind}_backend" if kind in ("local", "pooled") or image is None else "variant_backend"
    return ToolRegistry(backend=request.getfixturevalue(name))


@pytest.fixture
async def variant_backend(request: pytest.FixtureRequest, docker_ready: None) -> AsyncIterator[object]:
    """The Docker backend of the registry's image and runtime (containers removed after)."""
    from tests.docker.conftest import own_backend, require_runtime

    _kind, image, runtime = request.node.callspec.params["registry"]
    require_runtime(runtime)
    async with own_backend(runtime, image=image) as backend:
        yield backend


@pytest.fixture
async def pooled_backend(request: pytest.FixtureRequest, docker_ready: None, workspace: Path) -> AsyncIterator[object]:
    """A Docker backend with a warm sandbox ready: the test's workspace claims it (checked
    after the test: a workspace of the test started, and from the pool). Under gVisor a
    warm sandbox takes only an empty workspace, so the test's is claimed before the test
    puts its files there from the host (a new workspace made, then filled)."""
    from tests.docker.conftest import pooled_backend as make
    from tests.docker.conftest import require_runtime

    _kind, _image, runtime = request.node.callspec.params["registry"]
    require_runtime(runtime)
    async with make(runtime, size=1) as backend:
        if runtime == "runsc":
            await backend.ensure_container(workspace)
        yield backend
        status = backend.pool_status()
        assert status is not None
        if backend._started:  # the test opened a workspace
            assert status["claims"] >= 1, status
