"""The agent's atomic replace: what stays on the caller's path and what moves after it.

The rename is answered before the directory's fsync and before the replaced file is
closed (both on the tidying thread), but the new content is fsync'd before the rename,
nothing leaks, and an agent that exits waits for the directories of its last writes.
The agent's modules run in this process, rooted at a temporary directory.
"""

from __future__ import annotations

import base64
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.agent import state, tidy, write


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(state, "ROOT", str(tmp_path))
    monkeypatch.setattr(state, "ROOT_FD", os.open(tmp_path, os.O_PATH | os.O_DIRECTORY))
    try:
        yield tmp_path
    finally:
        tidy.drain(5.0)
        os.close(state.ROOT_FD)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _write(path: str, data: bytes, **extra: Any) -> dict[str, Any]:
    req = {"path": path, "data": base64.b64encode(data).decode(), **extra}
    result: dict[str, Any] = write.op_write(req)
    return result


class _FsyncSpy:
    """Records every fsync (file or directory); directory fsyncs wait for ``release``."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[tuple[str, int]] = []
        self.release = threading.Event()
        self.dir_synced = threading.Event()

    def __call__(self, fd: int) -> None:
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        self.calls.append((kind, os.fstat(fd).st_ino))
        if kind == "dir":
            assert self.release.wait(10), "the test never released the directory fsync"
        self.real(fd)
        if kind == "dir":
            self.dir_synced.set()


def test_the_answer_comes_before_the_directory_fsync_and_after_the_files(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "sub").mkdir()
    (root / "sub" / "f.txt").write_bytes(b"old")
    spy = _FsyncSpy(os.fsync)
    monkeypatch.setattr(write.os, "fsync", spy)

    result = _write("sub/f.txt", b"new content")  # returns although the dir fsync is blocked

    assert (root / "sub" / "f.txt").read_bytes() == b"new content"
    assert result["sha256"] and result["created"] is False
    # The file's own fsync happened before the rename, on the caller's path.
    assert spy.calls and spy.calls[0][0] == "file"
    assert not spy.dir_synced.is_set()
    spy.release.set()
    assert spy.dir_synced.wait(10)
    assert ("dir", (root / "sub").stat().st_ino) in spy.calls


def test_no_fsync_at_all_when_the_caller_asks_for_process_safety_only(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "f.txt").write_bytes(b"old")
    spy = _FsyncSpy(os.fsync)
    spy.release.set()
    monkeypatch.setattr(write.os, "fsync", spy)
    _write("f.txt", b"new", fsync=False)
    tidy.drain(5.0)
    assert spy.calls == []
    assert (root / "f.txt").read_bytes() == b"new"


def test_replaced_files_are_released_and_nothing_leaks(root: Path) -> None:
    (root / "f.txt").write_bytes(b"0")
    _write("f.txt", b"warm-up")  # starts the tidying thread
    tidy.drain(5.0)
    before = _open_fds()
    for i in range(200):
        _write("f.txt", b"%d" % i * 100)
        _write(f"new-{i % 3}.txt", b"x")  # creates and replaces alike
    tidy.drain(5.0)
    assert _open_fds() == before
    assert (root / "f.txt").read_bytes() == b"199" * 100
    assert sorted(p.name for p in root.iterdir()) == ["f.txt", "new-0.txt", "new-1.txt", "new-2.txt"]


def test_the_replaced_file_is_held_across_the_rename_and_released_after(root: Path) -> None:
    """Freeing the old inode is what makes a replacing rename slow: the agent holds it
    open across the rename and lets the tidying thread close it."""
    (root / "f.txt").write_bytes(b"old" * 1000)
    old_ino = (root / "f.txt").stat().st_ino
    gate = threading.Event()
    tidy.later(lambda: gate.wait(10))  # the tidying thread is busy: what follows queues

    _write("f.txt", b"new")

    def holding() -> list[str]:
        out = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.stat(f"/proc/self/fd/{fd}").st_ino == old_ino:
                    out.append(fd)
            except OSError:
                pass
        return out

    assert (root / "f.txt").stat().st_ino != old_ino
    assert len(holding()) == 1  # still open, so the rename did not free it
    gate.set()
    tidy.drain(5.0)
    assert holding() == []


def test_a_staged_write_commits_with_the_same_deferral(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (root / "f.txt").write_bytes(b"old")
    spy = _FsyncSpy(os.fsync)
    monkeypatch.setattr(write.os, "fsync", spy)
    staged = _write("f.txt", b"staged", stage=True, token="t1")
    assert [k for k, _ in spy.calls] == ["file"]  # staged content is on disk before the commit
    assert (root / "f.txt").read_bytes() == b"old"
    write.op_commit({"staged": staged["staged"]})
    assert (root / "f.txt").read_bytes() == b"staged"
    assert not spy.dir_synced.is_set()
    spy.release.set()
    assert spy.dir_synced.wait(10)


def test_a_failed_rename_leaves_no_temporary_and_no_open_file(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (root / "f.txt").write_bytes(b"old")
    _write("f.txt", b"warm-up")
    tidy.drain(5.0)
    before = _open_fds()

    def refuse(*_a: Any, **_k: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(write.os, "rename", refuse)
    with pytest.raises(PermissionError):
        _write("f.txt", b"new")
    tidy.drain(5.0)
    assert _open_fds() == before
    assert sorted(p.name for p in root.iterdir()) == ["f.txt"]
    assert (root / "f.txt").read_bytes() == b"warm-up"


def test_an_exiting_agent_waits_for_its_last_directory_fsyncs(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (root / "f.txt").write_bytes(b"old")
    spy = _FsyncSpy(os.fsync)
    monkeypatch.setattr(write.os, "fsync", spy)
    _write("f.txt", b"new")
    threading.Timer(0.2, spy.release.set).start()
    tidy.drain(5.0)  # what _host_gone does before the agent ends
    assert spy.dir_synced.is_set()
