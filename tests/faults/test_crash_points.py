"""The record survives crashes (issue 36), on the real engine, runc and gVisor.

A worker process (a real registry on the Docker backend) is SIGKILLed at each point of a
command rewriting two thousand files and of a write (``LOOM_FAULT_KILL_AT``, see
:mod:`worker.faults`), and while the command runs; the sandbox's container is killed
under a running command, as a dying engine does. Then a new worker opens the workspace:
whatever the command had changed is in the changelog (as its own, marked interrupted),
``undo --all`` gives back the tree there was byte for byte, no staging temporary is left,
and the workspace still has exactly one container.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import docker
import pytest

from sandbox.docker.config import LABEL_WS
from tests.conftest import ORIGINAL_ENV, SANDBOX_IMAGE
from tests.docker.conftest import own_registry, require_runtime
from tests.treehash import tree_diff, tree_state
from worker.changelog import Changelog

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_ready")]

FILES = 2000
REWRITE = (
    'python3 -c "import os\nfor i in range(' + str(FILES) + "): open('f%d.txt' % i, 'w').write('new %d ' % i * 20)\n"
    "open('.rewritten', 'w').close()\" && sleep {sleep}"
)

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from worker.registry import default_registry
    from worker.settings import Settings

    async def main():
        data, ws, runtime, image, tool, args = sys.argv[1:7]
        s = Settings(data_dir=Path(data), image=image, runtime=runtime, catalog=False)
        async with default_registry(s) as reg:
            r = await reg.execute(tool, json.loads(Path(args).read_text()), workspace=ws, call_id="victim")
            print(json.dumps(r.to_dict())[:2000], flush=True)

    asyncio.run(main())
    """
)


def _seed(root: Path) -> None:
    for i in range(FILES):
        (root / f"f{i}.txt").write_text(f"old {i}\n")
    (root / "keep.txt").write_text("kept\n")
    os.system(f"chown -R 1000:1000 {root}")


def _child(data: Path, ws: Path, runtime: str, tool: str, args: str, **env: str) -> subprocess.Popen[str]:
    args_file = data.parent / "args.json"
    args_file.write_text(args)
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data), str(ws), runtime, SANDBOX_IMAGE, tool, str(args_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **env},
    )


def _containers(ws: Path) -> list[str]:
    client = docker.from_env()
    try:
        # (sparse, filtered by the engine: others' containers may go while we look)
        found = client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_WS}={ws}"})
        return [str(c.id) for c in found]
    finally:
        client.close()


def _temporaries(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*.loom-*.tmp")]


async def _after_restart(tmp_path: Path, ws: Path, runtime: str, before: dict[str, tuple[str, int, str]]) -> list:
    """A new worker: its first call reconciles; then the log and ``undo --all``."""
    async with own_registry(tmp_path, runtime) as reg:
        r = await reg.execute("list_directory", {"path": "."}, workspace=str(ws))
        assert r.success, r.output
        async with Changelog.open(tmp_path / "data", ws) as cl:
            box = (await reg.pool.workspace(str(ws))).sandbox
            await cl.recover(box)  # what the next change does first
            entries = await cl.log()
            assert await cl.interrupted() == 0
            assert not _temporaries(ws), _temporaries(ws)
            result = await cl.undo(box, all=True)
            assert not result.failed, result.failed
        assert tree_diff(before, tree_state(ws)) == [], tree_diff(before, tree_state(ws))[:10]
        # The killed worker's container was taken over, not left beside a new one.
        assert len(_containers(ws)) == 1, _containers(ws)
    return entries


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest) -> str:
    require_runtime(request.param)
    return str(request.param)


# Every point under runc; under gVisor the two where its sandbox's scans matter (at the
# others nothing runs in the sandbox between the kill and the intent's line: the same
# host-side code as under runc), as gVisor's scans of two thousand files are slow.
@pytest.mark.parametrize(
    ("kill_runtime", "point"),
    [
        *(("runc", p) for p in ("command.started", "command.ran", "command.recorded", "during")),
        ("runsc", "command.ran"),
        ("runsc", "during"),
    ],
)
async def test_a_command_killed_at_each_point_is_recorded_and_undone(
    tmp_path: Path, workspace: Path, kill_runtime: str, point: str
) -> None:
    require_runtime(kill_runtime)
    runtime = kill_runtime
    _seed(workspace)
    before = tree_state(workspace)
    # A first worker makes the sandbox and the baseline, as a session does.
    async with own_registry(tmp_path, runtime) as reg:
        assert (await reg.execute("shell_execute", {"command": "true"}, workspace=str(workspace))).success
    sleep = "30" if point == "during" else "0"
    args = _json({"command": REWRITE.format(sleep=sleep), "timeout": 120})
    env = {} if point == "during" else {"LOOM_FAULT_KILL_AT": point}
    child = _child(tmp_path / "data", workspace, runtime, "shell_execute", args, **env)
    try:
        if point == "during":
            deadline = time.monotonic() + 120
            while not (workspace / ".rewritten").exists():
                assert child.poll() is None, child.communicate()
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate(timeout=180)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == -signal.SIGKILL, (point, child.returncode, out[-2000:], err[-3000:])
    if point == "command.started":
        # Killed before the command was sent: nothing changed, nothing to record.
        entries = await _after_restart(tmp_path, workspace, runtime, before)
        assert not [e for e in entries if e.call_id == "victim"]
        return
    entries = await _after_restart(tmp_path, workspace, runtime, before)
    victim = [e for e in entries if e.call_id == "victim"]
    changed = {e.path for e in victim}
    assert {f"f{i}.txt" for i in range(FILES)} <= changed, len(changed)
    if point != "command.recorded":  # recorded by the killed worker itself
        assert all("interrupted" in (e.note or "") for e in victim), victim[0]
    assert len(victim) == len({(e.path, e.op) for e in victim}), "recorded twice"


@pytest.mark.parametrize("point", ["write.recorded", "write.placed"])
async def test_a_write_killed_at_each_point_leaves_no_temporary(
    tmp_path: Path, workspace: Path, runtime: str, point: str
) -> None:
    _seed(workspace)
    before = tree_state(workspace)
    async with own_registry(tmp_path, runtime) as reg:
        assert (await reg.execute("shell_execute", {"command": "true"}, workspace=str(workspace))).success
    body = "x" * 3_000_000
    args = _json({"path": "sub/deeper/new.txt", "content": body})
    child = _child(tmp_path / "data", workspace, runtime, "write_file", args, LOOM_FAULT_KILL_AT=point)
    out, err = child.communicate(timeout=180)
    assert child.returncode == -signal.SIGKILL, (point, child.returncode, out[-2000:], err[-3000:])
    # (The agent drops a staging when it sees its worker go; when it cannot, as when the
    # engine dies with it, the staging's intent names the temporary for the next worker.)
    entries = await _after_restart(tmp_path, workspace, runtime, before)
    written = [e for e in entries if e.call_id == "victim"]
    # The file's entry and those of the two directories the write made, each settled.
    assert [e.path for e in written] == ["sub", "sub/deeper", "sub/deeper/new.txt"], written
    assert all(e.state in ("applied", "failed") for e in written), written


async def test_the_sandbox_killed_under_a_command_loses_nothing(tmp_path: Path, workspace: Path, runtime: str) -> None:
    """What a dying engine does to a running command: its container is killed. The worker
    lives on; the command's changes are recorded at the next call, as its own."""
    _seed(workspace)
    before = tree_state(workspace)
    async with own_registry(tmp_path, runtime) as reg:
        assert (await reg.execute("shell_execute", {"command": "true"}, workspace=str(workspace))).success
        call = asyncio.ensure_future(
            reg.execute(
                "shell_execute", {"command": REWRITE.format(sleep="30")}, workspace=str(workspace), call_id="victim"
            )
        )
        deadline = time.monotonic() + 120
        while not (workspace / ".rewritten").exists():
            assert not call.done(), call.result()
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.to_thread(
            subprocess.run, ["docker", "kill", *_containers(workspace)], check=True, capture_output=True
        )
        r = await call
        assert not r.success
        assert (r.data or {}).get("error_kind") == "infrastructure" or "lost" in r.output, r
        r2 = await reg.execute("shell_execute", {"command": "true"}, workspace=str(workspace))
        assert r2.success, r2.output
    async with Changelog.open(tmp_path / "data", workspace) as cl:
        victim = [e for e in await cl.log() if e.call_id == "victim"]
    assert {f"f{i}.txt" for i in range(FILES)} <= {e.path for e in victim}
    async with own_registry(tmp_path, runtime) as reg:
        box = (await reg.pool.workspace(str(workspace))).sandbox
        async with Changelog.open(tmp_path / "data", workspace) as cl:
            assert not (await cl.undo(box, all=True)).failed
    assert tree_diff(before, tree_state(workspace)) == []


def _json(value: object) -> str:
    import json

    return json.dumps(value)


def _restart_engine() -> None:
    """SIGKILL dockerd and start it again the way scripts/setup does; wait until it answers."""
    subprocess.run(["pkill", "-KILL", "-x", "dockerd"], check=False)
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "dockerd did not die"
        time.sleep(0.1)
    systemd = (
        subprocess.run(["systemctl", "is-system-running"], capture_output=True).returncode == 0
        if shutil.which("systemctl")
        else False
    )

    def start() -> None:
        if systemd:
            subprocess.run(["systemctl", "restart", "docker"], check=True)
        else:
            # Started with the environment the test session was started with: this session's
            # XDG_RUNTIME_DIR is removed at its end, and runc would keep its state there (every
            # `docker exec` after the session then fails).
            subprocess.Popen(
                ["sh", "-c", "nohup dockerd >>/var/log/dockerd.log 2>&1 &"], start_new_session=True, env=ORIGINAL_ENV
            ).wait()

    start()
    starts = 1
    deadline = time.monotonic() + 120
    while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "dockerd did not come back"
        time.sleep(0.5)
        if not systemd and starts < 4 and subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True).returncode:
            # The new dockerd gave up ("timeout waiting for containerd to start"): it found
            # the killed one's containerd still winding down, its socket already gone. Once
            # that containerd has ended, a dockerd starts its own.
            time.sleep(2)
            start()
            starts += 1


async def test_the_engine_killed_under_a_command_loses_nothing(tmp_path: Path, workspace: Path, runtime: str) -> None:
    """The Docker engine SIGKILLed while a worker runs a command, then started again: the
    worker answers the call as an infrastructure failure, and the next worker records the
    command's changes as its own and undoes them exactly."""
    _seed(workspace)
    before = tree_state(workspace)
    async with own_registry(tmp_path, runtime) as reg:
        assert (await reg.execute("shell_execute", {"command": "true"}, workspace=str(workspace))).success
    args = _json({"command": REWRITE.format(sleep="60"), "timeout": 120})
    child = _child(tmp_path / "data", workspace, runtime, "shell_execute", args)
    try:
        deadline = time.monotonic() + 120
        while not (workspace / ".rewritten").exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.to_thread(_restart_engine)
        out, err = await asyncio.to_thread(child.communicate, timeout=180)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert '"success": false' in out, (out[-2000:], err[-3000:])
    entries = await _after_restart(tmp_path, workspace, runtime, before)
    victim = [e for e in entries if e.call_id == "victim"]
    assert {f"f{i}.txt" for i in range(FILES)} <= {e.path for e in victim}
