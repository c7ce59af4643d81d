"""The edit fast path: when the caller's expected content is already stored, the
changelog records without reading the file again, and the conditional write keeps the
record true: a stale expectation is a conflict with no entry, a link or a directory
falls back to the general path."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import ReadResult, Sandbox
from sandbox.errors import ConflictError, NotAFileError
from worker.changelog import Changelog


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class CountingSandbox:
    """Forwards to a real sandbox, counting reads."""

    def __init__(self, box: Sandbox) -> None:
        self._box = box
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._box, name)

    async def read(self, path: str, **kw: Any) -> ReadResult:
        self.reads += 1
        return await self._box.read(path, **kw)


@pytest.fixture
async def box(local_backend: Any, workspace: Path) -> AsyncIterator[Any]:
    yield CountingSandbox(await local_backend.get(workspace))


@pytest.fixture
async def cl(tmp_path: Path, workspace: Path) -> AsyncIterator[Changelog]:
    async with Changelog.open(tmp_path / "data", workspace) as c:
        yield c


async def test_edit_of_recorded_content_needs_no_second_read(cl: Changelog, box: Any, workspace: Path) -> None:
    await cl.write(box, "a.txt", b"one\n")
    os.chmod(workspace / "a.txt", 0o640)
    box.reads = 0
    await cl.write(box, "a.txt", b"two\n", expect_sha256=h(b"one\n"), tool="edit_file", call_id="e1")
    assert box.reads == 0
    log = await cl.log()
    assert [(e.op, e.state, e.before_hash, e.restorable) for e in log][-1] == ("modify", "applied", h(b"one\n"), True)
    assert log[-1].before_mode is not None and log[-1].before_mode & 0o777 == 0o640
    await cl.undo(box, call_id="e1")
    assert (workspace / "a.txt").read_bytes() == b"one\n"


async def test_stale_expectation_is_a_conflict_and_leaves_no_entry(cl: Changelog, box: Any, workspace: Path) -> None:
    await cl.write(box, "a.txt", b"one\n")
    (workspace / "a.txt").write_bytes(b"changed behind our back\n")
    with pytest.raises(ConflictError):
        await cl.write(box, "a.txt", b"two\n", expect_sha256=h(b"one\n"), tool="edit_file")
    assert (workspace / "a.txt").read_bytes() == b"changed behind our back\n"
    assert [e.op for e in await cl.log()] == ["create"]


async def test_deleted_file_is_a_conflict_and_leaves_no_entry(cl: Changelog, box: Any, workspace: Path) -> None:
    await cl.write(box, "a.txt", b"one\n")
    (workspace / "a.txt").unlink()
    with pytest.raises(ConflictError, match="no longer exists"):
        await cl.write(box, "a.txt", b"two\n", expect_sha256=h(b"one\n"))
    assert not (workspace / "a.txt").exists()
    assert [e.op for e in await cl.log()] == ["create"]


async def test_a_link_is_recorded_under_its_target(cl: Changelog, box: Any, workspace: Path) -> None:
    await cl.write(box, "real.txt", b"one\n")
    (workspace / "link.txt").symlink_to("real.txt")
    await cl.write(box, "link.txt", b"two\n", expect_sha256=h(b"one\n"))
    log = await cl.log()
    assert [(e.path, e.state) for e in log] == [("real.txt", "applied"), ("real.txt", "applied")]
    assert (workspace / "real.txt").read_bytes() == b"two\n" and (workspace / "link.txt").is_symlink()


async def test_a_directory_is_refused_without_an_entry(cl: Changelog, box: Any, workspace: Path) -> None:
    await cl.write(box, "d", b"one\n")
    (workspace / "d").unlink()
    (workspace / "d").mkdir()
    with pytest.raises(NotAFileError):
        await cl.write(box, "d", b"two\n", expect_sha256=h(b"one\n"))
    assert [e.op for e in await cl.log()] == ["create"]
