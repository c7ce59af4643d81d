"""edit_file starting from remembered content (what this worker last wrote or wholly
read): never a different result from reading the file first. Every test changes the file
behind the worker's back between two calls, on the local agent and the Docker sandbox."""

from __future__ import annotations

from pathlib import Path

from worker import ToolRegistry


async def edit(reg: ToolRegistry, ws: Path, old: str, new: str, path: str = "f.txt") -> object:
    return await reg.execute("edit_file", {"path": path, "old_str": old, "new_str": new}, ws)


async def test_outside_change_is_edited_not_overwritten(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "f.txt").write_text("a = 1\nb = 2\n")
    assert (await edit(registry, workspace, "a = 1", "a = 10")).success
    (workspace / "f.txt").write_text("a = 10\nb = 2\nc = 3\n")  # changed outside the worker
    r = await edit(registry, workspace, "b = 2", "b = 20")
    assert r.success, r.error
    assert (workspace / "f.txt").read_text() == "a = 10\nb = 20\nc = 3\n"


async def test_text_only_in_the_remembered_content_is_not_found(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "f.txt").write_text("x = 1\n")
    assert (await registry.execute("read_file", {"path": "f.txt"}, workspace)).success
    (workspace / "f.txt").write_text("y = 1\n")
    r = await edit(registry, workspace, "x = 1", "x = 2")
    assert not r.success and "not found" in (r.error or "")
    assert (workspace / "f.txt").read_text() == "y = 1\n"


async def test_unchanged_is_judged_on_the_file(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "f.txt").write_text("k = 1\n")
    assert (await edit(registry, workspace, "k = 1", "k = 2")).success
    (workspace / "f.txt").write_text("k = 1\n")  # reverted outside
    r = await edit(registry, workspace, "k = 1", "k = 2")
    assert r.success and "Edited" in r.output
    assert (workspace / "f.txt").read_text() == "k = 2\n"


async def test_deleted_or_replaced_outside(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "f.txt").write_text("v = 1\n")
    assert (await edit(registry, workspace, "v = 1", "v = 2")).success
    (workspace / "f.txt").unlink()
    r = await edit(registry, workspace, "v = 2", "v = 3")
    assert not r.success and "not found" in (r.error or "").lower()
    (workspace / "f.txt").mkdir()
    r = await edit(registry, workspace, "v = 2", "v = 3")
    assert not r.success and "Not a file" in (r.error or "")


async def test_shell_changes_are_seen_by_the_next_edit(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "f.txt").write_text("n = 1\n")
    assert (await edit(registry, workspace, "n = 1", "n = 2")).success
    r = await registry.execute("shell_execute", {"command": "echo 'm = 5' >> f.txt"}, workspace)
    assert r.success
    assert (await edit(registry, workspace, "m = 5", "m = 6")).success
    assert (workspace / "f.txt").read_text() == "n = 2\nm = 6\n"
