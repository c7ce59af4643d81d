"""The guard's walk with its inotify watch (``worker.guard.walk.Walk(watch=True)``,
``worker.guard.dirwatch``): a check of a tree where nothing happened opens no directory
but the root's way; whatever a command can do (make, remove, rename and remake
directories, setid bits made or set in place, git directories made or removed) is found
exactly as a walk of every directory finds it, checked against the truth after every
random batch of changes; and a watch the kernel (or the process's share) refuses leaves
the walk of every directory, never a blind spot."""

from __future__ import annotations

import gc
import os
import random
import stat
import time
from pathlib import Path

import pytest

from worker.guard import dirwatch, walk
from worker.guard.walk import FULL_WALK_EVERY_WATCHED, Action, OverBudget, Walk, is_git_dir


def check(w: Walk, root: Path) -> tuple[list[str], list[Action]]:
    actions: list[Action] = []
    fd = os.open(root, walk.DIR_FLAGS)
    try:
        return list(w.run(fd, actions)), actions
    finally:
        os.close(fd)


def truth(root: Path) -> tuple[set[str], list[str]]:
    """The git directories and the setid files in the tree, by os.walk."""
    gits, setid = set(), []
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        rel = "" if rel == "." else rel
        if is_git_dir(set(dirs) | set(files)):
            gits.add(rel)
        for f in files:
            st = os.lstat(os.path.join(d, f))
            if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                setid.append(os.path.join(rel, f))
    return gits, setid


def tree(root: Path, dirs: int = 60) -> None:
    for i in range(dirs):
        d = root / f"pkg{i % 6}" / f"mod{i}" / ("deep" if i % 3 == 0 else "")
        d.mkdir(parents=True, exist_ok=True)
        (d / "f.py").write_text("x")


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every directory the walk opens below the root (``os.open`` with a ``dir_fd`` in
    worker.guard.walk)."""
    seen: list[object] = []
    real = walk.os.open

    def counting(path, flags, *a, **k):
        if k.get("dir_fd") is not None:
            seen.append(path)
        return real(path, flags, *a, **k)

    monkeypatch.setattr(walk.os, "open", counting)
    return seen


def test_a_check_where_nothing_happened_opens_nothing_below_the_root(tmp_path: Path, opens: list[object]) -> None:
    tree(tmp_path)
    w = Walk(watch=True)
    try:
        check(w, tmp_path)  # the first walk visits and watches every directory
        assert len(opens) > 60
        opens.clear()
        check(w, tmp_path)
        assert opens == []
        (tmp_path / "pkg3" / "mod9" / "deep" / "new.txt").write_text("y")
        check(w, tmp_path)
        assert set(opens) == {"pkg3", "mod9", "deep"}  # the way to the one directory with an event
    finally:
        w.close()


def test_setid_bits_set_in_place_are_found(tmp_path: Path) -> None:
    tree(tmp_path)
    w = Walk(watch=True)
    try:
        check(w, tmp_path)
        f = tmp_path / "pkg1" / "mod7" / "f.py"
        os.chmod(f, 0o4755)  # (an unwatched walk leaves this to its whole walk, once a minute)
        _gits, actions = check(w, tmp_path)
        assert [a.path for a in actions] == ["pkg1/mod7/f.py"]
        assert not stat.S_IMODE(f.stat().st_mode) & stat.S_ISUID
    finally:
        w.close()


def test_a_directory_removed_and_made_again_is_walked_whole(tmp_path: Path) -> None:
    tree(tmp_path)
    w = Walk(watch=True)
    try:
        check(w, tmp_path)
        d = tmp_path / "pkg2" / "mod8"
        for p in sorted(d.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        d.rmdir()
        (d / "a" / "b").mkdir(parents=True)
        (d / "a" / "b" / "s").write_text("x")
        os.chmod(d / "a" / "b" / "s", 0o2755)
        gits, actions = check(w, tmp_path)
        assert [a.path for a in actions] == ["pkg2/mod8/a/b/s"]
        (d / "a" / "b" / "HEAD").write_text("ref: refs/heads/main\n")
        gits, _ = check(w, tmp_path)
        assert gits == ["pkg2/mod8/a/b"]
    finally:
        w.close()


def test_a_directory_renamed_is_found_at_its_new_path(tmp_path: Path, opens: list[object]) -> None:
    tree(tmp_path)
    w = Walk(watch=True)
    try:
        check(w, tmp_path)
        (tmp_path / "pkg4" / "mod4" / "HEAD").write_text("x")
        assert check(w, tmp_path)[0] == ["pkg4/mod4"]
        os.rename(tmp_path / "pkg4", tmp_path / "moved")
        opens.clear()
        gits, _ = check(w, tmp_path)
        assert gits == ["moved/mod4"]
        assert len(opens) > 60  # the watch lost the paths: every directory again
        (tmp_path / "moved" / "mod4" / "deep2").mkdir()
        (tmp_path / "moved" / "mod4" / "deep2" / "x").write_text("x")
        os.chmod(tmp_path / "moved" / "mod4" / "deep2" / "x", 0o4700)
        opens.clear()
        _, actions = check(w, tmp_path)
        assert [a.path for a in actions] == ["moved/mod4/deep2/x"]
        assert len(opens) < 10  # watched at their new paths
    finally:
        w.close()


def test_a_refused_watch_leaves_the_walk_of_every_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree(tmp_path)
    _settle()
    monkeypatch.setattr(dirwatch._budget, "watches", 20)  # fewer than the tree's directories
    w = Walk(watch=True)
    try:
        check(w, tmp_path)
        assert w._watch is None  # dropped for good, its watches given back
        assert dirwatch._budget.watches == 20
        f = tmp_path / "pkg5" / "mod11" / "n"
        f.write_text("x")
        os.chmod(f, 0o4755)
        _, actions = check(w, tmp_path)
        assert [a.path for a in actions] == ["pkg5/mod11/n"]
    finally:
        w.close()


def test_an_overflowed_queue_means_every_directory_again(tmp_path: Path, opens: list[object]) -> None:
    tree(tmp_path, 12)
    w = Walk(watch=True)
    try:
        check(w, tmp_path)
        assert w._watch is not None
        w._watch.changes = lambda: (set(), False)  # type: ignore[method-assign]  # (what an overflow reports)
        opens.clear()
        check(w, tmp_path)
        assert len(opens) >= 12
    finally:
        w.close()


@pytest.mark.parametrize("seed", range(6))
def test_random_changes_are_found_as_a_whole_walk_finds_them(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    root = tmp_path / "ws"
    root.mkdir()
    tree(root, 30)
    w = Walk(watch=True)
    try:
        check(w, root)
        for _round in range(25):
            for _ in range(rng.randint(1, 6)):
                _random_change(rng, root)
            if rng.random() < 0.5:  # a check on the event loop, over its budget first
                fd = os.open(root, walk.DIR_FLAGS)
                try:
                    list(w.run(fd, [], time.monotonic() + rng.choice([0.0, 1e-5, 1e-4, 1e-3])))
                except OverBudget:
                    pass
                finally:
                    os.close(fd)
            gits, _actions = check(w, root)
            want_gits, setid = truth(root)
            assert setid == [], f"round {_round}: setid left: {setid}"
            assert set(gits) == want_gits
            if rng.random() < 0.1:
                w.full_at -= FULL_WALK_EVERY_WATCHED  # now and then a whole walk between
    finally:
        w.close()


def _random_change(rng: random.Random, root: Path) -> None:
    dirs = [Path(d) for d, _, _ in os.walk(root)]
    d = rng.choice(dirs)
    op = rng.randrange(7)
    if op == 0:
        (d / f"d{rng.randrange(1000)}").mkdir(exist_ok=True)
    elif op == 1:
        f = d / f"f{rng.randrange(1000)}"
        f.write_text("x")
        if rng.random() < 0.5:
            os.chmod(f, rng.choice([0o4755, 0o2755, 0o6755]))
    elif op == 2:
        files = [p for p in d.iterdir() if p.is_file()]
        if files:
            os.chmod(rng.choice(files), 0o4755)
    elif op == 3 and d != root:
        for p in sorted(d.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
        d.rmdir()
        if rng.random() < 0.5:  # made again at once, with a setid file in it
            (d / "again").mkdir(parents=True)
            (d / "again" / "s").write_text("x")
            os.chmod(d / "again" / "s", 0o4755)
    elif op == 4 and d != root:
        target = rng.choice(dirs)
        if target != d and not target.is_relative_to(d):
            new = target / f"r{rng.randrange(1000)}"
            if not new.exists():
                os.rename(d, new)
    elif op == 5:
        (d / rng.choice(["HEAD", "commondir"])).write_text("x")
    else:
        head = d / "HEAD"
        if head.exists():
            head.unlink()


def test_another_directory_moved_into_the_roots_place_is_walked_whole(tmp_path: Path) -> None:
    """A gVisor warm sandbox's directory is renamed over the (empty) workspace at its
    claim: the same path, none of its directories watched, and no event says so."""
    root = tmp_path / "ws"
    root.mkdir()
    w = Walk(watch=True)
    try:
        check(w, root)
        other = tmp_path / "slot"
        (other / "a" / "b").mkdir(parents=True)
        (other / "a" / "b" / "HEAD").write_text("x")
        os.rename(other, root)
        assert check(w, root)[0] == ["a/b"]
        (root / "a" / "b" / "c").mkdir()
        (root / "a" / "b" / "c" / "s").write_text("x")
        os.chmod(root / "a" / "b" / "c" / "s", 0o4755)
        _, actions = check(w, root)
        assert [a.path for a in actions] == ["a/b/c/s"]
    finally:
        w.close()


def test_a_new_tree_visited_in_part_is_visited_whole_next_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A check on the event loop that runs out of its budget inside a new directory's tree
    (git init made it): the next check walks that tree whole, not only what was reached."""
    tree(tmp_path, 6)
    w = Walk(watch=True)
    try:
        check(w, tmp_path)
        (tmp_path / "new" / "a" / "b").mkdir(parents=True)
        (tmp_path / "new" / "a" / "b" / "s").write_text("x")
        os.chmod(tmp_path / "new" / "a" / "b" / "s", 0o4755)
        real = time.monotonic
        calls = [0]

        def clock() -> float:  # past the deadline at the tree's second directory
            calls[0] += 1
            return real() + (0.0 if calls[0] < 4 else 10.0)

        monkeypatch.setattr(walk.time, "monotonic", clock)
        fd = os.open(tmp_path, walk.DIR_FLAGS)
        try:
            with pytest.raises(OverBudget):
                list(w.run(fd, [], real() + 5.0))
        finally:
            os.close(fd)
        monkeypatch.undo()
        _, actions = check(w, tmp_path)
        assert [a.path for a in actions] == ["new/a/b/s"]
    finally:
        w.close()


def test_every_guard_shares_one_instance_past_the_old_limit_of_32(tmp_path: Path, opens: list[object]) -> None:
    """An instance per workspace had a quarter of the user's 128: the 33rd workspace was
    walked whole after every command. Forty share one descriptor, each told only its own."""
    roots = [tmp_path / f"ws{i}" for i in range(40)]
    walks = [Walk(watch=True) for _ in roots]
    try:
        for w, root in zip(walks, roots, strict=True):
            tree(root, 6)
            check(w, root)
        assert all(w._watch is not None for w in walks)
        assert len({w._watch._inst.fd for w in walks if w._watch is not None}) == 1
        f = roots[37] / "pkg1" / "mod1" / "s"
        f.write_text("x")
        os.chmod(f, 0o4755)
        for i, (w, root) in enumerate(zip(walks, roots, strict=True)):
            opens.clear()
            _, actions = check(w, root)
            assert [a.path for a in actions] == (["pkg1/mod1/s"] if i == 37 else []), i
            assert opens == [] or i == 37, (i, opens)  # the others open nothing below their roots
    finally:
        for w in walks:
            w.close()


def test_nested_workspaces_watch_the_same_directories(tmp_path: Path) -> None:
    """The kernel gives an inode one descriptor per instance: a workspace inside another
    has the same descriptors at other paths, and closing one leaves the other's watches."""
    outer, inner = tmp_path, tmp_path / "proj"
    tree(inner, 6)
    wo, wi = Walk(watch=True), Walk(watch=True)
    try:
        check(wo, outer)
        check(wi, inner)
        (inner / "pkg2" / "s").write_text("x")
        os.chmod(inner / "pkg2" / "s", 0o2755)
        assert [a.path for a in check(wi, inner)[1]] == ["pkg2/s"]
        os.chmod(inner / "pkg2" / "s", 0o2755)  # set again by the command (cleared by the first check)
        wi.close()
        assert [a.path for a in check(wo, outer)[1]] == ["proj/pkg2/s"]
        (inner / "pkg3" / "t").write_text("x")
        os.chmod(inner / "pkg3" / "t", 0o4755)
        assert [a.path for a in check(wo, outer)[1]] == ["proj/pkg3/t"]  # still watched
    finally:
        wo.close()
        wi.close()


def _settle() -> None:
    """Release what guards dropped earlier in this process (other tests') gave back."""
    gc.collect()
    probe = dirwatch.DirWatch.open()
    assert probe is not None
    probe.changes()
    probe.close()


def test_a_guard_dropped_without_close_gives_its_watches_back(tmp_path: Path) -> None:
    tree(tmp_path, 12)
    _settle()
    before = dirwatch._budget.watches
    w = Walk(watch=True)
    check(w, tmp_path)
    assert dirwatch._budget.watches < before
    del w
    gc.collect()
    other = Walk(watch=True)
    try:
        check(other, tmp_path / "pkg0")  # any look releases what was dropped
        assert dirwatch._budget.watches == before - len(other._dirs)
    finally:
        other.close()
    assert dirwatch._budget.watches == before


def test_an_overflow_is_every_guards_doubt(tmp_path: Path, opens: list[object]) -> None:
    """Events lost could be any workspace's: after an overflow every guard walks whole."""
    a, b = tmp_path / "a", tmp_path / "b"
    tree(a, 6)
    tree(b, 6)
    wa, wb = Walk(watch=True), Walk(watch=True)
    try:
        check(wa, a)
        check(wb, b)
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
        flood = a / "pkg0"
        for i in range(limit + 10):
            (flood / f"f{i}").mkdir()
        opens.clear()
        check(wb, b)
        assert len(opens) >= 6  # b walked whole: nothing of b changed, but the queue overflowed
        for i in range(limit + 10):
            (flood / f"f{i}").rmdir()
    finally:
        wa.close()
        wb.close()


def test_a_forked_child_neither_reads_nor_removes_its_parents_watches(tmp_path: Path, opens: list[object]) -> None:
    """The instance's descriptor is the same open queue in a forked child: its inherited
    guards walk every directory instead (and drop their watch), a new one watches on an
    instance of its own, and the parent's watches are still there when it exits."""
    a, b = tmp_path / "a", tmp_path / "b"
    tree(a, 12)
    tree(b, 6)
    w = Walk(watch=True)
    try:
        check(w, a)
        assert w._watch is not None
        parent_fd = w._watch._inst.fd
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report through the pipe, never return into pytest
            code = 1
            try:
                s = a / "pkg2" / "mod2" / "s"
                s.write_text("x")
                os.chmod(s, 0o4755)
                found = [x.path for x in check(w, a)[1]]
                fresh = Walk(watch=True)
                check(fresh, b)
                own = fresh._watch is not None and fresh._watch._inst.fd >= 0
                t = b / "pkg1" / "t"
                t.write_text("x")
                os.chmod(t, 0o2755)
                found_b = [x.path for x in check(fresh, b)[1]]
                ok = found == ["pkg2/mod2/s"] and w._watch is None and own and found_b == ["pkg1/t"]
                os.write(write_end, repr((found, w._watch is None, own, found_b)).encode())
                code = 0 if ok else 1
            finally:
                os._exit(code)
        os.close(write_end)
        _, status = os.waitpid(pid, 0)
        report = os.read(read_end, 4096).decode()
        os.close(read_end)
        assert os.waitstatus_to_exitcode(status) == 0, report
        # The parent's watch is its own still: the child's setid file was seen by it too
        # (the child fixed it: nothing left to do), and a new one is found opening only its way.
        assert w._watch is not None and w._watch._inst.fd == parent_fd
        check(w, a)
        u = a / "pkg3" / "mod3" / "u"
        u.write_text("x")
        os.chmod(u, 0o4755)
        opens.clear()
        assert [x.path for x in check(w, a)[1]] == ["pkg3/mod3/u"]
        assert set(opens) <= {"pkg3", "mod3", "deep", "u"}, opens  # its way, not a walk of every directory
    finally:
        w.close()
