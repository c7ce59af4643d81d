"""The record survives the death of the CLI's local worker and of ``serve`` (issue 36), on
the real engine, runc and gVisor: a command rewriting a thousand files is running when the
process is SIGKILLed; afterwards ``loom-worker log`` (or the restarted service) shows its
changes, marked interrupted, and ``undo --all`` gives the tree back byte for byte."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.docker.config import LABEL_WS
from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import require_runtime
from tests.servers import free_port
from tests.treehash import tree_diff, tree_state
from tests.workers import LOOM, cli, cli_env, remove_sandboxes_under, run_dir, statuses

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_ready")]

FILES = 1000
REWRITE = (
    f"python3 -c \"for i in range({FILES}): open('f%d.txt' % i, 'w').write('new %d ' % i * 20)\" "
    "&& touch .rewritten && sleep 60"
)


def _seed(root: Path) -> dict[str, tuple[str, int, str]]:
    os.chown(root, 1000, 1000)
    for i in range(FILES):
        p = root / f"f{i}.txt"
        p.write_text(f"old {i}\n")
        os.chown(p, 1000, 1000)
    return tree_state(root)


async def _wait_for(path: Path, proc: subprocess.Popen[Any], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.05)


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest) -> str:
    require_runtime(request.param)
    return str(request.param)


@pytest.fixture
def sandboxes_removed(workspace: Path) -> Iterator[None]:
    """The workspace's sandbox removed after the test: the CLI's local worker leaves it to
    its idle TTL, under an owner the suite's closing gc does not take."""
    yield
    remove_sandboxes_under(workspace)


@pytest.mark.usefixtures("sandboxes_removed")
async def test_the_local_worker_killed_under_a_command(tmp_path: Path, workspace: Path, runtime: str) -> None:
    before = _seed(workspace)
    with run_dir() as run:
        env = cli_env(run, tmp_path / "data", LOOM_IMAGE=SANDBOX_IMAGE, LOOM_RUNTIME=runtime)
        p = await asyncio.to_thread(cli, env, "exec", "-w", str(workspace), "--", "true")
        assert p.returncode == 0, p.stderr
        call = subprocess.Popen(  # noqa: ASYNC220
            [LOOM, "exec", "-w", str(workspace), "--call-id", "victim", "--", "sh", "-c", REWRITE],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            await _wait_for(workspace / ".rewritten", call)
            pids = [int(s["pid"]) for s in statuses(run).values()]
            assert pids, "no local worker answers"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            await asyncio.to_thread(call.communicate, timeout=120)
        finally:
            if call.poll() is None:
                call.kill()
        log = await asyncio.to_thread(cli, env, "log", "-w", str(workspace), "--call", "victim", "--json")
        assert log.returncode == 0, log.stderr
        entries = [json.loads(line) for line in log.stdout.splitlines()]
        everything = await asyncio.to_thread(cli, env, "log", "-w", str(workspace))
        assert {f"f{i}.txt" for i in range(FILES)} <= {e["path"] for e in entries}, (
            everything.stdout[-2000:],
            everything.stderr[-2000:],
            log.stderr[-2000:],
            sorted(p.name for p in (tmp_path / "data" / "workspaces").glob("*/*")),
        )
        assert all("interrupted" in (e["note"] or "") for e in entries)
        undo = await asyncio.to_thread(cli, env, "undo", "-w", str(workspace), "--all")
        assert undo.returncode == 0, undo.stderr[-3000:]
        (workspace / ".rewritten").unlink(missing_ok=True)  # made by the command after its changes were seen
        assert tree_diff(before, tree_state(workspace)) == []


def _request(base: str, token: str, method: str, path: str, body: Any = None, timeout: float = 300) -> Any:
    req = urllib.request.Request(
        base + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _serve(env: dict[str, str], port: int, token_file: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "serve", "--port", str(port), "--token-file", str(token_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _stop_service(server: subprocess.Popen[str], workspace: Path) -> None:
    """Stop ``serve`` (SIGTERM, then SIGKILL) and remove this test's sandbox only (other
    workers may share the engine)."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL_WS}={workspace}"], capture_output=True, text=True
    ).stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)


async def _up(base: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=1):  # noqa: ASYNC210
                return
        except OSError:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)


async def test_serve_killed_under_a_command(tmp_path: Path, runtime: str) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LOOM_")},
        "LOOM_DATA_DIR": str(tmp_path / "data"),
        "LOOM_WORKSPACE_ROOT": str(root),
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "LOOM_RUNTIME": runtime,
        "LOOM_STOP_SANDBOXES_ON_EXIT": "false",
    }
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    token_file = tmp_path / "token"
    server = _serve(env, port, token_file)
    try:
        await _up(base, server)
        token = token_file.read_text().strip()
        ws = (await asyncio.to_thread(_request, base, token, "POST", "/v1/workspaces", {"name": "crash"}))["id"]
        path = root / ws
        before = _seed(path)
        first = {"tool": "shell_execute", "arguments": {"command": "true"}}
        assert (await asyncio.to_thread(_request, base, token, "POST", f"/v1/workspaces/{ws}/execute", first))[
            "success"
        ]
        body = {"tool": "shell_execute", "arguments": {"command": REWRITE, "timeout": 120}, "call_id": "victim"}
        call = asyncio.ensure_future(
            asyncio.to_thread(_request, base, token, "POST", f"/v1/workspaces/{ws}/execute", body)
        )
        deadline = time.monotonic() + 180
        while not (path / ".rewritten").exists():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        os.killpg(server.pid, signal.SIGKILL)
        await asyncio.to_thread(server.communicate, timeout=60)
        with pytest.raises(OSError):
            await call
        server = _serve(env, port, token_file)
        await _up(base, server)
        entries: list[Any] = []
        deadline = time.monotonic() + 120
        while not entries:  # reconciled at the service's start, in the background
            got = await asyncio.to_thread(_request, base, token, "GET", f"/v1/workspaces/{ws}/changelog?call_id=victim")
            entries = list(got)
            if not entries:
                assert time.monotonic() < deadline, "the interrupted command was never recorded"
                await asyncio.sleep(0.5)
        assert {f"f{i}.txt" for i in range(FILES)} <= {e["path"] for e in entries}
        done = await asyncio.to_thread(_request, base, token, "POST", f"/v1/workspaces/{ws}/undo", {"all": True})
        assert done is not None
        (path / ".rewritten").unlink(missing_ok=True)
        assert tree_diff(before, tree_state(path)) == []
    finally:
        await asyncio.to_thread(_stop_service, server, root / "crash")


async def test_two_clis_and_a_service_on_one_workspace(tmp_path: Path) -> None:
    """Two CLIs (through their local worker) and ``serve``, a hundred calls each at once,
    on one workspace: every call recorded once, ``undo --all`` without ``--force``."""
    root = tmp_path / "ws"
    root.mkdir()
    data = tmp_path / "data"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LOOM_")},
        "LOOM_DATA_DIR": str(data),
        "LOOM_WORKSPACE_ROOT": str(root),
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "LOOM_STOP_SANDBOXES_ON_EXIT": "false",
    }
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = _serve(env, port, tmp_path / "token")
    n = 100
    try:
        await _up(base, server)
        token = (tmp_path / "token").read_text().strip()
        ws = (await asyncio.to_thread(_request, base, token, "POST", "/v1/workspaces", {"name": "shared"}))["id"]
        path = root / ws
        os.chown(path, 1000, 1000)
        (path / "shared.txt").write_text("start\n")
        os.chown(path / "shared.txt", 1000, 1000)
        before = tree_state(path)

        def calls(tag: str) -> list[tuple[str, dict[str, Any]]]:
            out: list[tuple[str, dict[str, Any]]] = []
            for i in range(n):
                # Writes and commands on the same files: one process's write during the
                # other's command is what got recorded twice.
                if i % 2:
                    target = "shared.txt" if i % 4 == 1 else f"{tag}-{i % 5}.txt"
                    out.append(("write_file", {"path": target, "content": f"{tag} {i}\n"}))
                else:
                    cmd = f"echo {tag}{i} >> shared.txt; sleep 0.05; echo {i} > {tag}.log; cat shared.txt > copy.txt"
                    out.append(("shell_execute", {"command": cmd}))
            return out

        def by_cli(tag: str, cli_env_: dict[str, str]) -> None:
            for i, (tool, args) in enumerate(calls(tag)):
                p = cli(cli_env_, "call", tool, "-w", str(path), "--args", json.dumps(args), "--call-id", f"{tag}-{i}")
                assert p.returncode == 0, (tag, i, p.stdout[-500:], p.stderr[-1000:])

        def by_http() -> None:
            for i, (tool, args) in enumerate(calls("h")):
                body = {"tool": tool, "arguments": args, "call_id": f"h-{i}"}
                r = _request(base, token, "POST", f"/v1/workspaces/{ws}/execute", body)
                assert r["success"], r

        with run_dir() as run:
            cenv = cli_env(run, data, LOOM_IMAGE=SANDBOX_IMAGE)
            await asyncio.gather(
                asyncio.to_thread(by_cli, "a", cenv), asyncio.to_thread(by_cli, "b", cenv), asyncio.to_thread(by_http)
            )
            log = await asyncio.to_thread(cli, cenv, "log", "-w", str(path), "--json")
            assert log.returncode == 0, log.stderr
            rows: dict[str, list[tuple[str, str]]] = {}
            for line in log.stdout.splitlines():
                e = json.loads(line)
                if e["call_id"]:
                    rows.setdefault(e["call_id"], []).append((e["path"], e["op"]))
            for call_id, entries in rows.items():
                assert len(entries) == len(set(entries)), (call_id, entries)  # recorded once
            expected = {f"{t}-{i}" for t in "abh" for i in range(n)}
            assert expected <= set(rows), sorted(expected - set(rows))[:10]
            undo = await asyncio.to_thread(cli, cenv, "undo", "-w", str(path), "--all")
            assert undo.returncode == 0, undo.stderr[-3000:]  # never needs --force
        assert tree_diff(before, tree_state(path)) == []
    finally:
        await asyncio.to_thread(_stop_service, server, root / "shared")
