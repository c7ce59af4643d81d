"""gVisor's platform: a sandbox runs on the platform configured (LOOM_GVISOR_PLATFORM), seen
from the outside, and the worker refuses a sandbox on any other."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend, gvisor
from sandbox.errors import RuntimeUnavailableError
from sandbox.spec import SandboxSpec
from tests.conftest import REQUIRE_DOCKER, SANDBOX_IMAGE
from tests.docker.conftest import own_backend, require_runtime

pytestmark = pytest.mark.docker


def _engine_runtimes() -> dict[str, Any]:
    out = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, timeout=20)
    return dict(json.loads(out.stdout or b"{}"))


def require_platform(platform: str) -> str:
    """The engine runtime for ``platform``; skips (fails in CI) when it has none."""
    require_runtime("runsc")
    try:
        return gvisor.engine_runtime(_engine_runtimes(), platform)
    except RuntimeUnavailableError as e:
        if REQUIRE_DOCKER and platform != "kvm":
            pytest.fail(f"REQUIRE_DOCKER=1 but {e}")
        pytest.skip(str(e))


def _stubs(pid: int) -> list[int]:
    """The host processes gVisor's sandbox process ``pid`` runs the sandboxed programs in
    (its platform's stubs: every descendant but the sandbox kernel's own process)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        kids = []
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:  # a child is listed under the thread that made it
            try:
                kids += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        out += kids
        todo += kids
    return out


def _tracer(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize("platform", ["systrap", "ptrace"])
async def test_the_sandbox_runs_on_the_platform_configured(docker_ready: None, workspace: Path, platform: str) -> None:
    """Seen from the host: the container runs on the engine runtime registered for the
    platform, gVisor's sandbox process booted with it, and its stub processes behave as
    that platform's do (ptrace: every stub is ptrace-stopped by a sandbox thread;
    systrap: none is traced, the stubs trap system calls with seccomp)."""
    runtime = require_platform(platform)
    async with own_backend("runsc", gvisor_platform=platform) as backend:
        box = await backend.get(workspace)
        r = await box.exec(ExecRequest("sleep 0.3 & echo hi; wait"))
        assert (r.exit_code, r.stdout) == (0, b"hi\n")
        attrs = await backend.inspect(workspace)
        assert attrs is not None
        assert attrs["HostConfig"]["Runtime"] == runtime
        pid = attrs["State"]["Pid"]
        if not os.path.exists(f"/proc/{pid}/cmdline"):
            pytest.skip("the engine's processes are not visible from this pid namespace")
        assert gvisor.platform_in_effect(pid) == platform
        stubs = [s for s in _stubs(pid) if Path(f"/proc/{s}/status").exists()]
        assert stubs, "no stub process found under gVisor's sandbox process"
        tracers = [_tracer(s) for s in stubs]
        if platform == "ptrace":
            assert all(t != 0 for t in tracers), tracers
        else:
            assert all(t == 0 for t in tracers), tracers


async def test_a_platform_the_engine_has_no_runtime_for_is_refused(docker_ready: None, workspace: Path) -> None:
    """No runtime for the platform asked for: the sandbox does not start on another one,
    and the message names the setting and what is registered."""
    require_runtime("runsc")
    runtimes = _engine_runtimes()
    missing = next((p for p in gvisor.PLATFORMS if _has_no_runtime(runtimes, p)), None)
    if missing is None:
        pytest.skip("the engine has a runtime for every gVisor platform")
    async with own_backend("runsc", gvisor_platform=missing) as backend:
        box = await backend.get(workspace)
        with pytest.raises(RuntimeUnavailableError, match="LOOM_GVISOR_PLATFORM") as e:
            await box.exec(ExecRequest("true"))
        assert "registered:" in str(e.value)
        assert await backend.inspect(workspace) is None  # nothing was started


def _has_no_runtime(runtimes: dict[str, Any], platform: str) -> bool:
    try:
        gvisor.engine_runtime(runtimes, platform)
    except RuntimeUnavailableError:
        return True
    return False


async def test_a_sandbox_on_another_platform_is_refused(docker_ready: None, workspace: Path) -> None:
    """The engine hands the sandbox another platform than the one its runtime was picked
    for (a runtime re-registered under the worker, say): the platform in effect is what
    counts, the container is removed and nothing runs in it."""
    systrap = require_platform("systrap")
    ptrace = require_platform("ptrace")

    class Mislabeled(DockerBackend):
        def container_config(self, ws: Path) -> dict[str, Any]:
            cfg: dict[str, Any] = super().container_config(ws)
            assert cfg["runtime"] == systrap
            cfg["runtime"] = ptrace
            return cfg

    backend = Mislabeled(SandboxSpec(image=SANDBOX_IMAGE, runtime="runsc", gvisor_platform="systrap"), worker_id="t")
    try:
        box = await backend.get(workspace)
        with pytest.raises(RuntimeUnavailableError, match="runs on ptrace"):
            await box.exec(ExecRequest("true"))
        assert await backend.inspect(workspace) is None
    finally:
        await backend.remove_all_started()
        await backend.aclose()


async def test_the_agent_dials_the_workers_socket_under_gvisor(
    docker_ready: None, tmp_path: Path, workspace: Path
) -> None:
    """gVisor's /tmp lives in its own kernel, so the host cannot reach the agent's socket
    there: the worker listens in the workspace's channel directory (mounted read-only)
    and the agent dials in. The calls then go over that socket, and the socket file is
    gone once the agent is connected (nothing else in the sandbox can take it)."""
    require_platform("systrap")
    channels = tmp_path / "channels"
    async with own_backend("runsc", channel_dir=str(channels)) as backend:
        box = await backend.get(workspace)
        r = await box.exec(ExecRequest("ls -A /.loom-host; echo done"))
        assert r.exit_code == 0 and r.stdout == b"done\n", r  # the socket file is already gone
        conn = await box.connection()  # type: ignore[attr-defined]
        assert conn.direct
        (workspace / "x.txt").write_text("over the dialled socket")
        assert (await box.read("x.txt")).data == b"over the dialled socket"
        [d] = list(channels.iterdir())
        assert d.name == backend.container_config(workspace)["labels"]["dev.loom.workspace-hash"]
        assert list(d.iterdir()) == []


@pytest.mark.parametrize("platform", ["systrap", "ptrace"])
def test_doctor_names_the_platform_in_effect(docker_ready: None, platform: str) -> None:
    """``loom-worker doctor`` with LOOM_RUNTIME=runsc: the runtime registered for the
    platform configured, and a sandbox started on it (the worker refuses one whose gVisor
    booted another platform, so "as the sandbox process shows" is a check, not a claim)."""
    import sys

    name = require_platform(platform)
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "LOOM_RUNTIME": "runsc",
        "LOOM_GVISOR_PLATFORM": platform,
        "LOOM_LOG_LEVEL": "warning",
        "PYTHONPATH": str(root),
    }
    loom = str(Path(sys.executable).with_name("loom-worker"))
    p = subprocess.run([loom, "doctor"], capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"[ok] gVisor (runsc): platform {platform} (LOOM_GVISOR_PLATFORM) on runtime {name} (" in p.stdout, p.stdout
    assert f"[ok] sandbox start: container + agent answer (gVisor on {platform}, as the sandbox process shows)" in (
        p.stdout
    ), p.stdout


def test_doctor_fails_for_a_platform_the_engine_has_no_runtime_for(docker_ready: None) -> None:
    """A platform with no runtime registered (kvm here, unless this machine has one): doctor
    exits 1 and says what is registered and how to add it."""
    import sys

    require_runtime("runsc")
    runtimes = _engine_runtimes()
    try:
        gvisor.engine_runtime(runtimes, "kvm")
        pytest.skip("this engine has a runtime for gVisor's kvm platform")
    except RuntimeUnavailableError:
        pass
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "LOOM_RUNTIME": "runsc",
        "LOOM_GVISOR_PLATFORM": "kvm",
        "LOOM_LOG_LEVEL": "warning",
        "PYTHONPATH": str(root),
    }
    loom = str(Path(sys.executable).with_name("loom-worker"))
    p = subprocess.run([loom, "doctor"], capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "[FAIL] gVisor (runsc): gVisor's kvm platform was requested (LOOM_GVISOR_PLATFORM=kvm)" in p.stdout, p.stdout
