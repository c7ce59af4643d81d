"""A write the host records itself (the changelog's staged write, committed with the key
of its scan snapshot) is not handed back by that snapshot's next scan: a command after an
edit then runs at once, instead of being refused for the host to hash its own file first.
Everything that touches the path after the write still shows. The agent's modules run in
this process, rooted at a temporary directory, with inotify as on runc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.agent import scan as agent_scan
from sandbox.agent import write


@pytest.fixture
def root(agent_root: Path) -> Path:
    return agent_root


def scan(since: str | None, key: str = "k") -> dict:
    return agent_scan.op_scan({"path": ".", "snapshot": key, "since": since})


def staged_write(path: str, data: bytes, snapshot: str | None) -> dict:
    staged = write.op_write({"path": path, "data": data, "stage": True, "fsync": False})
    req = {"staged": staged["staged"]}
    if snapshot is not None:
        req["snapshot"] = snapshot
    return write.op_commit(req)


def changed(res: dict) -> set[str]:
    assert res["from_events"], res  # incremental, from inotify: what the test is about
    return {e[0] for e in res["entries"]} | set(res["removed"])


def test_a_recorded_write_is_not_reported_to_its_snapshot(root: Path) -> None:
    (root / "sub").mkdir()
    (root / "a.txt").write_text("old\n")
    (root / "sub" / "b.txt").write_text("old\n")
    gen = scan(None)["generation"]
    staged_write("a.txt", b"new content\n", "k")
    staged_write("sub/b.txt", b"new\n", "k")
    res = scan(gen)
    assert changed(res) == set()


def test_without_the_key_or_for_another_snapshot_it_is_reported(root: Path) -> None:
    (root / "a.txt").write_text("old\n")
    (root / "b.txt").write_text("old\n")
    gen_k, gen_other = scan(None)["generation"], scan(None, "other")["generation"]
    staged_write("a.txt", b"new\n", None)  # a write nobody records
    staged_write("b.txt", b"new\n", "k")
    assert changed(scan(gen_k)) == {"a.txt"}
    assert changed(scan(gen_other, "other")) == {"a.txt", "b.txt"}


def test_a_file_the_write_creates_is_taken_as_seen_in_a_known_directory(root: Path) -> None:
    (root / "sub").mkdir()
    gen = scan(None)["generation"]
    staged_write("new.txt", b"x\n", "k")
    staged_write("sub/new.txt", b"y\n", "k")
    assert changed(scan(gen)) == set()
    os.unlink(root / "sub" / "new.txt")  # and the snapshot knows it is there
    assert changed(scan(agent_scan._snapshots["k"].generation)) == {"sub/new.txt"}


def test_a_file_in_a_directory_the_snapshot_has_not_seen_is_reported(root: Path) -> None:
    gen = scan(None)["generation"]
    staged_write("made/new.txt", b"x\n", "k")  # the write makes the directory
    (root / "cmd").mkdir()  # a command made this one; its events are still queued
    staged_write("cmd/new.txt", b"y\n", "k")
    assert changed(scan(gen)) >= {"made", "made/new.txt", "cmd", "cmd/new.txt"}


@pytest.mark.parametrize("after", ["rewrite_same_size", "append", "rename_over", "chmod", "delete"])
def test_what_touches_the_path_after_the_write_still_shows(root: Path, after: str) -> None:
    p = root / "a.txt"
    p.write_text("old\n")
    gen = scan(None)["generation"]
    staged_write("a.txt", b"recorded\n", "k")
    if after == "rewrite_same_size":  # same size, same mtime tick: only the event tells
        st = p.stat()
        p.write_bytes(b"RECORDED\n")
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif after == "append":
        with p.open("ab") as fh:
            fh.write(b"more\n")
    elif after == "rename_over":
        other = root / "other.tmp"
        other.write_bytes(b"recorded\n")  # the same content and size, another inode
        os.rename(other, p)
    elif after == "chmod":
        p.chmod(0o600)
    else:
        p.unlink()
    assert "a.txt" in changed(scan(gen))


def test_changes_to_other_files_before_the_write_still_show(root: Path) -> None:
    # The write reads the queued events off early (to drop its own); the others must
    # reach the next scan, a same-size rewrite in the same mtime tick included.
    for name in ("a.txt", "c.txt", "d.txt"):
        (root / name).write_text("old\n")
    gen = scan(None)["generation"]
    (root / "c.txt").write_text("changed\n")
    d = root / "d.txt"
    st = d.stat()
    d.write_bytes(b"OLD\n")
    os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
    (root / "e.txt").write_text("new\n")
    staged_write("a.txt", b"recorded\n", "k")
    assert changed(scan(gen)) == {"c.txt", "d.txt", "e.txt"}


def test_a_durable_write_is_not_reported_either(root: Path) -> None:
    (root / "a.txt").write_text("old\n")
    gen = scan(None)["generation"]
    staged = write.op_write({"path": "a.txt", "data": b"new\n", "stage": True, "fsync": True})
    write.op_commit({"staged": staged["staged"], "snapshot": "k"})
    from sandbox.agent import tidy

    tidy.drain(5.0)  # the directory's fsync, on the tidying thread
    assert changed(scan(gen)) == set()


def test_the_commit_reports_the_stat_the_scans_will_see(root: Path) -> None:
    (root / "a.txt").write_text("old\n")
    res = staged_write("a.txt", b"new\n", None)
    st = os.lstat(root / "a.txt")
    assert res["stat"] == [st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode]


@pytest.mark.parametrize("sent", [[1, 2], [1, 2, 3, "4"], [1, 2, 3, True], [1, -2, 3, 4], {"size": 1}, "1 2 3 4"])
def test_the_host_refuses_a_malformed_stat(sent: object) -> None:
    from sandbox.answers import check_stat
    from sandbox.errors import ProtocolError

    assert check_stat(None) is None  # an older agent sends none
    assert check_stat([5, 6, 7, 0o100644]) == (5, 6, 7, 0o100644)
    with pytest.raises(ProtocolError):
        check_stat(sent)


@pytest.mark.parametrize("seed", range(16))
def test_the_hosts_view_stays_exact_under_random_changes_and_recorded_writes(root: Path, seed: int) -> None:
    """The host's view (the last scan, plus each recorded write's stat from the commit),
    updated by each incremental scan, must be the tree a full walk sees: a recorded write
    never hides what else happened, before or after it in the same round."""
    import random

    from tests.unit.test_agent_scan_watch import apply, full_walk, random_op, scan_and_check

    rng = random.Random(seed)
    for i in range(20):
        (root / f"a{i % 3}").mkdir(exist_ok=True)
        (root / f"a{i % 3}" / f"x{i}").write_text(str(i))
    res = scan(None)
    view, gen = apply({}, res), res["generation"]
    for _round in range(25):
        for _ in range(rng.randrange(0, 6)):
            if rng.random() < 0.5:
                random_op(rng, root)
                continue
            files = [p for p, v in full_walk().items() if v[0] == "file"]
            dirs = [p for p, v in full_walk().items() if v[0] == "dir"]
            path = (
                rng.choice(files) if files and rng.random() < 0.6 else f"{rng.choice([*dirs, ''])}/k{rng.randrange(99)}"
            )
            path = path.lstrip("/")
            try:
                st = staged_write(path, os.urandom(rng.randrange(0, 32)), "k")["stat"]
            except Exception:
                continue  # refused (a link, a directory in the way): nothing written
            view = {**view, path: ("file", st[0], st[1], st[2], st[3])}
            for p in [p for p in view if p.startswith(path + "/")]:
                del view[p]
        before = view
        res, view, truth = scan_and_check(view, gen)
        gen = res["generation"]
        assert set(res["removed"]) >= set(before) - set(truth)
