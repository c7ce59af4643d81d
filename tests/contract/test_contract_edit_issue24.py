"""``edit_file`` on every backend and image (issue 24): an empty ``old_str`` creates a
missing file and is refused on an existing one, with nothing changed; 50 distinct edits of
one file sent at once all succeed. (With the changelog and over HTTP:
tests/docker/test_edit_concurrency_docker.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from worker import ToolRegistry

N = 50

REFUSALS: list[dict[str, Any]] = [
    {"old_str": "", "new_str": "X"},
    {"edits": [{"old_str": "", "new_str": "X"}]},
    {"edits": [{"old_str": "", "new_str": "X", "replace_all": True}]},
    {"edits": [{"old_str": "a", "new_str": "A"}, {"old_str": "", "new_str": "X", "replace_all": True}]},
]


async def test_empty_old_str_is_refused_on_an_existing_file(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "a.txt").write_text("abc")
    for remembered in (False, True):
        if remembered:
            assert (await registry.execute("read_file", {"path": "a.txt"}, workspace)).success
        for args in REFUSALS:
            r = await registry.execute("edit_file", {"path": "a.txt", **args}, workspace)
            assert not r.success and r.error is not None, args
            assert "old_str is empty, but a.txt already exists" in r.error, r.error
            assert "non-empty old_str" in r.error and "write_file" in r.error
            assert (workspace / "a.txt").read_bytes() == b"abc"
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt"]  # no temporary left


async def test_empty_old_str_creates_a_missing_file(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("edit_file", {"path": "new/b.txt", "old_str": "", "new_str": "hello\n"}, workspace)
    assert r.success and r.data is not None and r.data["created"] is True, r.error
    assert (workspace / "new" / "b.txt").read_text() == "hello\n"
    edits = [{"old_str": "", "new_str": "x"}, {"old_str": "", "new_str": "y"}]
    r = await registry.execute("edit_file", {"path": "c.txt", "edits": edits}, workspace)
    assert not r.success and not (workspace / "c.txt").exists()


async def test_fifty_concurrent_edits_of_one_file(registry: ToolRegistry, workspace: Path) -> None:
    original = "".join(f"line {i:02d}: old\n" for i in range(N))
    (workspace / "a.txt").write_text(original)
    calls = [
        registry.execute(
            "edit_file", {"path": "a.txt", "old_str": f"line {i:02d}: old", "new_str": f"line {i:02d}: new"}, workspace
        )
        for i in range(N)
    ]
    results = await asyncio.gather(*calls)
    assert [r.error for r in results if not r.success] == []
    assert (workspace / "a.txt").read_text() == original.replace(": old", ": new")
