"""The record under a damaged file, a full disk and two writers (issue 36), on the real
engine: a damaged changelog is one clear error on every surface, never a fresh start; a
data directory that fills during a session loses nothing; two worker processes on one
workspace record each call once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import own_registry
from tests.treehash import tree_diff, tree_state
from worker.changelog import Changelog
from worker.changelog.errors import ChangelogDamagedError
from worker.changelog.recorder import workspace_dir

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_ready")]
LOOM = str(Path(sys.executable).with_name("loom-worker"))


def _damage(db: Path, how: str) -> None:
    if how == "zero-length":
        db.write_bytes(b"")
    elif how == "truncated":
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 2])
    else:  # garbled: the header and the first pages overwritten
        with open(db, "r+b") as f:
            f.write(os.urandom(8192))
    for side in ("-wal", "-shm"):
        Path(str(db) + side).unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["zero-length", "truncated", "garbled"])
async def test_a_damaged_changelog_stops_every_surface_with_one_message(
    tmp_path: Path, workspace: Path, how: str
) -> None:
    os.chown(workspace, 1000, 1000)
    data = tmp_path / "data"
    async with own_registry(tmp_path) as reg:
        for i in range(30):  # enough history that half the file is real pages
            r = await reg.execute(
                "write_file", {"path": f"f{i}.txt", "content": "x" * 5000 + str(i)}, workspace=str(workspace)
            )
            assert r.success, r.output
        assert (await reg.execute("shell_execute", {"command": "echo hi > g.txt"}, workspace=str(workspace))).success
    db = workspace_dir(data, workspace) / "changelog.sqlite3"
    _damage(db, how)
    with pytest.raises(ChangelogDamagedError) as caught:
        Changelog.open(data, workspace)
    assert str(db) in str(caught.value)
    # The CLI: exit 1, the message, no traceback, for every command on the workspace.
    env = {**os.environ, "LOOM_DATA_DIR": str(data), "LOOM_IMAGE": SANDBOX_IMAGE, "XDG_RUNTIME_DIR": str(tmp_path)}
    for argv in (["log"], ["undo", "--all", "--dry-run"], ["diff"]):
        p = await asyncio.to_thread(
            subprocess.run, [LOOM, *argv, "--workspace", str(workspace)], capture_output=True, text=True, env=env
        )
        assert p.returncode == 1, (argv, p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and "damaged" in p.stderr and str(db) in p.stderr, (argv, p.stderr)
    # The registry (HTTP, MCP and the local worker answer with its results): infrastructure, naming the file.
    async with own_registry(tmp_path) as reg:
        r = await reg.execute("write_file", {"path": "new.txt", "content": "x"}, workspace=str(workspace))
        assert not r.success and (r.data or {}).get("error_kind") == "infrastructure"
        assert "damaged" in r.output and str(db) in r.output, r.output
    assert not (workspace / "new.txt").exists()
    # doctor names it; repair keeps what is readable and says what was lost; then the
    # workspace works again, its history (what could be read) still undoable.
    from worker.changelog.repair import survey

    assert [str(d) for d, what in survey(data) if what.startswith("damaged")] == [str(db)]
    p = await asyncio.to_thread(
        subprocess.run, [LOOM, "repair", "--workspace", str(workspace)], capture_output=True, text=True, env=env
    )
    assert p.returncode == 0 and "repaired" in p.stdout and "lost" in p.stdout, (p.stdout, p.stderr)
    assert list(db.parent.glob("changelog.sqlite3.damaged-*")), "the damaged file is kept"
    p = await asyncio.to_thread(
        subprocess.run, [LOOM, "log", "--workspace", str(workspace)], capture_output=True, text=True, env=env
    )
    assert p.returncode == 0, p.stderr
    async with own_registry(tmp_path) as reg:
        r = await reg.execute("write_file", {"path": "new.txt", "content": "x"}, workspace=str(workspace))
        assert r.success, r.output


async def test_a_full_data_disk_during_a_session_loses_nothing(tmp_path: Path, workspace: Path) -> None:
    """The data directory on a small tmpfs that fills during a session: a command that ran
    says so (never "nothing was changed"); a new one is refused by the reserve; once space
    is freed the command's changes are recorded and undo restores the original tree."""
    os.chown(workspace, 1000, 1000)
    for i in range(50):
        (workspace / f"f{i}.txt").write_text(f"old {i}\n")
    for f in workspace.iterdir():
        os.chown(f, 1000, 1000)
    before = tree_state(workspace)
    data = tmp_path / "data"
    data.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(data)], check=True)  # noqa: ASYNC221
    try:
        ws = str(workspace)
        # A reserve larger than the disk: nothing starts, as a limit, nothing changed.
        async with own_registry(tmp_path, changelog_reserve_bytes=1 << 30) as reg:
            r = await reg.execute("write_file", {"path": "h.txt", "content": "x"}, workspace=ws)
            assert not r.success and (r.data or {}).get("error_kind") == "limit", r
            r = await reg.execute("shell_execute", {"command": "touch h.txt"}, workspace=ws)
            assert not r.success and (r.data or {}).get("error_kind") == "limit", r
            assert not (workspace / "h.txt").exists()
        async with own_registry(tmp_path, changelog_reserve_bytes=1 << 20) as reg:
            assert (await reg.execute("shell_execute", {"command": "true"}, workspace=ws)).success
            # 60 MiB of new, incompressible content, whose record cannot fit in what is left.
            make = "python3 -c \"import os\nfor i in range(50): open('f%d.txt' % i, 'wb').write(os.urandom(1200000))\""
            r = await reg.execute("shell_execute", {"command": make}, workspace=ws, call_id="filler")
            assert not r.success
            assert (r.data or {}).get("error_kind") == "infrastructure", r
            assert "nothing was changed" not in r.output and "the command ran (exit code 0)" in r.output, r.output
            subprocess.run(["mount", "-o", "remount,size=1g", str(data)], check=True)  # noqa: ASYNC221
            assert (await reg.execute("shell_execute", {"command": "true"}, workspace=ws)).success
            box = (await reg.pool.workspace(ws)).sandbox
            async with Changelog.open(data, workspace) as cl:
                filler = [e for e in await cl.log() if e.call_id == "filler"]
                assert len(filler) == 50 and all("interrupted" in (e.note or "") for e in filler), filler[:2]
                assert not (await cl.undo(box, all=True)).failed
        assert tree_diff(before, tree_state(workspace)) == []
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)  # noqa: ASYNC221


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from worker.registry import default_registry
    from worker.settings import Settings

    async def main():
        data, ws, image, tag, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
        s = Settings(data_dir=Path(data), image=image, catalog=False)
        async with default_registry(s) as reg:
            for i in range(n):
                name = f"{tag}-{i % 7}.txt"
                if i % 3 == 0:
                    cmd = f"echo {tag}{i} >> {name}; echo {i} > shared.txt"
                    r = await reg.execute("shell_execute", {"command": cmd}, workspace=ws, call_id=f"{tag}-{i}")
                elif i % 3 == 1:
                    r = await reg.execute("write_file", {"path": name, "content": f"{tag} {i}\\n"}, workspace=ws,
                                          call_id=f"{tag}-{i}")
                else:
                    r = await reg.execute("write_file", {"path": "shared.txt", "content": f"{tag} {i}\\n"},
                                          workspace=ws, call_id=f"{tag}-{i}")
                assert r.success, r.output
        print("done", flush=True)

    asyncio.run(main())
    """
)


async def test_two_workers_on_one_workspace_record_each_call_once(tmp_path: Path, workspace: Path) -> None:
    os.chown(workspace, 1000, 1000)
    (workspace / "shared.txt").write_text("start\n")
    os.chown(workspace / "shared.txt", 1000, 1000)
    before = tree_state(workspace)
    data = tmp_path / "data"
    n = 120
    procs = [
        subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-c", WRITER, str(data), str(workspace), SANDBOX_IMAGE, tag, str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for tag in ("a", "b")
    ]
    try:
        for p in procs:
            out, err = await asyncio.to_thread(p.communicate, timeout=600)
            assert p.returncode == 0 and "done" in out, (out, err[-3000:])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    async with own_registry(tmp_path) as reg:
        box = (await reg.pool.workspace(str(workspace))).sandbox
        async with Changelog.open(data, workspace) as cl:
            entries = await cl.log()
            calls: dict[str, list[tuple[str, str]]] = {}
            for e in entries:
                if e.call_id:
                    calls.setdefault(e.call_id, []).append((e.path, e.op))
            for call, rows in calls.items():
                assert len(rows) == len(set(rows)), (call, rows)  # nothing recorded twice
            writes = {f"{t}-{i}" for t in "ab" for i in range(n) if i % 3}
            assert writes <= set(calls), sorted(writes - set(calls))[:10]
            result = await cl.undo(box, all=True)  # never needs force
            assert not result.failed
    assert tree_diff(before, tree_state(workspace)) == [], tree_diff(before, tree_state(workspace))[:10]


async def test_serve_exits_0_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "LOOM_DATA_DIR": str(tmp_path / "data"), "LOOM_WORKSPACE_ROOT": str(tmp_path / "ws")}
    (tmp_path / "ws").mkdir()
    for sig in (signal.SIGTERM, signal.SIGINT):
        port = _free_port()
        p = subprocess.Popen(  # noqa: ASYNC220
            [LOOM, "serve", "--port", str(port), "--token-file", str(tmp_path / "token")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not _answers(port):
                assert p.poll() is None, p.communicate()
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            p.send_signal(sig)
            _out, err = await asyncio.to_thread(p.communicate, timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, (sig, p.returncode, err[-2000:])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return bool(json.loads(r.read()) is not None)
    except Exception:
        return False
