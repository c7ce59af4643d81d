"""The agent's walks at any depth (issue 38): the change scan, the host-side scan of a
gVisor workspace, tree removal and listing take a tree far deeper than Python's
recursion limit and than PATH_MAX, with a bounded number of descriptors."""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.agent import dirstack, listing, scanwalk, tree
from sandbox.hostscan import HostScanner

DEPTH = 5000


def _make_chain(root: Path, depth: int, name: str = "d") -> None:
    """``root/name/name/...`` ``depth`` levels deep with a file at each level, made from
    descriptors (the path is longer than PATH_MAX)."""
    cur = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=cur)
            os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=cur))
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
            os.close(cur)
            cur = nxt
        os.symlink("..", "up", dir_fd=cur)  # a loop: never followed
    finally:
        os.close(cur)


@pytest.fixture
def few_fds() -> Iterator[None]:
    """256 descriptors more than the process holds now (a whole test run holds many): a
    walk holding a descriptor per level would run out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 256, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_scan_list_and_remove_a_tree_5000_levels_deep(tmp_path: Path, few_fds: None) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _make_chain(ws, DEPTH)
    scanner = HostScanner(ws)
    try:
        first = scanner.scan({"path": ".", "snapshot": "k", "max_files": 10**6})
        paths = {e[0] for e in first["entries"]}
        assert len(paths) == 2 * DEPTH + 1
        deepest = "/".join(["d"] * DEPTH) + "/up"
        assert deepest in paths and len(deepest) > 4096
        kinds = {e[0]: e[1] for e in first["entries"]}
        assert kinds[deepest] == "symlink"
        again = scanner.scan({"path": ".", "snapshot": "k", "max_files": 10**6, "since": first["generation"]})
        assert again["entries"] == [] and again["removed"] == []
    finally:
        scanner.close()

    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        seen: list[str] = []
        counter = [0, False]
        listing.walk(fd, "", 1, None, set(), lambda e, rel, d, is_dir: seen.append(rel), counter, 10**7)
        assert len(seen) == 2 * DEPTH + 1 and seen[0] == "d"
        counts = [0, 0, 0]
        tree.rmtree_at(fd, "d", counts)
        assert counts[:2] == [DEPTH, DEPTH]  # DEPTH - 1 files and the link; DEPTH directories
        assert os.listdir(ws) == ["f"]
    finally:
        os.close(fd)


def test_a_scan_does_not_enter_a_directory_past_its_path_bound(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _make_chain(ws, 300, name="n" * 250)  # 75,300 characters deep
    out: dict = {}
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert scanwalk.walk(fd, "", set(), out, 10**6) is False
    finally:
        os.close(fd)
    assert max(len(p) for p in out) < scanwalk.MAX_PATH + 256
    assert any(len(p) > scanwalk.MAX_PATH - 256 for p in out)


def test_a_reopened_level_must_be_the_directory_the_walk_entered(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _make_chain(ws, 100)
    held = len(os.listdir("/proc/self/fd"))
    base = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    stack = dirstack.DirStack(base)
    try:
        for _ in range(90):
            stack.push("d")
        assert len(os.listdir("/proc/self/fd")) - held < 80  # not one descriptor per level
        # Level 66 (closed: neither near the top nor pinned) swapped for another directory.
        level65 = ws.joinpath(*["d"] * 65)
        os.rename(level65 / "d", level65 / "moved")
        os.mkdir(level65 / "d")
        while len(stack) > 70:
            stack.pop()
        with pytest.raises(OSError) as err:
            stack.fd()
        assert err.value.errno == errno.ESTALE
    finally:
        stack.close()
        os.close(base)
