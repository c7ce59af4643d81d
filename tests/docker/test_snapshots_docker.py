"""Snapshots, forks and restore on the real engine, under runc and gVisor (issue 29).

The project is a real one: ``tests/fixtures/tinycalc`` with a virtualenv made in the
sandbox (``python3 -m venv``: pip and setuptools), the project installed into it in
development mode (``setup.py develop``: no network), the interpreter's standard library
copied into its site-packages (the size of a real dependency set), bytecode compiled for
all of it and the test suite run once, so ``__pycache__`` exists: about 4,500 files. Tree
hashes (tests/treehash.py: paths, bytes, modes, link targets) are the proof.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker.conftest import own_registry
from tests.docker.fork_volumes import remove_fork_volumes
from tests.treehash import tree_diff, tree_hash, tree_state
from worker.changelog import Changelog
from worker.snapshots import SnapshotInUseError, Snapshots

pytestmark = pytest.mark.docker

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "tinycalc"
PREPARE = (
    "python3 -m venv .venv && .venv/bin/python setup.py -q develop >/dev/null 2>&1 "
    '&& cp -r "$(python3 -c \'import sysconfig; print(sysconfig.get_paths()["stdlib"])\')" '
    '"$(echo .venv/lib/python3*/site-packages)/stdlib_copy" '
    "&& .venv/bin/python -m compileall -q -j 2 .venv tinycalc tests >/dev/null "
    "&& .venv/bin/python -m unittest discover -s tests -q"
)


def _own(root: Path, uid: int = 1000) -> None:
    for p in [root, *root.rglob("*")]:
        os.lchown(p, uid, uid)


@pytest.fixture(params=["runc", "runsc"])
async def env(
    request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path
) -> AsyncIterator[tuple[Any, Snapshots]]:
    async with own_registry(tmp_path, request.param, durability="process") as reg:
        snaps = Snapshots(reg, tmp_path / "data")
        try:
            yield reg, snaps
        finally:
            snaps.close()
    await asyncio.to_thread(remove_fork_volumes, tmp_path)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    ws = tmp_path / "ws" / "proj"
    shutil.copytree(FIXTURE, ws)
    os.chown(ws.parent, 1000, 1000)
    _own(ws)
    return ws


async def sh(reg: Any, ws: Path, command: str, timeout: float = 300) -> str:
    r = await reg.execute("shell_execute", {"command": command, "timeout": timeout}, ws)
    assert r.success, (command, r.output[-3000:])
    return str(r.output)


async def stop_all(reg: Any, paths: list[Path]) -> None:
    for p in paths:
        await reg.stop(p)


async def test_a_prepared_project_forks_8_ways_in_parallel(env: tuple[Any, Snapshots], project: Path) -> None:
    reg, snaps = env
    await sh(reg, project, PREPARE, timeout=600)
    state = tree_state(project)
    assert len(state) > 3000, len(state)  # thousands of files, __pycache__ included
    assert any("__pycache__" in p for p in state)
    snap = await snaps.create(project, "prepared")
    assert tree_state(snaps.index.directory(snap.id) / "tree") == state
    forks = await snaps.fork(snap.id, 8)
    # On ext4 these are overlay forks: the host sees a fork's tree while its sandbox runs.
    await asyncio.gather(*(sh(reg, f, "true") for f in forks))
    assert all(tree_hash(f) == tree_hash(project) for f in forks)

    async def attempt(i: int, fork: Path) -> str:
        # A different edit in each, then the project's tests with the venv's interpreter.
        await sh(reg, fork, f"printf '\\n\\ndef attempt_{i}(a):\\n    return a + {i}\\n' >> tinycalc/ops.py")
        out = await sh(
            reg,
            fork,
            f".venv/bin/python -m unittest discover -s tests -q 2>&1 && .venv/bin/python -c "
            f"'import tinycalc.ops as o; print(o.attempt_{i}(1))'",
        )
        return out.strip().splitlines()[-1]

    try:
        results = await asyncio.gather(*(attempt(i, f) for i, f in enumerate(forks)))
        assert results == [str(1 + i) for i in range(8)]
        assert tree_state(project) == state  # the parent is untouched
        hashes = set()
        for i, fork in enumerate(forks):
            now = tree_state(fork)
            changed = {line.split(":")[0] for line in tree_diff(state, now)}
            # Only its own edit and the bytecode its test run rewrote for it.
            assert changed and all(p == "tinycalc/ops.py" or "__pycache__" in p for p in changed), changed
            ops = (fork / "tinycalc/ops.py").read_text()
            assert f"attempt_{i}(" in ops and all(f"attempt_{j}(" not in ops for j in range(8) if j != i)
            hashes.add(tree_hash(fork))
        assert len(hashes) == 8
    finally:
        await stop_all(reg, forks)


async def test_restore_after_a_session_then_undo_it(env: tuple[Any, Snapshots], project: Path) -> None:
    reg, snaps = env
    await sh(reg, project, "python3 -m compileall -q tinycalc tests && ln -s tinycalc/cli.py cli-link")
    snap = await snaps.create(project)
    tree = snaps.index.directory(snap.id) / "tree"
    edit = {"path": "tinycalc/ops.py", "old_str": "def add", "new_str": "def  add"}
    r = await reg.execute("edit_file", edit, project)
    assert r.success, r.output
    r = await reg.execute("write_file", {"path": "NOTES.md", "content": "notes\n"}, project)
    assert r.success, r.output
    await sh(
        reg,
        project,
        "mkdir -p build && cp -r tinycalc build/ && python3 -m compileall -q build && rm -r tests/__pycache__ "
        "&& rm README.md && chmod 700 tinycalc && ln -sfn README.md cli-link && mkdir -p .cache/x "
        "&& echo c > .cache/x/y && python3 -m unittest discover -s tests -q",
    )
    before = tree_state(project)
    done = await snaps.restore(project, snap.id)
    assert done.plan.failed == [] and done.call_id
    assert tree_hash(project) == tree_hash(tree), tree_diff(tree_state(tree), tree_state(project))
    ws = await reg.workspace(project)
    assert isinstance(ws.recorder, Changelog)
    undone = await ws.recorder.undo(ws.sandbox, call_id=done.call_id)
    assert not undone.failed, [s.model_dump() for s in undone.failed]
    assert tree_state(project) == before, tree_diff(before, tree_state(project))


async def test_fork_of_a_fork_and_deleting_a_used_snapshot(env: tuple[Any, Snapshots], project: Path) -> None:
    reg, snaps = env
    s1 = await snaps.create(project, "base")
    (f1,) = await snaps.fork(s1.id)
    await sh(reg, f1, "echo first > generation.txt")
    s2 = await snaps.create(f1, "child")
    (f2,) = await snaps.fork(s2.id)
    try:
        assert s2.parent == s1.id and (await snaps.get(s1.id)).children == [s2.id]
        assert (await sh(reg, f2, "cat generation.txt")).strip() == "first"
        await sh(reg, f2, "echo second > generation.txt")
        assert (f1 / "generation.txt").read_text() == "first\n" and not (project / "generation.txt").exists()
        with pytest.raises(SnapshotInUseError):
            await snaps.delete(s1.id)
        left = await snaps.delete(s1.id, force=True)
        assert left == [str(f1) if f1.is_symlink() else os.path.realpath(f1)]  # as users name it
        assert (await sh(reg, f1, "cat generation.txt")).strip() == "first"  # the fork lives on
        ws = await reg.workspace(f2)
        assert isinstance(ws.recorder, Changelog)
        assert (await ws.recorder.origin() or {}).get("snapshot") == s2.id
    finally:
        await stop_all(reg, [f1, f2])


WRITER = (
    'python3 -c "\n'
    "import os\n"
    "fds = [os.open('w/f%d' % i, os.O_RDWR | os.O_CREAT, 0o644) for i in range(8)]\n"
    "n = 0\n"
    "while True:\n"
    "    n += 1\n"
    "    b = bytes([n % 251]) * (1 << 20)\n"
    "    for fd in fds:\n"
    "        os.pwrite(fd, b, 0)\n"
    '"'
)


async def test_a_snapshot_while_a_process_writes_is_consistent(env: tuple[Any, Snapshots], project: Path) -> None:
    reg, snaps = env
    await sh(reg, project, "mkdir w")
    r = await reg.execute("shell_execute", {"command": WRITER, "background": True}, project)
    assert r.success and r.data and r.data.get("running"), r.output
    pid = r.data["process_id"]
    try:
        await asyncio.sleep(1.0)
        taken = [await snaps.create(project) for _ in range(4)]
        for snap in taken:
            tree = snaps.index.directory(snap.id) / "tree"
            for i in range(8):
                data = (tree / "w" / f"f{i}").read_bytes()
                # each 1 MiB pwrite is there whole or not at all: never two values mixed
                assert len(data) == 1 << 20 and data == data[:1] * len(data), (snap.id, i, set(data[::4096]))
        assert (await sh(reg, project, "echo alive")).strip() == "alive"  # resumed
    finally:
        await reg.execute("process_kill", {"process_id": pid}, project)


async def test_settings_egress_and_scratch_carry_over(env: tuple[Any, Snapshots], project: Path) -> None:
    reg, snaps = env
    await reg.configure_workspace(project, {"memory": "768m", "env": {"ATTEMPT_MODE": "eval"}, "egress": ["pypi"]})
    await sh(reg, project, 'mkdir -p /tmp/cache "$HOME/.config" && echo warm > /tmp/cache/state')
    await sh(reg, project, 'echo h > "$HOME/.config/rc"')
    snap = await snaps.create(project, with_scratch=True)
    assert snap.with_scratch and snap.settings["memory"] == "768m"
    forks = await snaps.fork(snap.id, 2)
    try:
        for f in forks:
            out = await sh(reg, f, 'cat /tmp/cache/state "$HOME/.config/rc"; echo "$ATTEMPT_MODE"; echo "$HTTPS_PROXY"')
            lines = out.strip().splitlines()
            assert lines[:3] == ["warm", "h", "eval"], lines
            assert lines[3].startswith("http://127.0.0.1:"), lines  # the egress proxy of its own gateway
            assert reg.egress_status(f)["policy"] == ["pypi"]
            status = await reg.backend.status(f)
            assert status["limits"]["memory_bytes"] == 768 << 20
    finally:
        await stop_all(reg, forks)
