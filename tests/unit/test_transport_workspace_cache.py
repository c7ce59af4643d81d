"""The registry remembers a workspace by the caller's own spelling of an absolute path,
so the per-call round trip does not resolve the path again (a few lstat calls each time);
the real-path map stays the source of truth and stop()/aclose() forget both."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.local import LocalProcessBackend
from worker import ToolRegistry
from worker.tool import ToolError


class ResolveCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = Path.resolve

        def counting(path: Path, strict: bool = False) -> Path:
            self.calls += 1
            return real(path, strict=strict)

        monkeypatch.setattr(Path, "resolve", counting)


@pytest.fixture
async def registry(local_backend: LocalProcessBackend) -> AsyncIterator[ToolRegistry]:
    reg = ToolRegistry(backend=local_backend)
    yield reg
    await reg.aclose()


async def test_second_call_with_the_same_path_does_not_resolve_again(
    registry: ToolRegistry, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "a.txt").write_text("hello\n")
    counter = ResolveCounter(monkeypatch)
    first = await registry.workspace(str(workspace))
    assert counter.calls >= 1
    before = counter.calls
    for arg in (str(workspace), workspace):  # a Path and its str are the same spelling
        assert await registry.workspace(arg) is first
    r = await registry.execute("read_file", {"path": "a.txt"}, str(workspace))
    assert r.success and r.output == "hello\n"
    assert counter.calls == before


async def test_other_spellings_of_the_same_directory_share_one_workspace(
    registry: ToolRegistry, workspace: Path
) -> None:
    (workspace / "sub").mkdir()
    link = workspace.parent / (workspace.name + "-link")
    link.symlink_to(workspace)
    try:
        a = await registry.workspace(workspace)
        b = await registry.workspace(f"{workspace}/sub/..")
        c = await registry.workspace(link)
        assert a is b is c and a.root == workspace
    finally:
        link.unlink()


async def test_relative_paths_are_resolved_on_every_call(
    registry: ToolRegistry, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path means something else after a chdir: never remembered as spelled."""
    other = workspace / "other"
    other.mkdir()
    (workspace / "w").mkdir()
    (other / "w").mkdir()
    monkeypatch.chdir(workspace)
    a = await registry.workspace("w")
    monkeypatch.chdir(other)
    b = await registry.workspace("w")
    assert a.root == workspace / "w" and b.root == other / "w"
    counter = ResolveCounter(monkeypatch)
    assert await registry.workspace("w") is b
    assert counter.calls == 1


async def test_stop_forgets_every_spelling(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    a = await registry.workspace(str(workspace))
    assert await registry.workspace(f"{workspace}/sub/..") is a
    box = await a.sandbox.info()  # a running agent
    assert await registry.stop(workspace) is True
    b = await registry.workspace(str(workspace))
    c = await registry.workspace(f"{workspace}/sub/..")
    assert b is not a and c is b
    assert (await b.sandbox.info()).pid != box.pid  # a fresh sandbox, not the stopped one


async def test_aclose_forgets_every_spelling(workspace: Path) -> None:
    backend = LocalProcessBackend()
    reg = ToolRegistry(backend=backend)
    a = await reg.workspace(str(workspace))
    await reg.aclose()
    assert await reg.workspace(str(workspace)) is not a
    await reg.aclose()


async def test_missing_directory_is_a_tool_error_and_not_remembered(registry: ToolRegistry, tmp_path: Path) -> None:
    missing = tmp_path / "later"
    with pytest.raises(ToolError, match="Workspace directory not found"):
        await registry.workspace(str(missing))
    r = await registry.execute("list_directory", {}, str(missing))
    assert not r.success and r.error is not None and "Workspace directory not found" in r.error
    missing.mkdir()
    ws = await registry.workspace(str(missing))
    assert ws.root == missing.resolve()


async def test_a_removed_workspace_is_not_resurrected_by_its_spelling(registry: ToolRegistry, tmp_path: Path) -> None:
    """After stop(), the directory is checked again: gone means ToolError, not the old one."""
    d = tmp_path / "ws"
    d.mkdir()
    await registry.workspace(str(d))
    await registry.stop(str(d))
    os.rmdir(d)
    with pytest.raises(ToolError, match="Workspace directory not found"):
        await registry.workspace(str(d))
