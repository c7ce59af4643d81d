"""The agent's incremental snapshot scan (inotify) against a full stat walk.

Random file-system operations (create, rewrite, append, delete, chmod, mkdir, rm -r,
rename of files and directories, hard links, symlinks, a directory swapped for a file)
run between scans; after each round the incremental result must describe exactly the
same tree as a fresh full walk, and report exactly the paths whose stat changed. The
agent's modules run in this process, rooted at a temporary directory.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from sandbox.agent import paths, scanwalk, snapshot, state
from sandbox.agent import scan as agent_scan


@pytest.fixture
def root(agent_root: Path) -> Path:
    return agent_root


def full_walk() -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    fd, _parts = paths.open_dir(".")
    try:
        scanwalk.walk(fd, "", set(), out, 1 << 30)
    finally:
        os.close(fd)
    return out


def scan(since: str | None, **kw) -> dict:
    return agent_scan.op_scan({"path": ".", "snapshot": "k", "since": since, **kw})


def apply(view: dict[str, tuple], res: dict) -> dict[str, tuple]:
    if res["full"]:
        return {e[0]: tuple(e[1:]) for e in res["entries"]}
    new = dict(view)
    for p in res["removed"]:
        new.pop(p, None)
    for e in res["entries"]:
        new[e[0]] = tuple(e[1:])
    return new


OPS = ["create", "create", "rewrite", "append", "delete", "chmod", "mkdir", "rmtree"]
OPS += ["mvfile", "mvdir", "link", "symlink", "swap"]


def random_op(rng: random.Random, root: Path) -> None:
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    dirs = [p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()] + [root]
    op = rng.choice(OPS)
    d = rng.choice(dirs)
    if op == "create" or (not files and op in ("rewrite", "append", "delete", "chmod", "mvfile", "link")):
        (d / f"f{rng.randrange(10**6)}").write_bytes(os.urandom(rng.randrange(0, 64)))
    elif op == "rewrite":
        f = rng.choice(files)
        f.write_bytes(os.urandom(f.stat().st_size))  # same size
    elif op == "append":
        with rng.choice(files).open("ab") as fh:
            fh.write(b"x")
    elif op == "delete":
        rng.choice(files).unlink()
    elif op == "chmod":
        f = rng.choice(files)
        f.chmod(f.stat().st_mode ^ 0o100)
    elif op == "mkdir":
        sub = d / f"d{rng.randrange(10**6)}"
        sub.mkdir()
        (sub / "inner").write_text("x")
    elif op == "rmtree" and d != root:
        shutil.rmtree(d)
    elif op == "mvfile":
        f = rng.choice(files)
        f.rename(rng.choice(dirs) / f"m{rng.randrange(10**6)}")
    elif op == "mvdir" and d != root:
        target = rng.choice(dirs)
        if not str(target).startswith(str(d)):
            d.rename(target / f"moved{rng.randrange(10**6)}")
    elif op == "link":
        f = rng.choice(files)
        os.link(f, rng.choice(dirs) / f"h{rng.randrange(10**6)}")
    elif op == "symlink":
        os.symlink("../elsewhere", d / f"s{rng.randrange(10**6)}")
    elif op == "swap" and d != root:
        shutil.rmtree(d)
        d.write_text("now a file")


def scan_and_check(view: dict[str, tuple], gen: str) -> tuple[dict, dict[str, tuple], dict[str, tuple]]:
    """One incremental scan from ``gen``: ``view`` updated by it must be the tree a full
    walk sees, and no stat change may go unreported. Returns the scan, the new view and
    the full walk."""
    res = scan(gen)
    assert not res["full"]
    new = apply(view, res)
    truth = full_walk()
    assert new == truth
    assert {p for p, v in truth.items() if view.get(p) != v} <= {e[0] for e in res["entries"]}
    return res, new, truth


@pytest.mark.parametrize("seed", range(20))
def test_incremental_scan_matches_full_walk(root: Path, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(30):
        (root / f"a{i % 3}" / f"b{i % 5}").mkdir(parents=True, exist_ok=True)
        (root / f"a{i % 3}" / f"b{i % 5}" / f"x{i}").write_text(str(i))
    res = scan(None)
    assert res["full"] and res["watched"]
    view, gen = apply({}, res), res["generation"]
    for _round in range(25):
        for _ in range(rng.randrange(0, 6)):
            random_op(rng, root)
        before = view
        res, view, truth = scan_and_check(view, gen)
        gen = res["generation"]
        # Anything reported beyond the stat changes is a file written to in this round
        # (reported even with an unchanged stat, for the host to compare hashes).
        expected_changed = {p for p, v in truth.items() if before.get(p) != v}
        reported = {e[0] for e in res["entries"]}
        assert reported - expected_changed <= set(truth)
        assert set(res["removed"]) == set(before) - set(truth)


def test_quiet_tree_reports_nothing_and_is_incremental(root: Path) -> None:
    for i in range(200):
        (root / f"d{i % 10}").mkdir(exist_ok=True)
        (root / f"d{i % 10}" / f"f{i}").write_text("x")
    gen = scan(None)["generation"]
    res = scan(gen)
    assert res == {**res, "entries": [], "removed": [], "full": False, "watched": True}


def test_write_through_other_hard_link_is_seen(root: Path) -> None:
    (root / "a").mkdir()
    (root / "b").mkdir()
    (root / "a" / "f").write_text("one")
    os.link(root / "a" / "f", root / "b" / "g")
    gen = scan(None)["generation"]
    with open(root / "b" / "g", "a") as fh:  # an event in b only
        fh.write(" two")
    res = scan(gen)
    assert {e[0] for e in res["entries"]} == {"a/f", "b/g"}


def test_same_stat_rewrite_is_reported_as_touched(root: Path) -> None:
    f = root / "f"
    f.write_text("aaaa")
    st = f.stat()
    gen = scan(None)["generation"]
    f.write_text("bbbb")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: stat alone is blind
    res = scan(gen)
    assert [e[0] for e in res["entries"]] == ["f"]


def test_wrong_generation_or_params_fall_back_to_full_diff(root: Path) -> None:
    (root / "f").write_text("x")
    gen = scan(None)["generation"]
    (root / "g").write_text("y")
    res = scan("not-the-generation")
    assert res["full"]  # unknown base: the whole tree, the host diffs it itself
    res2 = scan(res["generation"], exclude=["node_modules"])
    assert res2["full"]
    assert gen != res["generation"]


def test_overflow_and_watch_budget_fall_back_to_full_walk(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(5):
        (root / f"d{i}").mkdir()
    monkeypatch.setattr(snapshot, "MAX_WATCHES", 3)
    res = scan(None)
    assert not res["watched"]  # more directories than the budget: plain walks, still correct
    (root / "d4" / "new").write_text("x")
    res = scan(res["generation"])
    assert [e[0] for e in res["entries"]] == ["d4/new"]
    assert not res["watched"]


def test_without_a_real_kernel_nothing_is_watched(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "subreaper", False)  # gVisor: host-side edits raise no event in the sandbox
    res = scan(None)
    assert not res["watched"]
    (root / "f").write_text("x")
    assert [e[0] for e in scan(res["generation"])["entries"]] == ["f"]
