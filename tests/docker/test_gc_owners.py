"""``loom-worker gc`` removes only its own data directory's sandboxes (issue 38): two
installations sharing one engine must not destroy each other's calls in flight."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from sandbox.docker import container_name
from sandbox.docker.config import LABEL_OWNER
from tests.conftest import SANDBOX_IMAGE, TEST_OWNER
from tests.docker.conftest import own_backend, own_registry, require_runtime
from worker.owner import OWNER_FILE, owner_id

pytestmark = pytest.mark.docker


def _gc(data_dir: Path, runtime: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "LOOM_DATA_DIR": str(data_dir),
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "LOOM_RUNTIME": runtime,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", "gc", *args], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_gc_all_of_one_data_dir_leaves_the_others_running(
    docker_ready: None, tmp_path: Path, runtime: str
) -> None:
    require_runtime(runtime)
    ws_a, ws_b = tmp_path / "ws-a", tmp_path / "ws-b"
    ws_a.mkdir()
    ws_b.mkdir()
    for name in ("a", "b"):  # two installations (not the run's TEST_OWNER)
        (tmp_path / name / "data").mkdir(parents=True)
        (tmp_path / name / "data" / OWNER_FILE).write_text(f"{TEST_OWNER}-{name}\n")
    client = docker.from_env()
    try:
        async with own_registry(tmp_path / "a", runtime) as reg_a, own_registry(tmp_path / "b", runtime) as reg_b:
            for reg, ws in ((reg_a, ws_a), (reg_b, ws_b)):
                result = await reg.execute("shell_execute", {"command": "echo up"}, workspace=ws)
                assert result.success, result.error
            labels = [client.containers.get(container_name(ws)).labels for ws in (ws_a, ws_b)]
            assert labels[0][LABEL_OWNER] == owner_id(tmp_path / "a" / "data")
            assert labels[1][LABEL_OWNER] == owner_id(tmp_path / "b" / "data")
            assert labels[0][LABEL_OWNER] != labels[1][LABEL_OWNER]

            done = _gc(tmp_path / "a" / "data", runtime, "--all")
            assert done.returncode == 0, done.stderr
            assert container_name(ws_a) in done.stdout
            assert container_name(ws_b) not in done.stdout
            with pytest.raises(docker.errors.NotFound):
                client.containers.get(container_name(ws_a))
            assert client.containers.get(container_name(ws_b)).status == "running"
            # The other installation's sandbox still answers, on the same agent.
            result = await reg_b.execute("shell_execute", {"command": "echo still"}, workspace=ws_b)
            assert result.success and "still" in result.output, result
    finally:
        client.close()


async def test_gc_all_of_a_data_dir_holding_an_owner_id_removes_that_owners_sandboxes(
    docker_ready: None, tmp_path: Path, workspace: Path
) -> None:
    """How scripts/test leaves none of its run's sandboxes behind: its tests' sandboxes
    carry the run's id, and it runs ``gc --all`` for a data directory holding that id."""
    owner = f"{TEST_OWNER}-run"
    data = tmp_path / "data"
    data.mkdir()
    (data / OWNER_FILE).write_text(owner + "\n")
    async with own_backend(owner=owner) as backend:
        await (await backend.get(workspace)).info()
        done = _gc(data, "runc", "--all")
        assert done.returncode == 0, done.stderr
        assert container_name(workspace) in done.stdout
        assert await backend.inspect(workspace) is None
