"""Resource limits and hard timeouts: no process a command started survives it."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend
from tests.docker.conftest import make_backend, own_backend, require_runtime

pytestmark = pytest.mark.docker

TIMEOUT = 2.0

# Each case leaves something behind that a naive `kill <pid>` would miss.
CASES = {
    "child": "sleep 600",
    "grandchild": "sh -c 'sh -c \"sleep 601\"'",
    "double_fork": "(sleep 602 &) ; sleep 603",
    "setsid_daemon": "setsid sleep 604 & sleep 605",
    "nohup_background": "nohup sleep 606 >/dev/null 2>&1 & sleep 607",
    "ignores_term": (
        "trap '' TERM; python3 -c 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(608)'"
    ),
    "setsid_python_daemon": (
        "python3 -c 'import os,time\nif os.fork()==0:\n    os.setsid()\n    if os.fork()==0:\n"
        "        time.sleep(609)\n    os._exit(0)\ntime.sleep(610)'"
    ),
}


async def _leftovers(box: object) -> list[str]:
    r = await box.exec(ExecRequest("ps -eo pid,args"))  # type: ignore[attr-defined]
    return [line for line in r.stdout.decode().splitlines() if re.search(r"\bsleep[ (]\d|\byes\b", line)]


@pytest.mark.parametrize("case", sorted(CASES))
async def test_timeout_kills_everything_the_command_started(
    runtime_backend: DockerBackend, user_workspace: Path, case: str
) -> None:
    box = await runtime_backend.get(user_workspace)
    await box.info()
    started = time.monotonic()
    r = await box.exec(ExecRequest(CASES[case], timeout=TIMEOUT))
    elapsed = time.monotonic() - started
    assert r.outcome == "timeout" and r.timed_out and r.exit_code is None
    assert elapsed < TIMEOUT + 2.0, elapsed  # the bound: timeout + 2 s
    assert await _leftovers(box) == []


async def test_background_child_holding_stdout_does_not_hold_the_call(
    runtime_backend: DockerBackend, user_workspace: Path
) -> None:
    box = await runtime_backend.get(user_workspace)
    await box.info()
    started = time.monotonic()
    r = await box.exec(ExecRequest("sleep 300 & echo done", timeout=10))
    assert time.monotonic() - started < 10
    assert r.outcome == "exit" and r.exit_code == 0 and r.stdout == b"done\n"
    assert await _leftovers(box) == []


async def test_output_is_capped_head_and_tail_with_bounded_memory(
    docker_backend: DockerBackend, user_workspace: Path
) -> None:
    box = await docker_backend.get(user_workspace)
    r = await box.exec(
        ExecRequest("echo FIRST; head -c 50000000 /dev/zero | tr '\\0' x; echo; echo LAST", max_output=10_000)
    )
    assert r.outcome == "exit" and r.truncated
    assert r.stdout.startswith(b"FIRST\n") and r.stdout.endswith(b"LAST\n")
    assert b"bytes omitted" in r.stdout and len(r.stdout) < 11_000
    assert r.stdout_bytes > 50_000_000


async def test_runaway_output_stops_the_command(docker_backend: DockerBackend, user_workspace: Path) -> None:
    box = await docker_backend.get(user_workspace)
    r = await box.exec(ExecRequest("yes", timeout=30, output_limit=5_000_000))
    assert r.outcome == "output_limit" and r.truncated
    assert await _leftovers(box) == []
    assert (await box.exec(ExecRequest("pgrep -x yes || echo none"))).stdout == b"none\n"


async def test_exit_codes_and_signals(docker_backend: DockerBackend, user_workspace: Path) -> None:
    box = await docker_backend.get(user_workspace)
    r = await box.exec(ExecRequest("echo out; echo err >&2; exit 7"))
    assert (r.outcome, r.exit_code, r.stdout, r.stderr) == ("exit", 7, b"out\n", b"err\n")
    r = await box.exec(ExecRequest("kill -9 $$"))
    assert r.outcome == "signal" and r.signal == 9 and r.exit_code is None
    r = await box.exec(ExecRequest("echo $CI $PAGER $GIT_PAGER $TERM; test -t 0 || echo no-tty; cat; pwd", cwd="."))
    assert r.stdout == b"1 cat cat dumb\nno-tty\n/workspace\n"


async def test_memory_bomb_is_reported_as_oom_and_sandbox_keeps_serving(
    docker_ready: None, user_workspace: Path
) -> None:
    async with own_backend(memory="192m") as backend:
        box = await backend.get(user_workspace)
        r = await box.exec(ExecRequest("python3 -c 'b=[]\nwhile True: b.append(bytearray(16<<20))'", timeout=60))
        assert r.outcome == "oom", r
        again = await box.exec(ExecRequest("echo alive"))
        assert again.stdout == b"alive\n"


async def test_fork_bomb_is_contained(docker_ready: None, user_workspace: Path) -> None:
    async with own_backend(pids=64) as backend:
        box = await backend.get(user_workspace)
        r = await box.exec(ExecRequest("bomb() { bomb | bomb & }; bomb; sleep 5", timeout=4))
        assert r.outcome in ("timeout", "exit")
        again = await box.exec(ExecRequest("echo alive; ps -e --no-headers | wc -l"))
        lines = again.stdout.decode().split()
        assert lines[0] == "alive"
        assert int(lines[1]) < 10, again  # the bomb is gone, only init, keeper, agent, ps


async def test_tmpfs_fill_hits_its_cap(docker_ready: None, user_workspace: Path) -> None:
    async with own_backend(tmp_size="16m", home_size="8m") as backend:
        box = await backend.get(user_workspace)
        r = await box.exec(ExecRequest("dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>&1; stat -c %s /tmp/fill"))
        assert b"No space left on device" in r.stdout
        assert int(r.stdout.split()[-1]) <= 16 << 20
        r = await box.exec(ExecRequest("dd if=/dev/zero of=$HOME/fill bs=1M count=100 2>&1; stat -c %s $HOME/fill"))
        assert b"No space left on device" in r.stdout
        assert int(r.stdout.split()[-1]) <= 8 << 20
        assert (await box.exec(ExecRequest("echo alive"))).stdout == b"alive\n"


@pytest.mark.parametrize("cpus", [1.0, 1.5])
async def test_agent_sees_the_cpu_quota_it_sizes_searches_by(
    docker_ready: None, user_workspace: Path, cpus: float
) -> None:
    """The agent reads the container's CFS quota from the cgroup (what it sizes ripgrep's
    threads by), and a search works at that size."""
    async with own_backend(cpus=cpus) as backend:
        box = await backend.get(user_workspace)
        info = await box.info()
        assert info.extra.get("cpu_quota") == pytest.approx(cpus)
        (user_workspace / "a.txt").write_text("needle\n")
        for _ in range(3):  # the first as a burst, the next ones back to back
            res = await box.search("needle")
            assert [(m.path, m.line) for m in res.matches] == [("a.txt", 1)]


# The workspace is a bind mount of the host's own disk, which the container's memory and
# tmpfs limits do not cover: a command filling it would fill the host.
FILL = "i=0; while :; do head -c 8388608 /dev/zero > fill$i || exit 9; i=$((i+1)); done"


def _written(ws: Path) -> int:
    return sum(p.stat().st_size for p in ws.glob("fill*"))


@pytest.mark.alone  # (the disk limits count the whole filesystem's use: no other writer on it)
@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_a_command_filling_the_workspace_disk_is_stopped(
    docker_ready: None, user_workspace: Path, runtime: str
) -> None:
    require_runtime(runtime)
    async with own_backend(runtime, disk_limit="64m") as backend:
        box = await backend.get(user_workspace)
        r = await box.exec(ExecRequest(FILL, timeout=120))
        assert r.outcome == "disk_limit" and r.exit_code is None, r
        assert r.disk_used is not None and r.disk_used > 64 << 20
        # Stopped within a few sampling intervals, not at the timeout or a full disk.
        assert 64 << 20 < _written(user_workspace) < 2 << 30
        assert (await box.exec(ExecRequest("echo alive; pgrep -x head || echo none"))).stdout == b"alive\nnone\n"
        # Deleting is fine, and a command that writes within the limit runs.
        r = await box.exec(ExecRequest("rm -f fill*; head -c 1048576 /dev/zero > small && echo ok"))
        assert (r.outcome, r.stdout) == ("exit", b"ok\n")


@pytest.mark.alone  # (the disk limits count the whole filesystem's use: no other writer on it)
async def test_a_command_creating_files_without_end_is_stopped(docker_ready: None, user_workspace: Path) -> None:
    """Empty files fill a disk too (its inodes): a command may create only so many."""
    async with own_backend(inode_limit=500) as backend:
        box = await backend.get(user_workspace)
        r = await box.exec(
            ExecRequest("mkdir many && cd many && i=0; while :; do : > f$i; i=$((i+1)); done", timeout=120)
        )
        assert r.outcome == "disk_limit", r
        assert 500 < len(os.listdir(user_workspace / "many")) < 200_000
        r = await box.exec(ExecRequest("rm -rf many && touch one && echo ok"))
        assert r.stdout == b"ok\n"


@pytest.mark.alone  # (the disk limits count the whole filesystem's use: no other writer on it)
async def test_the_shell_tool_says_the_disk_limit_stopped_the_command(docker_ready: None, user_workspace: Path) -> None:
    from worker import ToolRegistry

    backend = make_backend(disk_limit="48m")
    reg = ToolRegistry(backend=backend)
    try:
        res = await reg.execute("shell_execute", {"command": FILL, "timeout": 120}, user_workspace)
        assert not res.success and res.data["outcome"] == "disk_limit"
        assert res.error is not None and "disk" in res.error and "MB written" in res.error
        assert res.data["exit_code"] is None and res.data["disk_used"] > 48 << 20
    finally:
        await reg.aclose()
        await backend.remove_all_started()


async def test_no_file_grows_past_max_file_size(docker_ready: None, user_workspace: Path) -> None:
    async with own_backend(max_file_size="8m") as backend:
        box = await backend.get(user_workspace)
        r = await box.exec(ExecRequest("head -c 20000000 /dev/zero > big; echo rc=$?"))
        assert b"rc=0" not in r.stdout and b"File size limit exceeded" in r.stderr + r.stdout, r  # SIGXFSZ
        assert (user_workspace / "big").stat().st_size <= 8 << 20
        r = await box.exec(ExecRequest("fallocate -l 100m pre 2>&1; echo rc=$?"))  # allocates nothing, no data written
        assert b"rc=0" not in r.stdout, r
        assert not (user_workspace / "pre").exists() or (user_workspace / "pre").stat().st_size <= 8 << 20
        assert (await box.exec(ExecRequest("head -c 4194304 /dev/zero > ok && echo ok"))).stdout == b"ok\n"


@pytest.mark.alone  # (the disk limits count the whole filesystem's use: no other writer on it)
async def test_commands_and_writes_keep_the_disk_reserve_free(docker_ready: None, user_workspace: Path) -> None:
    """The reserve: free space no command or write may take. Set just below what is free
    now, so that a little writing crosses it."""
    from worker import ToolRegistry

    st = os.statvfs(user_workspace)
    avail = st.f_bavail * st.f_frsize
    backend = make_backend(disk_reserve=avail - (48 << 20), disk_limit=0)
    reg = ToolRegistry(backend=backend)
    try:
        box = await backend.get(user_workspace)
        assert (await box.exec(ExecRequest("echo small > s && echo ok"))).stdout == b"ok\n"  # a little is fine
        r = await box.exec(ExecRequest(FILL, timeout=120))
        assert r.outcome == "disk_limit", r
        assert _written(user_workspace) < 2 << 30
        # The tools' own writes stop short of the reserve too, with a message the model can act on.
        res = await reg.execute("write_file", {"path": "w.txt", "content": "x" * (1 << 20)}, user_workspace)
        assert not res.success and res.error is not None and "No space left" in res.error, res
        assert not (user_workspace / "w.txt").exists()
        await box.exec(ExecRequest("rm -f fill*"))
        res = await reg.execute("write_file", {"path": "w.txt", "content": "x" * (1 << 20)}, user_workspace)
        assert res.success, res.error
    finally:
        await reg.aclose()
        await backend.remove_all_started()


# A command can take its own agent down (same uid): kill it, or freeze it. Whatever it
# started then escapes the agent's tree-kill, and a frozen keeper never ends the container.
ESCAPES = {
    "agent_killed": ("(setsid sleep 1001 &); sleep 0.3; kill -9 $PPID; sleep 5", 10.0),
    "agent_frozen": ("(setsid sleep 1002 &); kill -STOP $PPID; sleep 5", 1.0),
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
async def test_a_command_that_takes_its_agent_down_leaves_nothing_behind(
    runtime_backend: DockerBackend, user_workspace: Path, case: str
) -> None:
    await (await runtime_backend.get(user_workspace)).info()  # the container's main agent
    # A second worker process on the same sandbox: its agent is a `docker exec` one, whose
    # orphans would go to the container's init rather than to an agent.
    other = make_backend(runtime_backend.spec.runtime)
    try:
        box = await other.get(user_workspace)
        command, timeout = ESCAPES[case]
        r = await box.exec(ExecRequest(command, timeout=timeout))
        assert r.outcome == "sandbox_lost" and r.exit_code is None, r
        assert b"restarted" in r.stderr, r.stderr
        after = await box.exec(ExecRequest("ps -eo stat,args"))
        assert after.outcome == "exit", after
        assert b"sleep 100" not in after.stdout, after.stdout.decode()
        assert not [ln for ln in after.stdout.decode().splitlines()[1:] if ln.startswith("T")], after.stdout
        # The first worker's connection was to the old container: it reconnects by itself.
        again = await (await runtime_backend.get(user_workspace)).exec(ExecRequest("echo alive"))
        assert again.stdout == b"alive\n"
    finally:
        await other.aclose()


async def test_the_shell_tool_tells_the_model_its_command_took_the_sandbox_down(
    docker_ready: None, user_workspace: Path
) -> None:
    from worker import ToolRegistry

    backend = make_backend()
    reg = ToolRegistry(backend=backend)
    try:
        res = await reg.execute("shell_execute", {"command": "kill -9 $PPID"}, user_workspace)
        assert not res.success and res.error is not None
        assert "killed or stopped" in res.error and "do not repeat" in res.error and "restarted" in res.error
        again = await reg.execute("shell_execute", {"command": "echo back"}, user_workspace)
        assert again.success and again.output == "back\n"
    finally:
        await reg.aclose()
        await backend.remove_all_started()
