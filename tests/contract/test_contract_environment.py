"""What every image must give the tools, whatever it holds (no python3, musl, busybox):
commands killed with everything they started on timeout, the output limit, the image's
own environment, and the changelog recording and undoing a command's changes exactly."""

from __future__ import annotations

from pathlib import Path

from tests.treehash import tree_diff, tree_state
from worker import ToolRegistry
from worker.changelog import Changelog

# Each process's command line, one a line, from /proc (no ps needed: busybox, musl images).
PROCS = 'for p in /proc/[0-9]*; do tr "\\0" " " < $p/cmdline 2>/dev/null; echo; done'


async def test_a_timeout_kills_everything_the_command_started(registry: ToolRegistry, workspace: Path) -> None:
    command = "sleep 1001 & (sleep 1002 &) ; setsid sh -c 'sleep 1003' & echo started; sleep 1004"
    r = await registry.execute("shell_execute", {"command": command, "timeout": 1}, workspace)
    assert not r.success and (r.data or {}).get("outcome") == "timeout" and "started" in r.output
    r = await registry.execute("shell_execute", {"command": PROCS}, workspace)
    assert r.success and not any(f"sleep 100{i}" in r.output for i in range(1, 5)), r.output


async def test_a_command_printing_without_end_is_stopped(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("shell_execute", {"command": "yes loom", "timeout": 60}, workspace)
    assert not r.success and (r.data or {}).get("outcome") == "output_limit", r.output
    r = await registry.execute("shell_execute", {"command": "echo next"}, workspace)
    assert r.success and "next" in r.output


async def test_commands_run_with_sh_in_the_workspace(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("shell_execute", {"command": 'echo "$0"; echo "$PATH"; pwd'}, workspace)
    assert r.success, r.output
    shell, path, cwd = r.output.splitlines()[:3]
    assert shell in ("sh", "/bin/sh") and "/bin" in path.split(":")
    assert cwd in ("/workspace", str(workspace))  # the container's mount, or the local backend's directory


async def test_the_changelog_undoes_a_command_exactly(registry: ToolRegistry, workspace: Path, tmp_path: Path) -> None:
    (workspace / "keep.txt").write_text("one\n")
    (workspace / "gone.txt").write_text("two\n")
    before = tree_state(workspace)
    async with Changelog.open(tmp_path / "data", workspace) as cl:
        reg = ToolRegistry(backend=registry.backend, recorder_factory=lambda _root: cl)
        command = (
            "echo more >> keep.txt && rm gone.txt && mkdir -p d/e && echo n > d/e/new.txt"
            " && ln -s keep.txt link && chmod 700 d"
        )
        r = await reg.execute("shell_execute", {"command": command}, workspace, call_id="c1")
        assert r.success, r.output
        assert sorted(r.files_changed) == ["d/e/new.txt", "gone.txt", "keep.txt", "link"]
        result = await cl.undo((await reg.workspace(workspace)).sandbox, call_id="c1")
        assert {s.status for s in result.steps} == {"reverted"}
    assert tree_diff(before, tree_state(workspace)) == []
