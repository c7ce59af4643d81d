"""The scan after a command, for files the changelog itself wrote since the last scan: their
content is checked by hash (one request for all of them), not read again, and a command
that changed such a file is still recorded exactly."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import ExecRequest, Sandbox
from worker.changelog import Changelog
from worker.workspace import Workspace


@pytest.fixture
async def box(local_backend, workspace: Path) -> Sandbox:
    return await local_backend.get(workspace)


@pytest.fixture
async def ws(tmp_path: Path, workspace: Path, box: Sandbox) -> AsyncIterator[Workspace]:
    cl = Changelog.open(tmp_path / "data", workspace)
    yield Workspace(workspace, box, cl)
    await cl.aclose()


def counting(box: Sandbox, calls: list[str]) -> None:
    """Record the names of ``box``'s read and hash requests in ``calls``."""
    for name in ("read", "hash"):
        real = getattr(box, name)

        def wrapper(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls.append(_name)
            return _real(*args, **kw)

        setattr(box, name, wrapper)


async def baseline_row(ws: Workspace, path: str) -> tuple[Any, ...]:
    core = ws.recorder._core  # type: ignore[attr-defined]
    rows = await core.db(core.store.query, "SELECT size, mtime_ns, sha256, status FROM baseline WHERE path = ?", [path])
    assert len(rows) == 1
    return tuple(rows[0])


async def test_files_written_since_the_last_scan_are_hashed_not_read(ws: Workspace, workspace: Path) -> None:
    await ws.run_shell(ExecRequest("true"))  # the baseline
    await ws.write("a.txt", b"one", tool="write_file", call_id="w1")
    await ws.write("sub/b.txt", b"two", tool="write_file", call_id="w2")
    calls: list[str] = []
    counting(ws.sandbox, calls)
    result, changed = await ws.run_shell(ExecRequest("true"), call_id="s1")
    assert result.exit_code == 0 and changed == []
    assert calls == ["hash"]  # both files in one request, no read
    size, mtime_ns, sha, status = await baseline_row(ws, "a.txt")
    assert (size, sha, status) == (3, hashlib.sha256(b"one").hexdigest(), "ok")
    assert mtime_ns == (workspace / "a.txt").stat().st_mtime_ns  # the stat is known again
    assert await ws.recorder.log(call_id="s1") == []  # type: ignore[attr-defined]
    calls.clear()
    assert (await ws.run_shell(ExecRequest("true")))[1] == [] and "read" not in calls


async def test_a_command_that_changed_such_a_file_is_recorded(ws: Workspace, workspace: Path) -> None:
    await ws.run_shell(ExecRequest("true"))
    await ws.write("a.txt", b"abc", tool="write_file", call_id="w1")
    await ws.write("keep.txt", b"kept", tool="write_file", call_id="w2")
    # A same-size rewrite, as fast as the write before it: only the content tells.
    _result, changed = await ws.run_shell(ExecRequest("printf xyz > a.txt"), call_id="s1")
    assert changed == ["a.txt"]
    entries = await ws.recorder.log(call_id="s1")  # type: ignore[attr-defined]
    assert [(e.path, e.before_hash, e.after_hash) for e in entries] == [
        ("a.txt", hashlib.sha256(b"abc").hexdigest(), hashlib.sha256(b"xyz").hexdigest())
    ]
    await ws.recorder.undo(ws.sandbox, call_id="s1")  # type: ignore[attr-defined]
    assert (workspace / "a.txt").read_bytes() == b"abc"
    assert (workspace / "keep.txt").read_bytes() == b"kept"


async def test_rewriting_a_file_this_worker_wrote_reads_nothing(ws: Workspace, workspace: Path) -> None:
    await ws.write("a.txt", b"one", tool="write_file", call_id="w1")
    calls: list[str] = []
    counting(ws.sandbox, calls)
    await ws.write("a.txt", b"two", tool="write_file", call_id="w2")
    assert calls == []  # the before-image is the content this worker wrote: no read
    [entry] = await ws.recorder.log(call_id="w2")  # type: ignore[attr-defined]
    assert (entry.op, entry.before_hash) == ("modify", hashlib.sha256(b"one").hexdigest())
    await ws.recorder.undo(ws.sandbox, call_id="w2")  # type: ignore[attr-defined]
    assert (workspace / "a.txt").read_bytes() == b"one"


@pytest.mark.parametrize("outside", ["edit", "delete"])
async def test_a_wrong_guess_takes_the_general_path(ws: Workspace, workspace: Path, outside: str) -> None:
    """Changed behind the worker's back since its last write: nothing is written on the
    guess, the file is read and its real content recorded, the write succeeds."""
    await ws.write("a.txt", b"one", tool="write_file", call_id="w1")
    if outside == "edit":
        (workspace / "a.txt").write_bytes(b"from outside")
    else:
        (workspace / "a.txt").unlink()
    calls: list[str] = []
    counting(ws.sandbox, calls)
    await ws.write("a.txt", b"two", tool="write_file", call_id="w2")
    assert "read" in calls and (workspace / "a.txt").read_bytes() == b"two"
    [entry] = await ws.recorder.log(call_id="w2")  # type: ignore[attr-defined]
    if outside == "edit":
        assert (entry.op, entry.before_hash) == ("modify", hashlib.sha256(b"from outside").hexdigest())
    else:
        assert (entry.op, entry.before_hash) == ("create", None)
    await ws.recorder.undo(ws.sandbox, call_id="w2")  # type: ignore[attr-defined]
    if outside == "edit":
        assert (workspace / "a.txt").read_bytes() == b"from outside"
    else:
        assert not (workspace / "a.txt").exists()


async def test_a_command_keeps_what_it_did_not_change_remembered(ws: Workspace, workspace: Path) -> None:
    """What the worker wrote stays its guess across a command that left the file alone
    (the changelog saw every file the command changed), not across one that changed it."""
    await ws.run_shell(ExecRequest("true"))
    await ws.write("a.txt", b"one", tool="write_file", call_id="w1")
    await ws.write("b.txt", b"bee", tool="write_file", call_id="w2")
    assert (await ws.run_shell(ExecRequest("printf BEE > b.txt")))[1] == ["b.txt"]
    assert ws.known("a.txt") is not None and ws.known("b.txt") is None
    calls: list[str] = []
    counting(ws.sandbox, calls)
    await ws.write("a.txt", b"two", tool="write_file", call_id="w3")
    assert calls == []
    await ws.write("b.txt", b"bees", tool="write_file", call_id="w4")
    assert calls == ["read"]
    [entry] = await ws.recorder.log(call_id="w4")  # type: ignore[attr-defined]
    assert entry.before_hash == hashlib.sha256(b"BEE").hexdigest()


async def test_a_file_reported_again_unchanged_is_hashed_again_not_read(ws: Workspace, workspace: Path) -> None:
    """After a tool's write, a command that opens the file for writing and writes nothing
    (as gVisor's own late close of the file it wrote looks on the host) makes the scan
    report it with its stat unchanged: the content is checked by hash each time, never
    read back through the sandbox."""
    await ws.run_shell(ExecRequest("true"))
    await ws.write("a.txt", b"x" * 5000, tool="write_file", call_id="w1")
    calls: list[str] = []
    counting(ws.sandbox, calls)
    for _ in range(3):
        _result, changed = await ws.run_shell(ExecRequest(": >> a.txt"))
        assert changed == []
    assert "read" not in calls and calls.count("hash") >= 2, calls
    assert await ws.recorder.log() == await ws.recorder.log(call_id="w1")  # type: ignore[attr-defined]
