"""The example evaluation (examples/inspect_eval) run with the real ``inspect eval``
command and inspect's ``mockllm`` model (scripted, no network), in loom sandboxes under
runc and gVisor (issue 26); and Ctrl-C during a sample leaves no sandbox behind.

The provider is found by inspect through its entry point (``sandbox=("loom", ...)``,
nothing imported by the task). Each run gets its own workspace root and data directory,
so what it leaves (or not) is its own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import SANDBOX_IMAGE, require_docker, sandboxes_under
from tests.docker.conftest import require_runtime

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "inspect_eval"
INSPECT = Path(sys.executable).with_name("inspect")


def _config(tmp_path: Path, source: Path) -> Path:
    """The example's own config, with this run's workspace root."""
    cfg = yaml.safe_load(source.read_text())
    cfg.update(image=SANDBOX_IMAGE, workspace_root=str(tmp_path / "workspaces"))
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "LOOM_DATA_DIR": str(tmp_path / "data"), "INSPECT_LOG_DIR": str(tmp_path / "logs")}


@pytest.mark.parametrize("config", ["loom.yaml", "loom-gvisor.yaml"], ids=["runc", "runsc"])
def test_the_example_eval_runs_with_inspect_eval(tmp_path: Path, config: str) -> None:
    from inspect_ai.log import list_eval_logs, read_eval_log

    require_docker()
    source = EXAMPLE / config
    require_runtime(yaml.safe_load(source.read_text())["runtime"])
    cfg = _config(tmp_path, source)
    run = subprocess.run(
        [str(INSPECT), "eval", "examples/inspect_eval/task.py", "-T", f"config={cfg}", "--display", "plain"],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    logs = list_eval_logs(str(tmp_path / "logs"))
    assert len(logs) == 1
    log = read_eval_log(logs[0])
    assert log.status == "success", log.error
    assert log.eval.sandbox is not None and log.eval.sandbox.type == "loom"
    samples = {s.id: s for s in log.samples or []}
    # The scripted model fixes the two bugs it knows and not the third: the scorer, the
    # project's own tests run in each sample's sandbox, says so.
    assert {k: (s.scores or {})["project_tests"].value for k, s in samples.items()} == {
        "sub": "C",
        "mul": "C",
        "unary-minus": "I",
    }
    for sample in samples.values():
        tools = [e for e in sample.events if e.event == "tool"]
        execs = [e for e in sample.events if e.event == "sandbox" and e.action == "exec"]
        writes = [e for e in sample.events if e.event == "sandbox" and e.action == "write_file"]
        assert tools and all(t.function == "bash" and t.error is None for t in tools)
        assert "FAIL: test_" in str(tools[0].result)  # the run of the tests, through loom
        assert any((e.cmd or "").startswith("bash --login -c") for e in execs)  # the tool's call
        assert any((e.cmd or "").startswith("python3 -m unittest") for e in execs)  # the scorer's
        assert {"./tinycalc/ops.py", "./tests/test_tinycalc.py"} <= {e.file for e in writes}  # sample files
    fixed = [str(t.result) for t in samples["sub"].events if t.event == "tool"][-1]
    assert "OK" in fixed
    # Every sample's sandbox and workspace is gone.
    assert sandboxes_under(tmp_path) == []
    assert list((tmp_path / "workspaces").iterdir()) == []


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_sample_leaves_no_sandbox(tmp_path: Path) -> None:
    require_docker()
    cfg = _config(tmp_path, EXAMPLE / "loom.yaml")
    proc = subprocess.Popen(
        [str(INSPECT), "eval", "tests/fixtures/inspect_slow/task.py", "-T", f"config={cfg}", "--display", "plain"],
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A suite started in the background (`cmd &`) has SIGINT ignored, which children
        # inherit, and Python then installs no KeyboardInterrupt handler: restore it, so
        # the Ctrl-C below is the one a user's terminal sends.
        preexec_fn=_sigint_default,
    )
    try:
        deadline = time.monotonic() + 120
        # Wait until the sample's command runs in its sandbox.
        while time.monotonic() < deadline and proc.poll() is None:
            started = list((tmp_path / "workspaces").glob("*"))
            if started and sandboxes_under(tmp_path):
                out = subprocess.run(
                    ["docker", "exec", sandboxes_under(tmp_path)[0], "cat", "/tmp/started"],
                    capture_output=True,
                )
                if out.returncode == 0:
                    break
            time.sleep(0.3)
        else:
            pytest.fail(f"the sample never started: {proc.stdout.read() if proc.stdout else ''}")
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # inspect asks for a second one to stop at once
            proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sandboxes_under(tmp_path) == []
    assert list((tmp_path / "workspaces").iterdir()) == []


async def test_inspect_sandbox_cleanup_removes_what_a_run_left(tmp_path: Path) -> None:
    """``inspect sandbox cleanup loom ID`` (the provider's cli_cleanup, in a process of its
    own) removes a sandbox an eval left behind (here: a task ended with cleanup off)."""
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    from worker.integrations.inspect import LoomSandboxEnvironment, lifecycle

    require_docker()
    provider = registry_find_sandboxenv("loom")
    config = provider.config_deserialize({"image": SANDBOX_IMAGE, "workspace_root": str(tmp_path / "workspaces")})
    await provider.task_init("left", config)
    envs = await provider.sample_init("left", config, {"__sample_id__": "1"})
    workspace = envs["default"].as_type(LoomSandboxEnvironment).workspace
    await provider.task_cleanup("left", config, False)  # as --no-sandbox-cleanup leaves it
    try:
        assert len(sandboxes_under(tmp_path)) == 1
        run = await asyncio.to_thread(
            subprocess.run,
            [str(INSPECT), "sandbox", "cleanup", "loom", str(workspace)],
            cwd=ROOT,
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert sandboxes_under(tmp_path) == []
    finally:
        lifecycle._outstanding.pop(workspace, None)  # (nothing left for this process's exit hook)


async def test_several_services_a_workspace_each_and_config_files(tmp_path: Path) -> None:
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    from tests.conftest import MINIMAL_IMAGE
    from worker.integrations.inspect import LoomSandboxEnvironment

    require_docker()
    (tmp_path / "fixture.bin").write_bytes(b"\x00fixture\xff")
    provider = registry_find_sandboxenv("loom")
    config = provider.config_deserialize(
        {
            "image": SANDBOX_IMAGE,
            "workspace_root": str(tmp_path / "workspaces"),
            "files": {"data/fixture.bin": str(tmp_path / "fixture.bin")},
            "services": {"db": {"image": MINIMAL_IMAGE, "env": {"ROLE": "db"}}, "default": {}},
        }
    )
    await provider.task_init("multi", config)
    envs = await provider.sample_init("multi", config, {"__sample_id__": "7"})
    try:
        assert list(envs) == ["default", "db"]  # the default first
        default, db = envs["default"].as_type(LoomSandboxEnvironment), envs["db"].as_type(LoomSandboxEnvironment)
        assert default.workspace != db.workspace and len(sandboxes_under(tmp_path)) == 2
        assert await default.read_file("data/fixture.bin", text=False) == b"\x00fixture\xff"
        await default.write_file("only-here.txt", "x")
        assert not (await db.exec(["test", "-e", "only-here.txt"])).success
        assert (await db.exec(["sh", "-c", "echo $ROLE"])).stdout == "db\n"
        conn = await default.connection()
        assert conn.type == "loom" and str(default.workspace) in conn.command and conn.command.endswith("-- bash")
    finally:
        await provider.sample_cleanup("multi", config, envs, False)
        await provider.task_cleanup("multi", config, True)
    assert sandboxes_under(tmp_path) == []
    assert list((tmp_path / "workspaces").iterdir()) == []
