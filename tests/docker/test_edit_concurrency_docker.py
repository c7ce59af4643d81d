"""Concurrent edits of one file on the real engine, runc and gVisor (issue 24, item 4):
50 distinct edits sent at once through the registry and through HTTP all succeed, the file
holds all 50, the changelog has 50 entries and undoing them all restores the original; a
shell command that changes the file between an edit's read and its write is still a
conflict. The same flows on the local agent: tests/unit/test_edit_concurrency.py."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from sandbox.base import ExecRequest
from sandbox.docker import DockerBackend
from worker.http import create_app
from worker.http.changelog import ChangelogPool
from worker.registry import ToolRegistry
from worker.settings import Settings

N = 50
ORIGINAL = "".join(f"line {i:02d}: old\n" for i in range(N))
EXPECTED = "".join(f"line {i:02d}: new {i}\n" for i in range(N))
TOKEN = "edit-token"


def edit(i: int, path: str = "a.txt") -> dict[str, Any]:
    return {"path": path, "old_str": f"line {i:02d}: old", "new_str": f"line {i:02d}: new {i}"}


@asynccontextmanager
async def recording(backend: DockerBackend, data: Path) -> AsyncIterator[tuple[ToolRegistry, ChangelogPool]]:
    pool = ChangelogPool(data)
    reg = ToolRegistry(backend=backend, recorder_factory=pool.recorder)
    try:
        yield reg, pool
    finally:
        await pool.aclose()


async def test_fifty_concurrent_edits_through_the_registry(
    runtime_backend: DockerBackend, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "a.txt").write_text(ORIGINAL)
    async with recording(runtime_backend, tmp_path / "data") as (reg, pool):
        assert (await reg.execute("shell_execute", {"command": "true"}, workspace)).success  # started
        results = await asyncio.gather(*(reg.execute("edit_file", edit(i), workspace) for i in range(N)))
        assert [r.error for r in results if not r.success] == []
        assert (workspace / "a.txt").read_text() == EXPECTED
        cl = pool.recorder(workspace)
        entries = await cl.log()
        assert [e.tool for e in entries] == ["edit_file"] * N and {e.path for e in entries} == {"a.txt"}
        undone = await cl.undo((await reg.workspace(workspace)).sandbox, all=True)
        assert sorted(undone.reverted) == sorted(e.id for e in entries)
        assert (workspace / "a.txt").read_text() == ORIGINAL


async def test_one_file_by_three_names_takes_turns(
    runtime_backend: DockerBackend, workspace: Path, tmp_path: Path
) -> None:
    """The file, a link to its directory, and an absolute link into /workspace: one file,
    so its edits take turns whatever name they use."""
    (workspace / "real").mkdir()
    (workspace / "real" / "a.txt").write_text(ORIGINAL)
    os.symlink("real", workspace / "alias")
    os.symlink("/workspace/real/a.txt", workspace / "abs.txt")
    names = ["real/a.txt", "alias/a.txt", "abs.txt"]
    async with recording(runtime_backend, tmp_path / "data") as (reg, pool):
        results = await asyncio.gather(*(reg.execute("edit_file", edit(i, names[i % 3]), workspace) for i in range(N)))
        assert [r.error for r in results if not r.success] == []
        assert (workspace / "real" / "a.txt").read_text() == EXPECTED
        entries = await pool.recorder(workspace).log()
        assert len(entries) == N and {e.path for e in entries} == {"real/a.txt"}


async def test_a_command_between_read_and_write_is_a_conflict(
    runtime_backend: DockerBackend, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "a.txt").write_text(ORIGINAL)
    async with recording(runtime_backend, tmp_path / "data") as (reg, pool):
        ws = await reg.workspace(workspace)
        real_read = ws.sandbox.read
        interfere = True

        async def read_then_change(path: str, **kw: Any) -> Any:
            nonlocal interfere
            out = await real_read(path, **kw)
            if interfere:  # a command in the sandbox, not through the tools: from outside
                interfere = False
                r = await ws.sandbox.exec(ExecRequest("echo 'from outside' >> a.txt", timeout=10))
                assert r.exit_code == 0
            return out

        ws.sandbox.read = read_then_change  # type: ignore[method-assign]
        r = await reg.execute("edit_file", edit(0), workspace)
        assert not r.success and r.error is not None and "Conflict: a.txt changed since it was read" in r.error
        assert (workspace / "a.txt").read_text() == ORIGINAL + "from outside\n"
        r = await reg.execute("edit_file", edit(1), workspace)  # edits what is there now
        assert r.success, r.error
        text = (workspace / "a.txt").read_text()
        assert text.endswith("from outside\n") and "line 01: new 1" in text and "line 00: old" in text
        assert [e.tool for e in await pool.recorder(workspace).log()] == ["edit_file"]


async def test_fifty_concurrent_edits_through_http(runtime_backend: DockerBackend, tmp_path: Path) -> None:
    async with recording(runtime_backend, tmp_path / "data") as (reg, _pool):
        settings = Settings(workspace_root=tmp_path / "root", api_token=TOKEN, data_dir=tmp_path / "data")
        app = create_app(settings, reg)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=headers) as c:
                r = await c.post("/v1/workspaces", json={"name": "w"})
                assert r.status_code == 201, r.text
                ws = Path(r.json()["path"])
                (ws / "a.txt").write_text(ORIGINAL)
                answers = await asyncio.gather(
                    *(
                        c.post(
                            "/v1/workspaces/w/execute", json={"tool": "edit_file", "arguments": edit(i)}, timeout=120
                        )
                        for i in range(N)
                    )
                )
                assert [a.status_code for a in answers] == [200] * N
                assert [a.json()["error"] for a in answers if not a.json()["success"]] == []
                assert (ws / "a.txt").read_text() == EXPECTED
                log = await c.get("/v1/workspaces/w/changelog")
                assert log.status_code == 200 and [e["tool"] for e in log.json()] == ["edit_file"] * N
                undo = await c.post("/v1/workspaces/w/undo", json={"all": True}, timeout=120)
                assert undo.status_code == 200, undo.text
                assert (ws / "a.txt").read_text() == ORIGINAL
