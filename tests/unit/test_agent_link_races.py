"""A process in the sandbox swapping a link for a file (and back) while the agent reads
it: ``stat`` and path resolution look again instead of failing on readlink's EINVAL
(CI saw a shell command fail with "Invalid argument: f1.txt" when its changelog scan
stat'ed a link a racer had just replaced). The agent's modules run in this process."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sandbox.agent import files, paths
from sandbox.agent.errors import Refused


def _swapper(root: Path, name: str, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        n = 0
        while not stop.is_set():
            x = root / ".racer"
            try:
                if n % 2:
                    x.symlink_to("target.txt")
                else:
                    os.link(root / "other.txt", x)
                os.rename(x, root / name)
            except OSError:
                x.unlink(missing_ok=True)
            n += 1

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_stat_of_a_link_swapped_for_a_file_never_fails_with_einval(agent_root: Path) -> None:
    root = agent_root
    (root / "target.txt").write_text("t")
    (root / "other.txt").write_text("o")
    (root / "f.txt").symlink_to("target.txt")
    stop = threading.Event()
    t = _swapper(root, "f.txt", stop)
    seen: dict[str, int] = {}
    try:
        # 3,000 looks at least, and on until both kinds were seen: on a loaded machine the
        # racer thread may not get the interpreter for a whole batch of them.
        for i in range(300_000):
            if i >= 3000 and seen.get("symlink") and seen.get("file"):
                break
            try:
                r = files.op_stat({"path": "f.txt"})
            except Refused as e:
                assert e.code == "conflict", e.message  # swapped to and fro eight times
                seen["conflict"] = seen.get("conflict", 0) + 1
                continue
            # Whatever it reports is consistent: a link with its target, or a file without.
            assert (r["type"] == "symlink") == (r["target"] is not None), r
            if r["type"] == "symlink":
                assert r["target"] == "target.txt"
            seen[r["type"]] = seen.get(r["type"], 0) + 1
    finally:
        stop.set()
        t.join()
    assert seen.get("symlink") and seen.get("file"), seen


def test_resolving_through_a_link_swapped_for_a_file_looks_again(agent_root: Path) -> None:
    root = agent_root
    (root / "d").mkdir()
    (root / "d" / "x").write_text("x")
    (root / "target.txt").write_text("t")
    (root / "other.txt").write_text("o")
    (root / "f.txt").symlink_to("target.txt")
    stop = threading.Event()
    t = _swapper(root, "f.txt", stop)
    try:
        for _ in range(3000):
            try:
                fd, name, parts, st = paths.resolve("f.txt")
            except Refused as e:  # only the hop limit, never an OSError
                assert e.code == "escape" and "Too many levels" in e.message, e.message
                continue
            os.close(fd)
            assert parts in (["target.txt"], ["f.txt"]) and name == parts[-1] and st is not None
    finally:
        stop.set()
        t.join()


def test_read_link_answers_none_for_what_is_no_longer_a_link(agent_root: Path) -> None:
    root = agent_root
    (root / "file").write_text("x")
    (root / "link").symlink_to("file")
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        assert paths.read_link("link", fd) == "file"
        assert paths.read_link("file", fd) is None
        assert paths.read_link("gone", fd) is None
    finally:
        os.close(fd)
