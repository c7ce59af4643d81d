"""Undo gives back exactly the tree there was (local backend): what commands create in
ignored directories, whole trees as one entry, git's own files, permission bits, symlinks
and changes of kind. Each test compares the whole tree state (paths, kinds, modes, bytes,
link targets) before the first call and after ``undo --all``."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.base import ExecRequest, Sandbox
from tests.treehash import tree_diff, tree_state
from worker.changelog import Changelog, Limits
from worker.workspace import Workspace


@pytest.fixture
async def cl(tmp_path: Path, workspace: Path) -> AsyncIterator[Changelog]:
    c = Changelog.open(tmp_path / "data", workspace, limits=Limits(max_file_bytes=4096))
    yield c
    await c.aclose()


async def shell(cl: Changelog, box: Sandbox, command: str, call_id: str | None = None) -> list[str]:
    r, changed = await Workspace(Path(cl.workspace), box, cl).run_shell(ExecRequest(command), call_id=call_id)
    assert r.exit_code == 0, r.stderr
    return changed


async def undo_all_is_exact(cl: Changelog, box: Sandbox, workspace: Path, before: dict) -> None:
    preview = await cl.undo(box, all=True, dry_run=True)
    assert [s for s in preview.steps if s.status == "not_restorable"] == []
    result = await cl.undo(box, all=True)
    assert [s for s in result.steps if s.status not in ("reverted", "already_reverted")] == []
    assert tree_diff(before, tree_state(workspace)) == []


async def test_a_made_node_modules_is_one_entry_and_undone(cl, box, workspace: Path) -> None:
    (workspace / "package.json").write_text("{}")
    before = tree_state(workspace)
    changed = await shell(
        cl,
        box,
        "for p in a b c; do mkdir -p node_modules/$p/lib && for i in 1 2 3 4 5; do "
        "echo $p$i > node_modules/$p/lib/f$i.js; done; done; ln -s ../a node_modules/b/link",
        call_id="install",
    )
    assert changed == ["node_modules/"]
    (entry,) = await cl.log()
    assert entry.is_tree and entry.path == "node_modules" and entry.restorable
    assert (entry.tree_files, entry.tree_bytes) == (16, 15 * 3)
    # A later command works inside the tree; undoing everything still gives the tree back.
    await shell(cl, box, "echo changed > node_modules/a/lib/f1.js && rm node_modules/c/lib/f2.js", call_id="edit")
    await undo_all_is_exact(cl, box, workspace, before)


async def test_creations_under_an_existing_ignored_dir_are_one_group(cl, box, workspace: Path) -> None:
    (workspace / "node_modules" / "old").mkdir(parents=True)
    (workspace / "node_modules" / "old" / "keep.js").write_text("old")
    before = tree_state(workspace)
    await shell(cl, box, "mkdir -p node_modules/new/x && echo 1 > node_modules/new/x/i.js && echo 2 >node_modules/n.js")
    (entry,) = await cl.log()
    assert entry.is_group and entry.op == "create" and entry.path == "node_modules"
    assert entry.tree_files == 2 and "new" in (entry.note or "") and "n.js" in (entry.note or "")
    await undo_all_is_exact(cl, box, workspace, before)


async def test_a_file_made_then_rewritten_in_an_ignored_dir_needs_no_before_image(cl, box, workspace: Path) -> None:
    """Call 1 makes ``__pycache__`` (one tree entry), call 2 rewrites a file in it (no
    content kept there): undoing both removes the tree, and nothing is reported lost."""
    (workspace / "pkg").mkdir()
    (workspace / "pkg" / "m.py").write_text("x = 1\n")
    before = tree_state(workspace)
    await shell(cl, box, "mkdir pkg/__pycache__ && echo v1 > pkg/__pycache__/m.pyc", call_id="one")
    await shell(cl, box, "echo v2 > pkg/__pycache__/m.pyc && echo n > pkg/__pycache__/n.pyc", call_id="two")
    kinds = sorted((e.call_id, e.op, e.restorable) for e in await cl.log())
    assert kinds == [("one", "create", True), ("two", "create", True), ("two", "modify", False)]
    # Undoing only the second call cannot restore the rewritten file: said precisely.
    preview = await cl.undo(box, call_id="two", dry_run=True)
    (lost,) = [s for s in preview.steps if s.status == "not_restorable"]
    assert lost.paths == ["pkg/__pycache__/m.pyc"]
    await undo_all_is_exact(cl, box, workspace, before)


async def test_undo_of_one_command_removes_only_its_creations(cl, box, workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("a\n")
    await shell(cl, box, "true")
    await shell(cl, box, "mkdir -p .venv/lib && echo 1 > .venv/lib/x && mkdir build && echo b > build/b", call_id="one")
    await shell(cl, box, "mkdir -p node_modules/p && echo 2 > node_modules/p/y && echo c > src/c.py", call_id="two")
    after_two = tree_state(workspace)
    await shell(cl, box, "mkdir dist && echo d > dist/d && echo x >> src/a.py", call_id="three")
    await cl.undo(box, call_id="three")
    assert tree_diff(after_two, tree_state(workspace)) == []
    await cl.undo(box, call_id="one")
    now = tree_state(workspace)
    assert not any(p.startswith((".venv", "build")) for p in now)
    assert {"node_modules/p/y", "src/c.py"} <= set(now)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this host")
async def test_a_git_session_is_undone_exactly(cl, box, workspace: Path) -> None:
    """``git init``, commits, a branch, a reset and a stash: the repository's own files
    (HEAD, refs, index, logs, config) keep their before-images, objects are only added,
    so ``undo --all`` leaves the workspace, ``.git`` included, as it was; and undoing
    only the later calls gives back the repository as it stood after the first commit."""
    git = "git -c user.name=t -c user.email=t@e -c init.defaultBranch=main"
    (workspace / "a.txt").write_text("a\n")
    before = tree_state(workspace)
    await shell(cl, box, f"{git} init -q && {git} add -A && {git} commit -qm one", call_id="init")
    after_init = tree_state(workspace)
    await shell(cl, box, f"{git} checkout -qb feature && echo b > b.txt && {git} add b.txt && {git} commit -qm two")
    await shell(cl, box, f"echo c >> a.txt && {git} stash -q && {git} checkout -q main && {git} reset -q --hard")
    await shell(cl, box, f"{git} branch -D feature -q && {git} pack-refs --all")
    entries = await cl.log()
    assert len(entries) < 60  # the repository is not one entry per object
    last = max(e.id for e in entries if e.call_id == "init")
    await cl.undo(box, to=last)
    assert tree_diff(after_init, tree_state(workspace)) == []
    r = await box.exec(ExecRequest(f"{git} status --porcelain && {git} log --oneline | wc -l"))
    assert r.stdout.decode().strip() == "1", r.stdout
    await undo_all_is_exact(cl, box, workspace, before)


async def test_modes_symlinks_and_changes_of_kind_are_undone(cl, box, workspace: Path) -> None:
    (workspace / "run.sh").write_text("#!/bin/sh\n")
    (workspace / "run.sh").chmod(0o644)
    (workspace / "d").mkdir(mode=0o755)
    (workspace / "d" / "f").write_text("f")
    (workspace / "link").symlink_to("run.sh")
    (workspace / "will-be-link").write_text("file")
    (workspace / "will-be-dir").write_text("file2")
    (workspace / "dir-to-file").mkdir()
    before = tree_state(workspace)
    await shell(
        cl,
        box,
        "chmod 755 run.sh && chmod 700 d && ln -sfn d link && rm will-be-link && ln -s d/f will-be-link"
        " && rm will-be-dir && mkdir will-be-dir && echo in > will-be-dir/x"
        " && rmdir dir-to-file && echo now-a-file > dir-to-file && ln -s nowhere dangling",
    )
    by_path = {e.path: e for e in await cl.log()}
    assert by_path["run.sh"].op == "modify" and by_path["run.sh"].before_hash == by_path["run.sh"].after_hash
    assert all(e.restorable for e in by_path.values()), [e for e in by_path.values() if not e.restorable]
    await undo_all_is_exact(cl, box, workspace, before)


async def test_a_file_over_the_cap_is_the_only_loss(tmp_path: Path, box, workspace: Path) -> None:
    """A pre-existing file over the per-file cap, changed by a command, is reported (in
    the dry run first) as the one path that cannot be restored; the rest is."""
    (workspace / "big.bin").write_bytes(b"b" * 10_000)
    (workspace / "small.txt").write_text("s")
    async with Changelog.open(tmp_path / "d", workspace, limits=Limits(max_file_bytes=4096)) as c:
        before = tree_state(workspace)
        await shell(c, box, "echo more >> big.bin && echo t > small.txt && mkdir out && echo o > out/o")
        preview = await c.undo(box, all=True, dry_run=True)
        lost = [s.path for s in preview.steps if s.status == "not_restorable"]
        assert lost == ["big.bin"]
        await c.undo(box, all=True)
        diff = tree_diff(before, tree_state(workspace))
        assert len(diff) == 1 and diff[0].startswith("big.bin:")


async def test_a_dry_run_touches_nothing(cl, box, workspace: Path) -> None:
    await shell(cl, box, "true")
    await shell(cl, box, "mkdir -p node_modules/a && echo 1 > node_modules/a/i.js && chmod 700 node_modules")
    state = tree_state(workspace)
    preview = await cl.undo(box, all=True, dry_run=True)
    assert {s.status for s in preview.steps} == {"would_revert"}
    assert tree_state(workspace) == state


@pytest.mark.parametrize(
    ("path", "root"),
    [
        (".git/HEAD", None),
        (".git/refs/heads/main", None),
        (".git/objects", None),
        (".git/objects/ab/cdef", ".git/objects"),
        (".git/modules/sub/objects/pack/p.pack", ".git/modules/sub/objects"),
        ("vendor/.git/lfs/objects/x", "vendor/.git/lfs"),
        ("src/objects/model.py", None),
        ("node_modules/pkg/.git/objects/x", "node_modules"),
        ("a/__pycache__/m.pyc", "a/__pycache__"),
    ],
)
def test_what_is_tracked_by_stat_only(path: str, root: str | None) -> None:
    from worker.changelog.shellrows import ignored_root

    assert ignored_root(path, Limits().ignored_dirs) == root
