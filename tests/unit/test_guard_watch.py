"""The guard's walk with its inotify watch (``worker.guard.walk.Walk(watch=True)``,
``worker.guard.dirwatch``): a check of a tree where nothing happened opens no directory
but the root's way; whatever a command can do (make, remove, rename and remake
directories, setid bits made or set in place, git directories made or removed) is found
exactly as a walk of every directory finds it, checked against the truth after every
random batch of changes; and a watch the kernel (or the process's share) refuses leaves
the walk of every directory, never a blind spot."""

from __future__ import annotations

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
