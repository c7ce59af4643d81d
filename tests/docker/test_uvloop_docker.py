"""The Docker transport under uvloop (see tests/unit/test_uvloop.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import uvloop  # a declared dependency (pyproject): never skipped

from tests.unit.test_uvloop import _session

pytestmark = pytest.mark.docker


def test_docker_backend_under_uvloop(workspace: Path, docker_ready: None) -> None:
    from sandbox.docker import DockerBackend
    from sandbox.spec import SandboxSpec
    from tests.conftest import SANDBOX_IMAGE

    async def go() -> None:
        backend = DockerBackend(SandboxSpec(image=SANDBOX_IMAGE), worker_id="test")
        try:
            await _session(backend, workspace)
        finally:
            await backend.remove_all_started()
            await backend.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(go())
