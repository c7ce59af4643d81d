"""Shell-command coverage on the local backend: baseline, change scan, limits, symlinks."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.base import ExecRequest, Sandbox
from sandbox.errors import PathEscapeError
from worker.changelog import Changelog, Limits, UndoRefusedError
from worker.workspace import Workspace


@pytest.fixture
async def box(local_backend, workspace: Path) -> Sandbox:
    return await local_backend.get(workspace)


@pytest.fixture
async def cl(tmp_path: Path, workspace: Path) -> AsyncIterator[Changelog]:
    c = Changelog.open(tmp_path / "data", workspace, limits=Limits(max_file_bytes=1000))
    yield c
    await c.aclose()


async def shell(cl: Changelog, box: Sandbox, command: str, **kw: str) -> list[str]:
    """The production path: the scans travel with the command where the agent watches."""
    r, changed = await Workspace(Path(cl.workspace), box, cl).run_shell(ExecRequest(command), **kw)
    assert r.exit_code == 0, r.stderr
    return changed


async def shell_separately(cl: Changelog, box: Sandbox, command: str, **kw: str) -> list[str]:
    """The other path (custom tools): a scan before, the command, a scan after."""
    token = await cl.before_shell(box)
    r = await box.exec(ExecRequest(command))
    assert r.exit_code == 0, r.stderr
    return await cl.after_shell(box, token, command=command, **kw)


async def test_outside_change_between_commands_is_not_the_commands(cl, box, workspace: Path) -> None:
    """The agent's pre-command scan finds an edit made on the host since the last command:
    the command is not run until that edit is in the baseline (ScanFirst), so the entry
    for the command's own change has the right before-image and the host edit is not
    attributed to it."""
    (workspace / "a.txt").write_text("a0")
    assert await shell(cl, box, "echo a1 > a.txt", call_id="c1") == ["a.txt"]
    (workspace / "a.txt").write_text("host edit")  # not through the worker
    (workspace / "h.txt").write_text("host file")
    assert await shell(cl, box, "echo a2 > a.txt && echo c > c.txt", call_id="c2") == ["a.txt", "c.txt"]
    entries = await cl.log(call_id="c2")
    assert sorted(e.path for e in entries) == ["a.txt", "c.txt"]
    await cl.undo(box, call_id="c2")
    assert (workspace / "a.txt").read_text() == "host edit"  # the before-image of c2, not c1's
    assert not (workspace / "c.txt").exists() and (workspace / "h.txt").read_text() == "host file"


async def test_undone_deletion_gets_its_permissions_back(cl, box, workspace: Path) -> None:
    (workspace / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (workspace / "run.sh").chmod(0o755)
    (workspace / "secret.txt").write_text("s")
    (workspace / "secret.txt").chmod(0o600)
    await shell(cl, box, "true")
    assert sorted(await shell(cl, box, "rm run.sh secret.txt", call_id="rm")) == ["run.sh", "secret.txt"]
    await cl.undo(box, call_id="rm")
    assert (workspace / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (workspace / "secret.txt").stat().st_mode & 0o777 == 0o600
    assert (workspace / "run.sh").read_text() == "#!/bin/sh\necho hi\n"


async def test_separate_scans_record_the_same(cl, box, workspace: Path) -> None:
    (workspace / "x").write_text("1")
    assert await shell_separately(cl, box, "echo 2 > x && echo n > y", call_id="s") == ["x", "y"]
    assert await shell(cl, box, "rm y", call_id="p") == ["y"]
    assert await shell_separately(cl, box, "true") == []
    await cl.undo(box, all=True)
    assert (workspace / "x").read_text() == "1" and not (workspace / "y").exists()


async def test_scan_travels_with_the_command_when_watched(cl, box, workspace: Path) -> None:
    await shell(cl, box, "true")
    token = await cl.before_shell(box, piggyback=True)
    scan = token.scan  # type: ignore[attr-defined]
    assert scan is not None  # a watched snapshot: no separate scan was made
    r = await box.exec(ExecRequest("echo z > z", scan=scan))
    assert r.scan_after is not None and r.scan_after.from_events
    assert [e.path for e in r.scan_after.entries] == ["z"]
    assert await cl.after_shell(box, token, command="echo z > z", result=r) == ["z"]


async def test_a_command_after_a_tool_write_runs_at_once(cl, box, workspace: Path) -> None:
    """A write the changelog recorded is not handed back by the scan before the next
    command (the agent's snapshot takes the file it put there as seen, and the baseline
    gets its real stat): the command runs on its first try, nothing is recorded twice."""
    (workspace / "a.txt").write_text("a0")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "b.txt").write_text("b0")
    await shell(cl, box, "true")
    await cl.write(box, "a.txt", b"a1 from the tool", call_id="w1")
    await cl.write(box, "sub/b.txt", b"b1", call_id="w2")
    token = await cl.before_shell(box, piggyback=True)
    assert token.scan is not None  # type: ignore[attr-defined]
    r = await box.exec(ExecRequest("true", scan=token.scan))  # type: ignore[attr-defined]  # ScanFirst if handed back
    assert r.scan_after is not None and r.scan_after.entries == []
    assert await cl.after_shell(box, token, command="true", result=r) == []
    assert [(e.path, e.origin) for e in await cl.log()] == [("a.txt", "tool"), ("sub/b.txt", "tool")]


@pytest.mark.parametrize(
    "command",
    ["chmod 600 a.txt", "printf 'A1 FROM THE TOOL' > a.txt", "echo x >> a.txt", "rm a.txt", "mv c.txt a.txt"],
)
async def test_what_a_command_does_to_a_tool_written_file_is_recorded(cl, box, workspace: Path, command: str) -> None:
    """After a recorded write the baseline holds that file's real stat: a later command's
    change to it (its mode only, a same-size rewrite, a rename over it) is the command's
    entry, and undoing it brings back the tool's content and mode."""
    (workspace / "a.txt").write_text("a0")
    (workspace / "c.txt").write_text("from c")
    await shell(cl, box, "true")
    await cl.write(box, "a.txt", b"a1 from the tool", call_id="w1")
    mode = (workspace / "a.txt").stat().st_mode
    changed = await shell(cl, box, command, call_id="c1")
    assert "a.txt" in changed
    assert [e.path for e in await cl.log(call_id="c1")].count("a.txt") == 1
    await cl.undo(box, call_id="c1")
    assert (workspace / "a.txt").read_bytes() == b"a1 from the tool"
    assert (workspace / "a.txt").stat().st_mode == mode


async def test_shell_create_modify_delete_and_undo_exact_bytes(cl, box, workspace: Path) -> None:
    (workspace / "keep.bin").write_bytes(b"\x00\x01binary\xff")
    (workspace / "old.txt").write_bytes(b"old\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "edit.txt").write_bytes(b"before\n")
    changed = await shell(
        cl,
        box,
        "printf 'x\\0y' > keep.bin && rm old.txt && echo after > sub/edit.txt && echo n > new.txt",
        call_id="s1",
    )
    assert sorted(changed) == ["keep.bin", "new.txt", "old.txt", "sub/edit.txt"]
    ops = {e.path: e.op for e in await cl.log()}
    assert ops == {"keep.bin": "modify", "old.txt": "delete", "sub/edit.txt": "modify", "new.txt": "create"}
    assert all(e.origin == "shell" and e.call_id == "s1" and e.restorable for e in await cl.log())
    await cl.undo(box, call_id="s1")
    assert (workspace / "keep.bin").read_bytes() == b"\x00\x01binary\xff"
    assert (workspace / "old.txt").read_bytes() == b"old\n"
    assert (workspace / "sub" / "edit.txt").read_bytes() == b"before\n"
    assert not (workspace / "new.txt").exists()


async def test_noop_command_records_nothing(cl, box, workspace: Path) -> None:
    for i in range(20):
        (workspace / f"f{i}").write_text(str(i))
    assert await shell(cl, box, "true") == []
    assert await shell(cl, box, "cat f1 > /dev/null") == []
    assert await cl.log() == []


async def test_touch_without_content_change_is_not_an_entry(cl, box, workspace: Path) -> None:
    (workspace / "t").write_text("same")
    assert await shell(cl, box, "touch t") == []


async def test_same_size_rewrite_within_a_tick_is_caught(cl, box, workspace: Path) -> None:
    (workspace / "r").write_text("aaaa")
    await shell(cl, box, "echo bbb > r")
    # Same size, same inode, possibly the same mtime tick: the racy re-hash must catch it.
    changed = await shell(cl, box, "echo ccc > r")
    assert changed == ["r"]
    await cl.undo(box, all=True)
    assert (workspace / "r").read_text() == "aaaa"


async def test_rename_by_mv_is_one_rename_entry(cl, box, workspace: Path) -> None:
    (workspace / "a.txt").write_text("content")
    changed = await shell(cl, box, "mv a.txt b.txt")
    assert sorted(changed) == ["a.txt", "b.txt"]
    (entry,) = await cl.log()
    assert (entry.op, entry.path, entry.new_path) == ("rename", "a.txt", "b.txt")
    assert (await cl.summary()).renamed == [("a.txt", "b.txt")]
    await cl.undo(box, all=True)
    assert (workspace / "a.txt").read_text() == "content" and not (workspace / "b.txt").exists()


async def test_oversized_and_ignored_are_recorded_not_restorable(cl, box, workspace: Path) -> None:
    (workspace / "big").write_bytes(b"x" * 5000)
    (workspace / "node_modules" / "pkg").mkdir(parents=True)
    (workspace / "node_modules" / "pkg" / "i.js").write_text("1")
    changed = await shell(cl, box, "echo y > big && echo 2 > node_modules/pkg/i.js && echo 3 > node_modules/n.js")
    assert sorted(changed) == ["big", "node_modules/n.js", "node_modules/pkg/i.js"]
    by_op = {(e.path, e.op): e for e in await cl.log()}
    big = by_op["big", "modify"]
    assert not big.restorable and "size cap" in (big.note or "")
    # The existing file under an ignored directory had no before-image; the new one needs none.
    changed_nm = by_op["node_modules", "modify"]
    assert not changed_nm.restorable and "pkg/i.js" in (changed_nm.note or "") and changed_nm.tree_files == 1
    made_nm = by_op["node_modules", "create"]
    assert made_nm.restorable and made_nm.is_group and made_nm.tree_files == 1 and "n.js" in (made_nm.note or "")
    res = await cl.undo(box, all=True)
    assert sorted((s.path, s.status) for s in res.steps) == [
        ("big", "not_restorable"),
        ("node_modules", "not_restorable"),
        ("node_modules", "reverted"),
    ]
    (lost,) = [s for s in res.steps if s.path == "node_modules" and s.status == "not_restorable"]
    assert lost.paths == ["node_modules/pkg/i.js"]
    assert not (workspace / "node_modules" / "n.js").exists()
    assert (workspace / "node_modules" / "pkg" / "i.js").read_text() == "2\n"
    assert (await cl.summary()).not_restorable == ["big", "node_modules"]


async def test_total_cap_tracks_by_stat_only(tmp_path: Path, box, workspace: Path) -> None:
    for i in range(4):
        (workspace / f"f{i}").write_bytes(b"z" * 100)
    async with Changelog.open(tmp_path / "d2", workspace, limits=Limits(max_total_bytes=250)) as c:
        await shell(c, box, "for f in f0 f1 f2 f3; do echo changed > $f; done")
        entries = await c.log()
        assert len(entries) == 4
        assert sorted(e.restorable for e in entries) == [False, False, True, True]
        assert all("total size cap" in (e.note or "") for e in entries if not e.restorable)


async def test_symlinks_recorded_by_target(cl, box, workspace: Path) -> None:
    (workspace / "target.txt").write_text("t")
    (workspace / "old-link").symlink_to("target.txt")
    changed = await shell(cl, box, "ln -s target.txt new-link && rm old-link")
    assert sorted(changed) == ["new-link", "old-link"]
    by_path = {e.path: e for e in await cl.log()}
    assert by_path["new-link"].after_kind == "symlink" and by_path["new-link"].restorable
    assert by_path["old-link"].before_kind == "symlink" and by_path["old-link"].restorable
    await cl.undo(box, all=True)
    assert not os.path.lexists(workspace / "new-link")  # a created link is removed
    assert os.readlink(workspace / "old-link") == "target.txt"  # a removed one is made again
    assert (workspace / "target.txt").read_text() == "t"


async def test_changes_after_agent_restart_are_found_by_full_diff(cl, local_backend, box, workspace: Path) -> None:
    (workspace / "a").write_text("1")
    token = await cl.before_shell(box)
    await local_backend.stop(workspace)  # the agent and its scan snapshot are gone
    (workspace / "a").write_text("2")  # stands in for a command's effect
    (workspace / "b").write_text("new")
    box2 = await local_backend.get(workspace)
    changed = await cl.after_shell(box2, token, command="(restarted)")
    assert sorted(changed) == ["a", "b"]


async def test_planted_symlink_before_write_reads_nothing_outside(cl, box, workspace: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    (workspace / "innocent.txt").symlink_to(secret)
    with pytest.raises(PathEscapeError):
        await cl.write(box, "innocent.txt", b"overwrite")
    assert secret.read_text() == "TOP SECRET"
    blobs = cl._core.store.query("SELECT data FROM blobs")
    assert all(b"TOP SECRET" not in bytes(r[0]) for r in blobs)
    # The shell baseline records the link by target, never its content.
    await shell(cl, box, "true")
    blobs = cl._core.store.query("SELECT data FROM blobs")
    assert all(b"TOP SECRET" not in bytes(r[0]) for r in blobs)


async def test_dir_swapped_for_symlink_before_undo_writes_nothing_outside(
    cl, box, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    await cl.write(box, "d/f.txt", b"v1")
    await cl.write(box, "d/f.txt", b"v2")
    (workspace / "d" / "f.txt").unlink()
    (workspace / "d").rmdir()
    (outside / "f.txt").write_bytes(b"v2")  # same content, so only the link protects it
    (workspace / "d").symlink_to(outside)
    res = await cl.undo(box, all=True, force=True)
    assert all(s.status in ("failed", "reverted") for s in res.steps)
    assert any(s.status == "failed" for s in res.steps)
    assert (outside / "f.txt").read_bytes() == b"v2"
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]


async def test_tampered_entry_path_is_refused(cl, box, workspace: Path, tmp_path: Path) -> None:
    await cl.write(box, "a", b"1")
    with cl._core.store.tx() as db:
        db.execute("UPDATE entries SET path = '../../etc/passwd'")
    with pytest.raises(UndoRefusedError, match="outside the workspace"):
        await cl.undo(box, all=True)


ODD_NAMES = [
    b"bad\xff\xfe.txt",  # not UTF-8
    b"new\nline.txt",
    b"tab\there",
    b"caf\xc3\xa9.txt",  # UTF-8, not ASCII
    b'sp ace "quote" \\back.txt',
    b"esc\x1b[31mred",
]


@pytest.mark.parametrize("name", ODD_NAMES, ids=repr)
async def test_odd_file_names_are_recorded_and_undone(cl, box, workspace: Path, name: bytes) -> None:
    """A file name is bytes: one a command creates that is not UTF-8 (or holds a newline,
    an escape sequence ...) is recorded, listed in the log and undone like any other, and
    the next commands keep working (before, such a name broke every later scan)."""
    ws = os.fsencode(workspace)
    (workspace / "keep.txt").write_text("kept")
    Path(os.fsdecode(os.path.join(ws, b"seed"))).write_bytes(name)
    await shell(cl, box, "true")  # the baseline
    changed = await shell(cl, box, 'n=$(cat seed) && printf one > "$n" && mkdir -p "d-$n" && printf two > "d-$n/in"')
    text = os.fsdecode(name)
    assert sorted(changed) == sorted([text, f"d-{text}/in"])
    assert await shell(cl, box, 'printf three > "$(printf x)"') == ["x"]  # still works
    entries = await cl.log()
    assert {e.path for e in entries} >= {text, f"d-{text}/in"}
    assert text in (await cl.summary()).created
    await cl.undo(box, all=True)
    assert sorted(os.listdir(ws)) == sorted([b"keep.txt", b"seed"])  # the directory made is gone too


async def test_odd_call_ids_and_paths_survive_a_reopen(tmp_path: Path, box, workspace: Path) -> None:
    """The store keeps any str, NUL and lone surrogates included, and gives back exactly
    what it was given (also after a reopen); ordinary text is stored as it is."""
    from worker.changelog.store import _text, to_db

    for s in ["plain", "caf\u00e9", "\udcff", "a\x00b", "\x000041", "x\udcffy\x00\x00z", ""]:
        assert _text(to_db(s).encode()) == s
    assert to_db("plain/caf\u00e9.txt") == "plain/caf\u00e9.txt"
    c = Changelog.open(tmp_path / "data2", workspace)
    try:
        await c.write(box, "bad\udcff.txt", b"v1", call_id="call\udcfe\x00id", subtask_id="s\x00")
    finally:
        await c.aclose()
    c = Changelog.open(tmp_path / "data2", workspace)
    try:
        (e,) = await c.log(call_id="call\udcfe\x00id")
        assert (e.path, e.subtask_id) == ("bad\udcff.txt", "s\x00")
        assert os.path.exists(os.path.join(os.fsencode(workspace), b"bad\xff.txt"))
        await c.undo(box, subtask_id="s\x00")
        assert not os.path.exists(os.path.join(os.fsencode(workspace), b"bad\xff.txt"))
    finally:
        await c.aclose()


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: a file's bytes, None for a directory."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


async def test_directories_a_command_made_are_undone(cl, box, workspace: Path) -> None:
    """``mkdir -p`` and a file in it, an empty directory: entries for each directory,
    ordered so that undoing in reverse empties a directory before removing it; undo
    leaves exactly the tree there was. files_changed lists the files only."""
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_bytes(b"a\n")
    before = _tree(workspace)
    await shell(cl, box, "true")  # the baseline
    changed = await shell(cl, box, "mkdir -p build/x/y empty && printf o > build/x/y/out.o", call_id="c1")
    assert changed == ["build/x/y/out.o"]
    entries = await cl.log()
    made = [e.path for e in entries if e.after_kind == "dir"]
    assert sorted(made) == ["build", "build/x", "build/x/y", "empty"]
    assert all(e.op == "create" and e.restorable and e.call_id == "c1" for e in entries)
    ids = {e.path: e.id for e in entries}
    assert ids["build"] < ids["build/x"] < ids["build/x/y"] < ids["build/x/y/out.o"]
    assert "build" in (await cl.summary()).created
    dry = await cl.undo(box, call_id="c1", dry_run=True)
    assert "(dir)" not in dry.diff and "build/x/y/out.o" in dry.diff  # directories have no content to show
    assert "(dir)" not in await cl.diff(box)
    result = await cl.undo(box, call_id="c1")
    assert {s.status for s in result.steps} == {"reverted"}
    assert _tree(workspace) == before
    assert await shell(cl, box, "true") == []  # the baseline followed the undo
    assert (await cl.undo(box, call_id="c1")).steps[0].status == "already_reverted"


async def test_directories_a_command_removed_come_back(cl, box, workspace: Path) -> None:
    """``rm -rf`` of a tree with an empty directory in it: undo makes the directories again
    (the empty one too) and puts every file back, bytes exact."""
    (workspace / "d" / "sub").mkdir(parents=True)
    (workspace / "d" / "empty" / "deeper").mkdir(parents=True)
    (workspace / "d" / "sub" / "f.bin").write_bytes(b"\x00\xffdata")
    (workspace / "d" / "top.txt").write_bytes(b"top\n")
    before = _tree(workspace)
    await shell(cl, box, "true")
    assert sorted(await shell(cl, box, "rm -rf d", call_id="rm")) == ["d/sub/f.bin", "d/top.txt"]
    removed = {e.path: e.id for e in await cl.log() if e.before_kind == "dir"}
    assert sorted(removed) == ["d", "d/empty", "d/empty/deeper", "d/sub"]
    assert removed["d/empty/deeper"] < removed["d/empty"] < removed["d"]  # contents first
    result = await cl.undo(box, all=True)
    assert {s.status for s in result.steps} == {"reverted"}, result.steps
    assert _tree(workspace) == before


async def test_a_directory_that_was_there_stays(cl, box, workspace: Path) -> None:
    """A command that only puts a file into an existing (empty) directory: undo removes
    the file and keeps the directory, which the command did not make."""
    (workspace / "keep").mkdir()
    await shell(cl, box, "true")
    assert await shell(cl, box, "printf x > keep/f", call_id="c") == ["keep/f"]
    assert [e.path for e in await cl.log()] == ["keep/f"]
    await cl.undo(box, call_id="c")
    assert _tree(workspace) == {"keep": None}


async def test_a_made_directory_stays_with_what_later_calls_put_in_it(cl, box, workspace: Path) -> None:
    """Undoing the command that made a directory, while a later command's file is still in
    it: the directory is kept, and the step (dry run too) says what is in it and which
    change put it there. Undoing the later command then leaves it empty, and an undo of
    everything removes it: the exact tree there was."""
    await shell(cl, box, "true")
    await shell(cl, box, "mkdir d && printf 1 > d/first", call_id="one")
    await shell(cl, box, "printf 2 > d/second", call_id="two")
    second = next(e.id for e in await cl.log() if e.path == "d/second")
    preview = await cl.undo(box, call_id="one", dry_run=True)
    step = next(s for s in preview.steps if s.path == "d")
    assert step.status == "kept", preview.steps
    assert step.message == f"kept d/: not empty (d/second was added by a later change, entry {second}, call two)"
    result = await cl.undo(box, call_id="one")
    step = next(s for s in result.steps if s.path == "d")
    assert (step.status, step.message) == (
        "kept",
        f"kept d/: not empty (d/second was added by a later change, entry {second}, call two)",
    )
    assert not result.failed
    assert _tree(workspace) == {"d": None, "d/second": b"2"}
    await cl.undo(box, call_id="two")
    assert _tree(workspace) == {"d": None}
    again = await cl.undo(box, all=True)
    assert [s.status for s in again.steps if s.path == "d"] == ["reverted"], again.steps
    assert _tree(workspace) == {}


async def test_directories_a_tool_write_made_are_not_taken_for_a_command(cl, box, workspace: Path) -> None:
    """write_file into new directories makes them; the next command's scan must not
    record them as the command's."""
    await shell(cl, box, "true")
    ws = Workspace(workspace, box, cl)
    await ws.write("new/deep/file.txt", b"x", tool="write_file", call_id="w")
    assert await shell(cl, box, "true", call_id="after") == []
    assert [(e.call_id, e.path) for e in await cl.log()] == [
        ("w", "new"),
        ("w", "new/deep"),
        ("w", "new/deep/file.txt"),
    ]


async def test_directories_a_tool_write_made_are_undone(cl, box, workspace: Path) -> None:
    """write_file of ``new/deep/f.txt`` records the two directories it makes (older
    entries of the same call, in the write's transaction); undoing the call removes the
    file and then, emptied, the directories: the tree there was. A directory that was
    there stays."""
    (workspace / "old").mkdir()
    before = _tree(workspace)
    await shell(cl, box, "true")
    ws = Workspace(workspace, box, cl)
    await ws.write("new/deep/f.txt", b"x", tool="write_file", call_id="w")
    await ws.write("old/a/g.txt", b"y", tool="write_file", call_id="w")
    got = [(e.op, e.path, e.after_kind, e.state) for e in await cl.log()]
    assert got == [
        ("create", "new", "dir", "applied"),
        ("create", "new/deep", "dir", "applied"),
        ("create", "new/deep/f.txt", "file", "applied"),
        ("create", "old/a", "dir", "applied"),
        ("create", "old/a/g.txt", "file", "applied"),
    ]
    assert await shell(cl, box, "true", call_id="after") == []  # the baseline knows them
    assert len(await cl.log()) == 5
    preview = await cl.undo(box, call_id="w", dry_run=True)
    assert {s.status for s in preview.steps} == {"would_revert"}, preview.steps
    result = await cl.undo(box, call_id="w")
    assert {s.status for s in result.steps} == {"reverted"}, result.steps
    assert _tree(workspace) == before


async def test_a_directory_a_tool_made_is_kept_while_a_later_file_is_in_it(cl, box, workspace: Path) -> None:
    """Undoing only the write that made ``new/``, while a later command's file is in it:
    ``new/`` stays, and the step says why (dry run and undo alike)."""
    await shell(cl, box, "true")
    ws = Workspace(workspace, box, cl)
    await ws.write("new/f.txt", b"x", tool="write_file", call_id="w")
    await shell(cl, box, "printf 2 > new/x.txt", call_id="later")
    later = next(e.id for e in await cl.log() if e.path == "new/x.txt")
    why = f"kept new/: not empty (new/x.txt was added by a later change, entry {later}, call later)"
    preview = await cl.undo(box, call_id="w", dry_run=True)
    assert [(s.status, s.message) for s in preview.steps if s.path == "new"] == [("kept", why)]
    result = await cl.undo(box, call_id="w")
    assert [(s.status, s.message) for s in result.steps if s.path == "new"] == [("kept", why)]
    assert _tree(workspace) == {"new": None, "new/x.txt": b"2"}
    await cl.undo(box, all=True)
    assert _tree(workspace) == {}


async def test_a_files_only_baseline_is_upgraded_without_entries(tmp_path: Path, box, workspace: Path) -> None:
    """A baseline written before directories were listed (version "1"): the next scan adds
    the workspace's directories to it without recording them as made."""
    (workspace / "a" / "b").mkdir(parents=True)
    (workspace / "a" / "b" / "f").write_text("f")
    cl = Changelog.open(tmp_path / "data", workspace)
    try:
        await shell(cl, box, "true")
        core = cl._core
        await core.db(_downgrade, core)
    finally:
        await cl.aclose()
    cl = Changelog.open(tmp_path / "data", workspace)  # a new process: the agent's scan is a full one
    try:
        assert await shell(cl, box, "true") == []
        assert await cl.log() == []
        assert await shell(cl, box, "mkdir a/c", call_id="m") == []
        assert [(e.path, e.after_kind) for e in await cl.log()] == [("a/c", "dir")]
    finally:
        await cl.aclose()


def _downgrade(core) -> None:  # type: ignore[no-untyped-def]
    with core.store.tx() as db:
        db.execute("DELETE FROM baseline WHERE type = 'dir'")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'baseline'")
