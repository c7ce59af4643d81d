"""The tool contract suite: every test here runs on the local backend (fast, no Docker)
and on the real Docker sandbox (marked ``docker``; skips without an engine unless
``REQUIRE_DOCKER=1``)."""

from __future__ import annotations

import pytest

from worker import ToolRegistry


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def registry(request: pytest.FixtureRequest) -> ToolRegistry:
    """A ToolRegistry with the six tools on ``local_backend`` or ``docker_backend``.

    The backend fixture closes its connections (and removes Docker containers).
    """
    backend = request.getfixturevalue(f"{request.param}_backend")
    return ToolRegistry(backend=backend)
