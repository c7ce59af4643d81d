"""Crash safety of the changelog: SIGKILL a writer mid-operation, in a loop; two writers
at once; a full data disk. The writers are separate processes using the local backend."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox.local import LocalProcessBackend
from worker.changelog import Changelog, Entry

WRITER = textwrap.dedent(
    """
    import asyncio, os, random, sys
    from pathlib import Path
    from sandbox.local import LocalProcessBackend
    from worker.changelog import Changelog

    async def main():
        data, ws, tag = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
        count, files = int(sys.argv[4]), int(sys.argv[5])
        backend = LocalProcessBackend()
        box = await backend.get(ws)
        await box.info()
        if os.environ.get("FSIZE_LIMIT"):
            import resource, signal
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            lim = int(os.environ["FSIZE_LIMIT"])
            resource.setrlimit(resource.RLIMIT_FSIZE, (lim, lim))
        cl = Changelog.open(Path(data), ws, durability=os.environ.get("DURABILITY", "full"))
        edit = os.environ.get("EDIT") == "1"
        print("ready", flush=True)
        rnd = random.Random(tag)
        for i in range(count):
            name = f"f{rnd.randrange(files)}.txt"
            size = int(os.environ.get("WRITE_SIZE", "0")) or rnd.randrange(10, 200_000)
            body = (f"{tag}-{i}:".encode() * (size // 8 + 1))[:size]
            expect = None
            if edit:  # as edit_file does: read, then write conditionally on what was read
                try:
                    expect = (await box.read(name, max_bytes=1 << 20)).sha256
                except Exception:
                    expect = None
            try:
                await cl.write(box, name, body, tool="write_file", call_id=f"{tag}-{i}", expect_sha256=expect)
            except Exception as e:
                print("error", type(e).__name__, e, flush=True)
                sys.exit(3)
        await cl.aclose()
        await backend.aclose()
        print("done", flush=True)

    asyncio.run(main())
    """
)


def spawn(data: Path, ws: Path, tag: str, count: int, files: int, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(data), str(ws), tag, str(count), str(files)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # SIGKILL the whole group: the worker and its agent die together
        env={**os.environ, **env},
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


SETTLED: list[Entry] = []


async def check_consistent(data: Path, ws: Path, initial: dict[str, str] | None = None) -> list[Entry]:
    """Every file is wholly the content of its last applied entry; every applied entry's
    before-image is the previous applied entry's after-image (no entry lost or torn)."""
    backend = LocalProcessBackend()
    try:
        box = await backend.get(ws)
        async with Changelog.open(data, ws) as cl:
            SETTLED.extend(await cl.recover(box))
            entries = await cl.log()
    finally:
        await backend.aclose()
    assert all(e.state in ("applied", "failed") for e in entries)
    ids = [e.id for e in entries]
    assert ids == sorted(set(ids))
    last: dict[str, str | None] = dict(initial or {})
    for e in entries:
        if e.state != "applied":
            continue
        assert e.before_hash == last.get(e.path), f"entry {e.id} does not chain on the previous one"
        last[e.path] = e.after_hash
    for p in ws.iterdir():
        if p.name.startswith("."):
            assert ".loom-" in p.name  # an agent temp file the kill interrupted, never a torn file
            continue
        assert sha(p.read_bytes()) == last.get(p.name), f"{p.name} is not wholly its last recorded content"
    for name in last:
        assert (ws / name).exists()
    return entries


@pytest.mark.slow
@pytest.mark.parametrize(
    "env",
    [{}, {"EDIT": "1", "DURABILITY": "process"}],
    ids=["write-full", "edit-process"],
)
async def test_sigkill_writer_in_a_loop(tmp_path: Path, workspace: Path, env: dict[str, str]) -> None:
    data = tmp_path / "data"
    rnd = random.Random(1234)
    killed = 0
    SETTLED.clear()
    for cycle in range(25):
        proc = spawn(data, workspace, f"k{cycle}", 10_000, 4, **env)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        await asyncio.sleep(rnd.uniform(0.0, 0.15))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            killed += 1
        proc.wait()
        await check_consistent(data, workspace)
    assert killed >= 20
    assert SETTLED, "no kill landed between recording and writing; the test exercised nothing"
    entries = await check_consistent(data, workspace)
    assert len(entries) > 25


async def test_two_processes_lose_nothing(tmp_path: Path, workspace: Path) -> None:
    data = tmp_path / "data"
    procs = [spawn(data, workspace, tag, 40, 3, WRITE_SIZE="2000") for tag in ("A", "B")]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip().endswith("done"), err
    entries = await check_consistent(data, workspace)
    applied = [e for e in entries if e.state == "applied"]
    assert len(applied) == 80
    assert {e.call_id for e in applied} == {f"{t}-{i}" for t in "AB" for i in range(40)}


async def test_full_data_disk_fails_before_the_workspace_changes(tmp_path: Path, workspace: Path) -> None:
    data = tmp_path / "data"
    (workspace / "f0.txt").write_bytes(b"original")
    await Changelog.open(data, workspace).aclose()  # create the database before the limit applies
    proc = spawn(data, workspace, "full", 1, 1, FSIZE_LIMIT=str(200_000), WRITE_SIZE=str(3_000_000))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, (out, err)
    assert "ChangelogStorageError" in out
    assert (workspace / "f0.txt").read_bytes() == b"original"
    entries = await check_consistent(data, workspace, {"f0.txt": sha(b"original")})
    assert entries == []
