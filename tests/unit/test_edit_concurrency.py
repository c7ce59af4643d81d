"""Concurrent mutations of one file (issue 24, item 4), on ``LocalProcessBackend`` with the
real changelog: edits sent at once take turns (per workspace, per real path) and all
succeed; a change from outside between an edit's read and its write is still a conflict.
The same on the real engine: tests/docker/test_edit_concurrency_docker.py."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import ExecRequest
from worker.changelog import Changelog
from worker.pathlocks import PathLocks, resolve
from worker.registry import ToolRegistry

N = 50
ORIGINAL = "".join(f"line {i:02d}: old\n" for i in range(N))
EXPECTED = "".join(f"line {i:02d}: new {i}\n" for i in range(N))


def edit(i: int) -> dict[str, Any]:
    return {"path": "a.txt", "old_str": f"line {i:02d}: old", "new_str": f"line {i:02d}: new {i}"}


@pytest.fixture
async def recorded(local_backend: Any, tmp_path: Path) -> AsyncIterator[tuple[ToolRegistry, list[Changelog]]]:
    logs: list[Changelog] = []

    def factory(root: Path) -> Changelog:
        logs.append(Changelog.open(tmp_path / "data", root))
        return logs[-1]

    reg = ToolRegistry(backend=local_backend, recorder_factory=factory)
    yield reg, logs
    await reg.aclose()
    for cl in logs:
        await cl.aclose()


@pytest.mark.parametrize("remembered", [True, False])
async def test_fifty_concurrent_edits_of_one_file_all_succeed(
    recorded: tuple[ToolRegistry, list[Changelog]], workspace: Path, remembered: bool
) -> None:
    reg, logs = recorded
    (workspace / "a.txt").write_text(ORIGINAL)
    if remembered:  # the first edit starts from what read_file saw, not from a read
        assert (await reg.execute("read_file", {"path": "a.txt"}, workspace)).success
    results = await asyncio.gather(*(reg.execute("edit_file", edit(i), workspace) for i in range(N)))
    assert [r.error for r in results if not r.success] == []
    assert (workspace / "a.txt").read_text() == EXPECTED
    entries = await logs[0].log()
    assert len(entries) == N and {e.tool for e in entries} == {"edit_file"}
    ws = await reg.workspace(workspace)
    await logs[0].undo(ws.sandbox, all=True)
    assert (workspace / "a.txt").read_text() == ORIGINAL


async def test_edits_through_a_symlink_and_write_file_take_turns(
    recorded: tuple[ToolRegistry, list[Changelog]], workspace: Path
) -> None:
    """The same file by two names (a link inside the workspace) is one path; a write_file
    between edits is applied in its turn, and the edits after it edit what it wrote."""
    reg, logs = recorded
    (workspace / "real").mkdir()
    (workspace / "real" / "a.txt").write_text(ORIGINAL)
    os.symlink("real", workspace / "alias")
    os.symlink("real/a.txt", workspace / "link.txt")  # (absolute /workspace/ links: the Docker tier)
    names = ["real/a.txt", "alias/a.txt", "link.txt"]
    calls = [reg.execute("edit_file", {**edit(i), "path": names[i % 3]}, workspace) for i in range(N)]
    results = await asyncio.gather(*calls)
    assert [r.error for r in results if not r.success] == []
    assert (workspace / "real" / "a.txt").read_text() == EXPECTED
    # write_file in the middle of a burst: edits before it are overwritten, after it apply.
    first = [reg.execute("edit_file", {**edit(i), "path": "alias/a.txt"}, workspace) for i in range(3)]
    write = reg.execute("write_file", {"path": "real/a.txt", "content": "x = 0\n"}, workspace)
    after = [
        reg.execute("edit_file", {"path": "link.txt", "old_str": f"x = {i}", "new_str": f"x = {i + 1}"}, workspace)
        for i in range(5)
    ]
    results = await asyncio.gather(*first, write, *after)
    assert [r.success for r in results] == [False] * 3 + [True] * 6  # 'old' is gone: already edited above
    assert (workspace / "real" / "a.txt").read_text() == "x = 5\n"
    assert len(await logs[0].log()) == N + 6


async def test_a_change_from_outside_between_read_and_write_is_a_conflict(
    recorded: tuple[ToolRegistry, list[Changelog]], workspace: Path
) -> None:
    """A shell command run in the sandbox between an edit's read and its write (here: right
    after the edit's read returns) is a change the edit did not see: it is refused, and the
    command's change is kept. Between two edits, the second edits what the command left."""
    reg, logs = recorded
    (workspace / "a.txt").write_text(ORIGINAL)
    ws = await reg.workspace(workspace)
    real_read = ws.sandbox.read
    interfere = True

    async def read_then_change(path: str, **kw: Any) -> Any:
        nonlocal interfere
        out = await real_read(path, **kw)
        if interfere:
            interfere = False
            r = await ws.sandbox.exec(ExecRequest("echo 'from outside' >> a.txt", timeout=10))
            assert r.exit_code == 0
        return out

    ws.sandbox.read = read_then_change  # type: ignore[method-assign]
    r = await reg.execute("edit_file", edit(0), workspace)
    assert not r.success and r.error is not None
    assert "Conflict: a.txt changed since it was read" in r.error and "read it again" in r.error, r.error
    assert (workspace / "a.txt").read_text() == ORIGINAL + "from outside\n"
    # The next edit starts from the file as it is now (the memory of it was dropped).
    r = await reg.execute("edit_file", edit(1), workspace)
    assert r.success, r.error
    assert (workspace / "a.txt").read_text() == (ORIGINAL + "from outside\n").replace("line 01: old", "line 01: new 1")
    # Between two edits: a command through the tool changes the file; the edit after it
    # edits what the command left (its memory was dropped), nothing is lost.
    r = await reg.execute("shell_execute", {"command": "echo 'by a command' >> a.txt"}, workspace)
    assert r.success and r.files_changed == ["a.txt"]
    r = await reg.execute("edit_file", edit(2), workspace)
    assert r.success, r.error
    assert (workspace / "a.txt").read_text().endswith("from outside\nby a command\n")
    assert "line 02: new 2" in (workspace / "a.txt").read_text()
    # The refused edit recorded nothing; the two others and the command did.
    assert [e.tool for e in await logs[0].log()] == ["edit_file", "shell_execute", "edit_file"]


# -- PathLocks ----------------------------------------------------------------------------


async def _order(locks: PathLocks, paths: list[str], hold: float = 0.02) -> list[tuple[str, str]]:
    """Start a claim per path at once; the (event, path) sequence of entering and leaving."""
    events: list[tuple[str, str]] = []

    async def one(p: str) -> None:
        async with locks.hold(p):
            events.append(("in", p))
            await asyncio.sleep(hold)
            events.append(("out", p))

    await asyncio.gather(*(one(p) for p in paths))
    return events


async def test_claims_of_one_path_take_turns_in_arrival_order(tmp_path: Path) -> None:
    locks = PathLocks(tmp_path)
    events = await _order(locks, ["a.txt"] * 5)
    assert events == [(e, "a.txt") for _ in range(5) for e in ("in", "out")]
    assert locks.held() == []


async def test_unrelated_paths_do_not_wait_and_a_directory_waits_for_its_files(tmp_path: Path) -> None:
    locks = PathLocks(tmp_path)
    events = await _order(locks, ["a.txt", "b.txt", "d/x.txt"])
    assert [e for e, _ in events[:3]] == ["in", "in", "in"]  # all at once
    events = await _order(locks, ["d/x.txt", "d", "d/y.txt", "e.txt"])
    # d waits for d/x.txt, d/y.txt (after d) waits for d; e.txt runs at once.
    assert events[:2] == [("in", "d/x.txt"), ("in", "e.txt")]
    assert events.index(("in", "d")) > events.index(("out", "d/x.txt"))
    assert events.index(("in", "d/y.txt")) > events.index(("out", "d"))
    events = await _order(locks, ["d/x.txt", ".", "z.txt"])  # the root is above everything
    assert events.index(("in", ".")) > events.index(("out", "d/x.txt"))
    assert events.index(("in", "z.txt")) > events.index(("out", "."))


async def test_a_cancelled_waiter_does_not_block_those_after_it(tmp_path: Path) -> None:
    locks = PathLocks(tmp_path)
    release = asyncio.Event()
    entered: list[int] = []

    async def one(i: int) -> None:
        async with locks.hold("a.txt"):
            entered.append(i)
            if i == 0:
                await release.wait()

    tasks = [asyncio.create_task(one(i)) for i in range(3)]
    await asyncio.sleep(0.01)
    tasks[1].cancel()
    release.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert entered == [0, 2] and locks.held() == []


def test_resolve_follows_links_inside_the_workspace_as_the_agent_does(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "real" / "sub").mkdir(parents=True)
    (root / "real" / "f.txt").write_text("x")
    os.symlink("real", root / "alias")
    os.symlink("../f.txt", root / "real" / "sub" / "up.txt")
    os.symlink("/workspace/real", root / "abs")
    os.symlink("/etc", root / "out")
    os.symlink("../../x", root / "real" / "escape")
    os.symlink("loop", root / "loop")
    r = str(root)
    assert resolve(r, "alias/f.txt") == "real/f.txt"
    assert resolve(r, "alias/sub/up.txt") == "real/f.txt"
    assert resolve(r, "abs/f.txt") == "real/f.txt"
    assert resolve(r, "alias/missing/new.txt") == "real/missing/new.txt"
    assert resolve(r, "out/passwd") == "out/passwd"  # leaves the workspace: as given
    assert resolve(r, "real/escape") == "real/escape"
    assert resolve(r, "loop") == "loop"
    assert resolve(r, ".") == "."


async def test_no_two_conflicting_claims_ever_run_together(tmp_path: Path) -> None:
    """Random claims on related paths, some cancelled while waiting or running: at no time
    are two conflicting claims inside, and every claim not cancelled gets in."""
    import random

    rnd = random.Random(24)
    locks = PathLocks(tmp_path)
    paths = [".", "d", "d/a.txt", "d/b.txt", "d/e", "d/e/f.txt", "g.txt"]
    inside: list[str] = []
    entered = 0

    def conflict(a: str, b: str) -> bool:
        return a == b or "." in (a, b) or a.startswith(b + "/") or b.startswith(a + "/")

    async def one(p: str) -> None:
        nonlocal entered
        async with locks.hold(p):
            assert not [q for q in inside if conflict(p, q)], (p, inside)
            inside.append(p)
            entered += 1
            try:
                await asyncio.sleep(rnd.random() / 1000)
            finally:
                inside.remove(p)

    tasks = []
    for _ in range(300):
        tasks.append(asyncio.create_task(one(rnd.choice(paths))))
        if rnd.random() < 0.3:
            await asyncio.sleep(0)
    for t in rnd.sample(tasks, 40):
        t.cancel()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    assert not [r for r in results if not isinstance(r, asyncio.CancelledError | type(None))]
    assert entered >= 300 - 40 and locks.held() == [] and inside == []
