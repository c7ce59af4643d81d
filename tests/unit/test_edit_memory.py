"""The edit tool starts from remembered content without a read, and reads when in doubt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox.local import LocalProcessBackend
from worker import ToolRegistry
from worker.workspace import KNOWN_MAX_FILES


async def test_consecutive_edits_read_the_file_once(local_backend: LocalProcessBackend, workspace: Path) -> None:
    reg = ToolRegistry(backend=local_backend)
    (workspace / "f.txt").write_text("i = 0\n")
    ws = await reg.workspace(workspace)
    reads: list[str] = []
    real_read = ws.sandbox.read

    async def counting_read(path: str, **kw: Any) -> Any:
        reads.append(path)
        return await real_read(path, **kw)

    ws.sandbox.read = counting_read  # type: ignore[method-assign]
    for i in range(5):
        r = await reg.execute(
            "edit_file", {"path": "f.txt", "old_str": f"i = {i}", "new_str": f"i = {i + 1}"}, workspace
        )
        assert r.success, r.error
    assert reads == ["f.txt"]  # the first edit read it; the others started from what was written
    assert (workspace / "f.txt").read_text() == "i = 5\n"
    (workspace / "f.txt").write_text("i = 5\nj = 0\n")
    r = await reg.execute("edit_file", {"path": "f.txt", "old_str": "j = 0", "new_str": "j = 1"}, workspace)
    assert r.success and reads == ["f.txt", "f.txt"]  # stale memory: read again


async def test_memory_is_bounded(local_backend: LocalProcessBackend, workspace: Path) -> None:
    reg = ToolRegistry(backend=local_backend)
    for i in range(KNOWN_MAX_FILES + 10):
        r = await reg.execute("write_file", {"path": f"f{i}.txt", "content": "x" * 100}, workspace)
        assert r.success
    ws = await reg.workspace(workspace)
    assert len(ws._known) == KNOWN_MAX_FILES
    assert ws.known("f0.txt") is None and ws.known(f"f{KNOWN_MAX_FILES + 9}.txt") is not None
