"""The tools on the real Docker sandbox, beyond the contract suite (tests/contract, which
runs every tool test on Docker too): ripgrep in the image, the container as the place
commands run, ``default_registry`` end to end, the CLI's default backend, and a container
dying mid-command reported as infrastructure."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.docker import DockerBackend
from sandbox.spec import SandboxSpec
from tests.conftest import SANDBOX_IMAGE
from worker import ToolRegistry, default_registry

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry(docker_backend: DockerBackend) -> ToolRegistry:
    return ToolRegistry(backend=docker_backend)


async def test_search_uses_ripgrep_and_treats_dash_as_pattern(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "x").write_text("#!/bin/sh\ntouch PWNED\n")
    (workspace / "x").chmod(0o755)
    (workspace / "a.txt").write_text("--pre=x is text\n")
    r = await registry.execute("search_files", {"pattern": "--pre=x"}, workspace)
    assert r.success, r.error
    assert r.data is not None and r.data["engine"] == "ripgrep"
    assert r.output == "a.txt:1: --pre=x is text"
    assert not (workspace / "PWNED").exists()


async def test_search_large_tree(registry: ToolRegistry, workspace: Path) -> None:
    for d in range(50):
        sub = workspace / f"pkg{d}"
        sub.mkdir()
        for f in range(100):
            (sub / f"m{f}.py").write_text(f"def f_{d}_{f}():\n    return {f}\n")
    (workspace / "node_modules").mkdir()
    (workspace / "node_modules" / "dep.py").write_text("def f_99_99(): pass\n")
    r = await registry.execute("search_files", {"pattern": r"def f_7_\d+\(", "file_pattern": "*.py"}, workspace)
    assert r.success and r.data is not None and r.data["count"] == 100 and r.data["truncated"] is False
    r = await registry.execute("search_files", {"pattern": "return"}, workspace)
    assert r.success and r.data is not None and r.data["count"] == 200 and r.data["truncated"] is True
    r = await registry.execute("search_files", {"pattern": "f_99_99"}, workspace)
    assert r.success and r.data is not None and r.data["count"] == 0  # node_modules skipped


async def test_commands_run_inside_the_container(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute(
        "shell_execute", {"command": "pwd; cat /etc/debian_version >/dev/null && echo debian"}, workspace
    )
    assert r.success, r.error
    assert r.output.splitlines() == ["/workspace", "debian"]
    r = await registry.execute(
        "shell_execute",
        {"command": "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\""},
        workspace,
    )
    assert not r.success and r.data is not None and r.data["exit_code"] != 0  # no network


async def test_container_killed_mid_command_is_infrastructure(
    registry: ToolRegistry, docker_backend: DockerBackend, workspace: Path
) -> None:
    r = await registry.execute("shell_execute", {"command": "true"}, workspace)
    assert r.success
    box = await docker_backend.get(workspace)
    name = box.container_name  # type: ignore[attr-defined]

    async def kill_soon() -> None:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(subprocess.run, ["docker", "kill", name], capture_output=True, check=False)

    killer = asyncio.create_task(kill_soon())
    r = await registry.execute("shell_execute", {"command": "echo before; sleep 30"}, workspace)
    await killer
    assert not r.success
    assert r.data is not None and r.data["error_kind"] == "infrastructure", r
    assert r.error is not None and "Sandbox unavailable" in r.error
    # The next call gets a fresh container.
    r = await registry.execute("shell_execute", {"command": "echo again"}, workspace)
    assert r.success and r.output == "again\n"


async def test_default_registry_end_to_end(workspace: Path, docker_ready: None) -> None:
    async with default_registry(image=SANDBOX_IMAGE) as reg:
        try:
            w = await reg.execute("write_file", {"path": "src/app.py", "content": "print('hi')\n"}, workspace)
            assert w.success and w.files_changed == ["src/app.py"]
            e = await reg.execute("edit_file", {"path": "src/app.py", "old_str": "hi", "new_str": "yo"}, workspace)
            assert e.success, e.error
            s = await reg.execute("shell_execute", {"command": "python3 src/app.py"}, workspace)
            assert s.success and s.output == "yo\n"
            f = await reg.execute("search_files", {"pattern": "print"}, workspace)
            assert f.success and f.output == "src/app.py:1: print('yo')"
            d = await reg.execute("list_directory", {}, workspace)
            assert d.success and d.output.splitlines() == ["./", "  src/", "    app.py"]
            r = await reg.execute("read_file", {"path": "src/app.py"}, workspace)
            assert r.success and r.output == "print('yo')\n"
        finally:
            await reg.stop(workspace)


def test_cli_call_default_backend_is_docker(workspace: Path, tmp_path: Path, docker_ready: None) -> None:
    (workspace / "hello.txt").write_text("from the host\n")
    env = {**os.environ, "LOOM_IMAGE": SANDBOX_IMAGE, "LOOM_LOG_LEVEL": "warning", "LOOM_DATA_DIR": str(tmp_path)}
    env.pop("LOOM_ALLOW_UNSAFE_LOCAL", None)
    env["PYTHONPATH"] = str(ROOT)  # this checkout's code, also from a git worktree without a .venv
    exe = str(Path(sys.executable).with_name("loom-worker"))
    try:
        p = subprocess.run(
            [
                exe,
                "call",
                "shell_execute",
                "--workspace",
                str(workspace),
                "--args",
                '{"command": "cat hello.txt; pwd"}',
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        result = json.loads(p.stdout)
        assert result["output"] == "from the host\n/workspace\n"
        p = subprocess.run(
            [exe, "call", "read_file", "--workspace", str(workspace), "--args", '{"path": "nope"}'],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert p.returncode == 1 and "not found" in json.loads(p.stdout)["error"]
    finally:

        async def cleanup() -> None:
            backend = DockerBackend(SandboxSpec(image=SANDBOX_IMAGE), worker_id="test")
            await backend.stop(workspace)
            await backend.aclose()

        asyncio.run(cleanup())
