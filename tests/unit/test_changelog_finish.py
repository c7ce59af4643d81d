"""Step 5 of a change (mark it applied, move the shell baseline) is held in memory and
applied by the next use of the store: inside the next change's commit, before any other
store call, or after FINISH_DELAY of quiet. What must hold: this process always sees its
own changes settled; another process that comes first settles them by hash with the same
effect (baseline included); a crash before it leaves them to recovery; and a shell command
right after an edit is never charged with the edit."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path

import pytest

from sandbox.base import ExecRequest
from worker.changelog import Changelog
from worker.changelog import recorder as recmod
from worker.workspace import Workspace


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def on_disk(cl: Changelog) -> dict[int, str]:
    """Entry states as another process reads them from the database file."""
    db = sqlite3.connect(cl._core.store.path)
    try:
        return dict(db.execute("SELECT id, state FROM entries ORDER BY id").fetchall())
    finally:
        db.close()


async def test_step5_rides_on_the_next_commit_and_flushes_after_quiet(cl, box, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recmod, "FINISH_DELAY", 0.2)
    await cl.write(box, "a.txt", b"1")
    first = max(on_disk(cl))
    assert on_disk(cl)[first] == "pending"  # held, not yet written
    await cl.write(box, "a.txt", b"2", expect_sha256=h(b"1"))
    states = on_disk(cl)
    second = max(states)
    assert states[first] == "applied"  # applied inside the second change's commit
    assert states[second] == "pending"
    await asyncio.sleep(0.5)  # quiet: applied on its own
    assert on_disk(cl)[second] == "applied"


async def test_every_store_call_sees_this_process_changes_settled(cl, box, monkeypatch) -> None:
    monkeypatch.setattr(recmod, "FINISH_DELAY", 60.0)  # never by the timer in this test
    await cl.write(box, "a.txt", b"1", call_id="c1")
    assert [e.state for e in await cl.log()] == ["applied"]
    await cl.write(box, "b.txt", b"x", call_id="c2")
    res = await cl.undo(box, call_id="c2")
    assert len(res.reverted) == 1
    assert {e.path: e.state for e in await cl.log()} == {"a.txt": "applied", "b.txt": "applied"}


async def test_close_applies_what_is_held(data_dir: Path, workspace: Path, box, monkeypatch) -> None:
    monkeypatch.setattr(recmod, "FINISH_DELAY", 60.0)
    c = Changelog.open(data_dir, workspace)
    await c.write(box, "a.txt", b"1")
    await c.aclose()
    assert set(on_disk(c).values()) == {"applied"}


async def test_shell_right_after_an_edit_is_not_charged_with_it(cl, box, workspace: Path, monkeypatch) -> None:
    monkeypatch.setattr(recmod, "FINISH_DELAY", 60.0)
    (workspace / "a.txt").write_text("a0")
    ws = Workspace(Path(cl.workspace), box, cl)
    await ws.run_shell(ExecRequest("true"))  # baseline
    await cl.write(box, "a.txt", b"edited", expect_sha256=h(b"a0"), call_id="edit")
    r, changed = await ws.run_shell(ExecRequest("echo new > b.txt"), call_id="sh")
    assert r.exit_code == 0 and changed == ["b.txt"]
    assert [e.path for e in await cl.log(call_id="sh")] == ["b.txt"]


async def test_another_process_settles_held_changes_with_the_baseline(
    data_dir: Path, workspace: Path, box, monkeypatch
) -> None:
    """A second changelog instance (another process) takes the workspace before the first
    applied its held step 5: its recovery settles the entry as applied *and* moves the
    shell baseline, so its next command is not charged with the first one's edit."""
    monkeypatch.setattr(recmod, "FINISH_DELAY", 60.0)
    (workspace / "a.txt").write_text("a0")
    one = Changelog.open(data_dir, workspace)
    two = Changelog.open(data_dir, workspace)
    try:
        await Workspace(Path(one.workspace), box, one).run_shell(ExecRequest("true"))  # baseline
        await one.write(box, "a.txt", b"edited", expect_sha256=h(b"a0"), call_id="edit")
        assert set(on_disk(one).values()) == {"pending"}
        assert [e.call_id for e in await two.recover(box)] == ["edit"]
        db = sqlite3.connect(two._core.store.path)
        try:
            row = db.execute("SELECT sha256, size FROM baseline WHERE path = 'a.txt'").fetchone()
        finally:
            db.close()
        assert row == (h(b"edited"), -1)  # the baseline follows, its stat to be refreshed
        _, changed = await Workspace(Path(two.workspace), box, two).run_shell(
            ExecRequest("echo n > n.txt"), call_id="sh"
        )
        assert changed == ["n.txt"]
        assert {e.call_id: e.state for e in await two.log()} == {"edit": "applied", "sh": "applied"}
        await one.aclose()  # its late step 5 finds the entry settled and changes nothing
        assert {e.call_id: e.state for e in await two.log()} == {"edit": "applied", "sh": "applied"}
    finally:
        if not one._core._closed:
            await one.aclose()
        await two.aclose()


async def test_a_crash_before_step5_leaves_it_to_recovery(data_dir: Path, workspace: Path, box, monkeypatch) -> None:
    monkeypatch.setattr(recmod, "FINISH_DELAY", 60.0)
    one = Changelog.open(data_dir, workspace)
    await one.write(box, "a.txt", b"1", call_id="w")
    one._core._finishes.clear()  # what a SIGKILL loses
    await one.aclose()
    assert set(on_disk(one).values()) == {"pending"}
    two = Changelog.open(data_dir, workspace)
    try:
        await two.recover(box)
        assert [(e.call_id, e.state) for e in await two.log()] == [("w", "applied")]
    finally:
        await two.aclose()
