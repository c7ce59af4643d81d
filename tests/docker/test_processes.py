"""Background processes on the real engine, under runc and gVisor: they outlive the call,
their output is read in order with nothing lost or repeated, they take input, they are
killed with everything they started, they are bounded, they end with the sandbox, and what
they change is recorded under their id and undone."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import own_registry
from worker.registry import ToolRegistry, default_registry
from worker.settings import Settings

pytestmark = [pytest.mark.docker]


@pytest.fixture(params=["runc", "runsc"])
async def registry(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path) -> AsyncIterator[ToolRegistry]:
    async with own_registry(tmp_path, request.param) as reg:
        yield reg


def workspace(tmp_path: Path, name: str = "ws") -> Path:
    ws = tmp_path / name
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    return ws


async def call(registry: ToolRegistry, ws: Path, tool: str, **args: Any) -> Any:
    r = await registry.execute(tool, args, workspace=str(ws))
    assert (r.data or {}).get("error_kind") is None, r.output
    return r


async def read_until_done(registry: ToolRegistry, ws: Path, pid: str, **args: Any) -> tuple[str, str, Any]:
    """Read with process_output until it says done (each read answers as soon as there is
    anything new: under gVisor a fast printer is read in many small pieces), at most 180 s."""
    out, err, last = "", "", None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        last = await call(registry, ws, "process_output", process_id=pid, wait_ms=500, **args)
        out += last.data["stdout"]
        err += last.data["stderr"]
        if last.data["done"]:
            break
    return out, err, last


async def test_a_background_server_is_reached_by_later_calls(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    (ws / "index.html").write_text("hello from the sandbox\n")
    r = await call(
        registry, ws, "shell_execute", command="python3 -m http.server 8000 --bind 127.0.0.1", background=True
    )
    assert r.success and r.data["running"] and r.data["process_id"].startswith("proc-"), r.output
    pid = r.data["process_id"]
    fetch = "for i in $(seq 50); do curl -sf http://127.0.0.1:8000/index.html && exit 0; sleep 0.2; done; exit 1"
    r = await call(registry, ws, "shell_execute", command=fetch)
    assert r.success and "hello from the sandbox" in r.output, r.output
    seen = ""
    for _ in range(10):  # ("Serving HTTP on ..." may come first)
        r = await call(registry, ws, "process_output", process_id=pid, wait_ms=2000)
        seen += r.output
        if "GET /index.html" in seen:
            break
    assert "GET /index.html" in seen and r.data["running"], seen
    r = await call(registry, ws, "process_list")
    assert [p["process_id"] for p in r.data["processes"]] == [pid] and r.data["processes"][0]["running"]
    r = await call(registry, ws, "process_kill", process_id=pid)
    assert r.success and not r.data["running"] and r.data["outcome"] == "signal", r.output
    r = await call(registry, ws, "shell_execute", command="curl -s http://127.0.0.1:8000/ ; echo rc=$?")
    assert "rc=7" in r.output  # nothing listens any more


async def test_output_is_read_in_order_with_nothing_lost_or_repeated(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    script = "for i in $(seq 1 3000); do echo out-$i; echo err-$i >&2; [ $((i % 300)) = 0 ] && sleep 0.1; done; exit 3"
    r = await call(registry, ws, "shell_execute", command=script, background=True)
    pid = r.data["process_id"]
    out, err, last = await read_until_done(registry, ws, pid)
    out = r.data["stdout"] + out
    err = r.data["stderr"] + err
    assert out.split() == [f"out-{i}" for i in range(1, 3001)]
    assert err.split() == [f"err-{i}" for i in range(1, 3001)]
    assert last.data["exit_code"] == 3 and last.data["outcome"] == "exit" and not last.success
    # Read again from the start by cursor: the same bytes (the log is kept, not consumed).
    again = await call(registry, ws, "process_output", process_id=pid, since="0:0")
    assert again.data["stdout"].split()[:5] == ["out-1", "out-2", "out-3", "out-4", "out-5"]


async def test_stdin_reaches_an_interactive_program(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    prog = "import sys; sys.stdout.write('name? '); sys.stdout.flush(); n = input(); print('hello', n); print(input())"
    r = await call(registry, ws, "shell_execute", command=f'python3 -c "{prog}"', background=True)
    pid = r.data["process_id"]
    seen = r.data["stdout"]
    if "name?" not in seen:
        seen += (await call(registry, ws, "process_output", process_id=pid, wait_ms=3000)).data["stdout"]
    assert "name?" in seen
    assert (await call(registry, ws, "process_input", process_id=pid, text="bob\n")).success
    assert (await call(registry, ws, "process_input", process_id=pid, text="bye\n", eof=True)).success
    out, _err, last = await read_until_done(registry, ws, pid)
    assert "hello bob" in out and "bye" in out and last.data["exit_code"] == 0
    r = await registry.execute("process_input", {"process_id": pid, "text": "more\n"}, workspace=str(ws))
    assert not r.success and "no longer reads" in r.output


async def test_yield_ms_returns_early_and_the_command_goes_on(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    r = await call(registry, ws, "shell_execute", command="echo first; sleep 2; echo second", yield_ms=500)
    assert r.success and r.data["running"] and "first" in r.output and "second" not in r.output, r.output
    pid = r.data["process_id"]
    out, _err, last = await read_until_done(registry, ws, pid)
    assert out.strip() == "second" and last.data["exit_code"] == 0 and last.success
    # A command that ends within yield_ms is an ordinary result.
    r = await call(registry, ws, "shell_execute", command="echo quick; exit 4", yield_ms=5000)
    assert not r.success and not r.data["running"] and r.data["exit_code"] == 4 and "quick" in r.output


TREE = (
    "setsid sleep 1001 & (sleep 1002 &) ; nohup sleep 1003 >/dev/null 2>&1 & "
    "python3 -c 'import os,time\nif os.fork()==0:\n os.setsid()\n if os.fork()==0: time.sleep(1005)\n' ; sleep 1004"
)
COUNT = "ps -eo args | grep -c '^sleep 100[0-9]\\|[t]ime.sleep(1005)' || true"  # ([t]: not grep itself)


async def test_kill_removes_the_whole_tree(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    r = await call(registry, ws, "shell_execute", command=TREE, background=True)
    pid = r.data["process_id"]
    await asyncio.sleep(1.0)
    before = await call(registry, ws, "shell_execute", command=COUNT)
    assert int(before.output.split()[-1]) >= 4, before.output
    r = await call(registry, ws, "process_kill", process_id=pid)
    assert r.success and not r.data["running"], r.output
    after = await call(registry, ws, "shell_execute", command=COUNT)
    assert int(after.output.split()[-1]) == 0, after.output
    r = await registry.execute("process_kill", {"process_id": pid}, workspace=str(ws))
    assert r.success  # killing an ended one says how it ended


async def test_limits_a_ninth_process_and_an_output_flood(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    ids = []
    for _ in range(8):
        r = await call(registry, ws, "shell_execute", command="sleep 300", background=True)
        assert r.success, r.output
        ids.append(r.data["process_id"])
    r = await registry.execute("shell_execute", {"command": "sleep 1", "background": True}, workspace=str(ws))
    assert not r.success and "at most 8" in r.output, r.output
    for pid in ids[:7]:
        await call(registry, ws, "process_kill", process_id=pid)
    r = await call(registry, ws, "shell_execute", command="yes loom-flood", background=True)
    flood = r.data["process_id"]
    await asyncio.sleep(3)
    r = await call(registry, ws, "process_output", process_id=flood)
    if not r.data["dropped"][0]:  # the rest of the kept head first, then the gap
        r = await call(registry, ws, "process_output", process_id=flood)
    assert r.data["dropped"][0] > 0 and "bytes dropped" in r.output  # head and tail kept, the middle counted
    assert len(r.data["stdout"]) <= 2 << 20
    rss = await call(
        registry,
        ws,
        "shell_execute",
        command=f"ps -o rss= -p $(ps -o ppid= -p {r.data['pid']})",
    )
    assert int(rss.output.split()[0]) < 120_000, rss.output  # KiB: the supervisor stays small
    await call(registry, ws, "process_kill", process_id=flood)


async def test_changes_are_recorded_under_the_process_id_and_undone(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    (ws / "keep.txt").write_text("kept\n")
    r = await call(
        registry, ws, "shell_execute", command="sleep 0.5; echo made > bg.txt; mkdir -p out; echo y > out/f", yield_ms=0
    )
    pid = r.data["process_id"]
    await call(registry, ws, "shell_execute", command="echo fg > fg.txt")  # a foreground call meanwhile
    _out, _err, last = await read_until_done(registry, ws, pid)
    await asyncio.sleep(0.1)
    opened = registry.pool.opened()[ws.resolve()]
    log = await opened.recorder.log(call_id=pid)  # type: ignore[attr-defined]
    changed = {e.path for e in log}
    assert {"bg.txt", "out/f"} <= changed | set(last.files_changed), (changed, last.files_changed)
    assert "fg.txt" not in changed
    undone = await opened.recorder.undo(opened.sandbox, call_id=pid)  # type: ignore[attr-defined]
    assert undone is not None
    assert not (ws / "bg.txt").exists() and not (ws / "out").exists() and (ws / "fg.txt").exists()
    assert (ws / "keep.txt").read_text() == "kept\n"


async def test_bad_ids_and_another_workspaces_ids_are_refused(registry: ToolRegistry, tmp_path: Path) -> None:
    a, b = workspace(tmp_path, "a"), workspace(tmp_path, "b")
    r = await call(registry, a, "shell_execute", command="sleep 30", background=True)
    pid = r.data["process_id"]
    for ws, bad in ((a, "proc-000000000000"), (b, pid)):
        r = await registry.execute("process_output", {"process_id": bad}, workspace=str(ws))
        assert not r.success and f"No process {bad} in this workspace" in r.output, r.output
    r = await registry.execute("process_kill", {"process_id": "../../x"}, workspace=str(a))
    assert not r.success and "process_id" in r.output
    r = await registry.execute("process_output", {"process_id": pid, "since": "12"}, workspace=str(a))
    assert not r.success and "cursor" in r.output


async def test_stopping_the_sandbox_or_losing_its_agent_ends_them(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    await call(registry, ws, "shell_execute", command="sleep 300", background=True)
    await registry.stop(ws)
    r = await call(registry, ws, "process_list")
    assert r.data["processes"] == []
    await call(registry, ws, "shell_execute", command="sleep 300", background=True)
    r = await registry.execute("shell_execute", {"command": "kill -9 $PPID; sleep 5"}, workspace=str(ws))
    assert not r.success  # the agent was lost: the sandbox was reset
    r = await call(registry, ws, "process_list")
    assert r.data["processes"] == []


@pytest.mark.slow
async def test_a_running_process_keeps_the_sandbox_from_idling_until_its_timeout(
    docker_ready: None, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path / "data", image=SANDBOX_IMAGE, idle_ttl=10, catalog=False)
    ws = workspace(tmp_path)
    client = docker.from_env()
    try:
        async with default_registry(settings) as reg:
            r = await reg.execute(
                "shell_execute", {"command": "sleep 1000", "background": True, "timeout": 16}, workspace=str(ws)
            )
            assert r.success, r.output
            t0 = time.monotonic()

            def running() -> bool:
                found = client.containers.list(filters={"label": f"dev.loom.workspace={ws.resolve()}"})
                return bool(found)

            while time.monotonic() - t0 < 13:  # past the idle TTL: kept alive by the process
                assert running()
                await asyncio.sleep(1)
            while running() and time.monotonic() - t0 < 60:  # noqa: ASYNC110 (polling the engine)
                await asyncio.sleep(1)  # the process timed out: then the sandbox is idle
            assert not running()
            await reg.stop(ws)
    finally:
        client.close()
