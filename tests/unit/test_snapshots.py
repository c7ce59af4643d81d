"""Snapshots, forks and restore on the in-process backend (no Docker): the store, lineage,
limits, restore recorded in the changelog and undone, the HTTP routes. The same on the
real engine under runc and gVisor: tests/docker/test_snapshots_docker.py."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.treehash import tree_diff, tree_hash, tree_state
from worker.changelog import Changelog
from worker.registry import ToolRegistry
from worker.snapshots import (
    Limits,
    SnapshotInUseError,
    SnapshotLimitError,
    SnapshotNotFoundError,
    Snapshots,
    strategy,
)
from worker.workspace_settings import Caps, Configs, SettingsStore

TINYCALC = Path(__file__).resolve().parents[1] / "fixtures" / "tinycalc"


@pytest.fixture
async def reg(tmp_path: Path, local_backend: Any) -> AsyncIterator[ToolRegistry]:
    data = tmp_path / "data"
    opened: list[Changelog] = []

    def recorder(root: Path) -> Changelog:
        cl = Changelog.open(data, root, durability="process")
        opened.append(cl)
        return cl

    configs = Configs(SettingsStore(data), {"image": "loom-sandbox:latest"}, Caps())
    registry = ToolRegistry(backend=local_backend, recorder_factory=recorder, configs=configs)
    try:
        yield registry
    finally:
        await registry.aclose()
        for cl in opened:
            await cl.aclose()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    ws = tmp_path / "ws" / "proj"
    shutil.copytree(TINYCALC, ws, symlinks=True)
    (ws / "data").mkdir()
    (ws / "data" / "blob.bin").write_bytes(os.urandom(5000))
    os.symlink("tinycalc/ops.py", ws / "ops-link")
    os.chmod(ws / "data", 0o750)
    return ws


def snaps_of(reg: ToolRegistry, tmp_path: Path, **limits: Any) -> Snapshots:
    return Snapshots(reg, tmp_path / "data", Limits(**limits))


async def sh(reg: ToolRegistry, ws: Path, command: str) -> Any:
    r = await reg.execute("shell_execute", {"command": command}, ws)
    assert r.success, r.output
    return r


async def test_fork_is_independent_and_carries_settings(reg: ToolRegistry, project: Path, tmp_path: Path) -> None:
    await reg.configure_workspace(project, {"memory": "512m", "env": {"MODE": "eval"}, "egress": ["pypi"]})
    snaps = snaps_of(reg, tmp_path)
    await sh(reg, project, "echo prepared > state.txt")
    snap = await snaps.create(project, "prepared")
    assert snap.strategy == "copy"  # ext4 / tmpfs here: no reflink
    assert snap.files >= 9 and snap.changelog_entry >= 1
    want = tree_hash(project)
    forks = await snaps.fork(snap.id, 3)
    assert [f.parent for f in forks] == [project.parent] * 3
    assert all(tree_hash(f) == want for f in forks)
    for i, f in enumerate(forks):
        await sh(reg, f, f"echo fork{i} >> tinycalc/ops.py && rm state.txt")
    assert tree_hash(project) == want
    assert len({tree_hash(f) for f in forks}) == 3
    for f in forks:  # settings and the egress policy carried over
        own, _eff = await reg.workspace_settings(f)
        assert own.memory == "512m" and own.env == {"MODE": "eval"} and own.egress == ["pypi"]
    ws = await reg.workspace(forks[0])
    assert isinstance(ws.recorder, Changelog)
    origin = await ws.recorder.origin()
    assert origin is not None and origin["snapshot"] == snap.id and origin["entry"] == snap.changelog_entry
    log = await ws.recorder.log()
    assert {e.path for e in log} == {"tinycalc/ops.py", "state.txt"}  # its history starts at the snapshot


async def test_lineage_fork_of_fork_and_delete(reg: ToolRegistry, project: Path, tmp_path: Path) -> None:
    snaps = snaps_of(reg, tmp_path)
    s1 = await snaps.create(project)
    (f1,) = await snaps.fork(s1.id)
    await sh(reg, f1, "echo one > one.txt")
    s2 = await snaps.create(f1, "child")
    assert s2.parent == s1.id
    (f2,) = await snaps.fork("child", workspace=f1)
    assert (f2 / "one.txt").read_text() == "one\n"
    shown = await snaps.get(s1.id)
    assert shown.live_forks == [str(f1)] and shown.children == [s2.id]
    with pytest.raises(SnapshotInUseError) as refused:
        await snaps.delete(s1.id)
    assert refused.value.forks == [str(f1)]
    assert (snaps.index.directory(s1.id) / "tree").is_dir()
    left = await snaps.delete(s1.id, force=True)
    assert left == [str(f1)]
    assert not snaps.index.directory(s1.id).exists()
    assert tree_hash(f1) != tree_hash(project) and (f1 / "one.txt").exists()  # the fork stays
    with pytest.raises(SnapshotNotFoundError):
        await snaps.fork(s1.id)
    assert [s.id for s in await snaps.list(project, deleted=True)] == [s1.id]
    shutil.rmtree(f2)
    await snaps.delete(s2.id)  # its only fork is gone: no longer in use


async def test_restore_is_exact_and_undone(reg: ToolRegistry, project: Path, tmp_path: Path) -> None:
    snaps = snaps_of(reg, tmp_path)
    await sh(reg, project, "python3 -m compileall -q tinycalc")  # a __pycache__ before
    snap = await snaps.create(project)
    want = tree_state(project)
    # A session: edits, a build, deletions, modes, links, a file that becomes a directory.
    await sh(
        reg,
        project,
        "echo '# edit' >> tinycalc/ops.py && mkdir -p build/lib && cp tinycalc/*.py build/lib/ "
        "&& rm -r tinycalc/__pycache__ && python3 -m compileall -q build && rm README.md "
        "&& chmod 700 data && chmod +x tinycalc/cli.py && ln -sfn tinycalc/cli.py ops-link "
        "&& rm data/blob.bin && mkdir data/blob.bin && echo x > data/blob.bin/inner",
    )
    before = tree_state(project)
    dry = await snaps.restore(project, snap.id, dry_run=True)
    assert "README.md" in dry.plan.created and "build" in dry.plan.removed and "# edit" in dry.plan.diff
    assert tree_state(project) == before  # a dry run changes nothing
    done = await snaps.restore(project, snap.id)
    assert done.plan.failed == []
    assert tree_state(project) == want, tree_diff(want, tree_state(project))
    ws = await reg.workspace(project)
    assert isinstance(ws.recorder, Changelog)
    entries = await ws.recorder.log(call_id=done.call_id)
    assert entries and all(e.tool == "restore" and e.restorable for e in entries)
    await sh(reg, project, "true")  # a later scan records nothing more of it
    assert len(await ws.recorder.log(call_id=done.call_id)) == len(entries)
    undone = await ws.recorder.undo(ws.sandbox, call_id=done.call_id)
    assert not undone.failed, undone.failed
    assert tree_state(project) == before, tree_diff(before, tree_state(project))
    again = await snaps.restore(project, snap.id)  # restore once more, then nothing left to do
    assert tree_state(project) == want
    assert (await snaps.restore(project, snap.id, dry_run=True)).plan.as_dict()["entries"] == []
    assert again.call_id != done.call_id


async def test_limits_refuse_cleanly(reg: ToolRegistry, project: Path, tmp_path: Path) -> None:
    snaps = snaps_of(reg, tmp_path, max_snapshots=1)
    await snaps.create(project)
    with pytest.raises(SnapshotLimitError, match="LOOM_MAX_SNAPSHOTS"):
        await snaps.create(project)
    small = snaps_of(reg, tmp_path, max_bytes=100)
    other = tmp_path / "ws" / "other"
    shutil.copytree(TINYCALC, other)
    with pytest.raises(SnapshotLimitError, match="LOOM_MAX_SNAPSHOT_BYTES"):
        await small.create(other)
    assert len(list((tmp_path / "data" / "snapshots").glob("snap-*"))) == 1  # nothing half-made
    with pytest.raises(ValueError):
        await snaps.fork((await snaps.list(project))[0].id, 0)


def test_strategy_falls_back_and_removes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("x")
    os.symlink("/etc/passwd", src / "link")
    made = strategy.capture(src, tmp_path / "copy", prefer="reflink")
    # No reflinks on this filesystem unless it is XFS or btrfs: then a plain copy.
    assert made.strategy in ("reflink", "copy")
    assert tree_hash(made.path) == tree_hash(src)
    assert os.readlink(made.path / "link") == "/etc/passwd"  # a link copied, never followed
    os.chmod(made.path / "d", 0o500)
    strategy.remove(made.path)
    assert not made.path.exists() and (src / "d" / "f").exists()


# -- HTTP --------------------------------------------------------------------------------


async def test_http_routes(tmp_path: Path, local_backend: Any) -> None:
    from tests.unit.test_http import running
    from worker.http.changelog import ChangelogPool

    pool = ChangelogPool(tmp_path / "data")
    configs = Configs(SettingsStore(tmp_path / "data"), {"image": "loom-sandbox:latest"}, Caps())
    registry = ToolRegistry(backend=local_backend, recorder_factory=pool.recorder, configs=configs)
    try:
        async with running(tmp_path / "root", registry, data_dir=tmp_path / "data") as s:
            c: httpx.AsyncClient = s.client
            path = await s.workspace("w1")
            await s.execute("w1", "write_file", path="a.txt", content="one\n")
            r = await c.post("/v1/workspaces/w1/snapshots", json={"name": "base"})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            assert (await c.post("/v1/workspaces/w1/snapshots", json={"name": "bad name"})).status_code == 422
            r = await c.post("/v1/workspaces/w1/fork", json={"snapshot": "base", "count": 2})
            assert r.status_code == 201, r.text
            forks = r.json()["workspaces"]
            assert len(forks) == 2 and all(Path(f["path"]).parent == path.parent for f in forks)
            fid = forks[0]["id"]
            await s.execute(fid, "write_file", path="a.txt", content="two\n")
            assert (path / "a.txt").read_text() == "one\n"
            r = await c.get(f"/v1/workspaces/{fid}/snapshots")
            assert r.json()["origin"]["snapshot"] == sid
            r = await c.post(f"/v1/workspaces/{fid}/restore", json={"snapshot": sid, "dry_run": True})
            assert r.status_code == 200 and "+two" not in r.json()["diff"] and "-two" in r.json()["diff"]
            r = await c.post(f"/v1/workspaces/{fid}/restore", json={"snapshot": sid})
            call_id = r.json()["call_id"]
            assert (Path(forks[0]["path"]) / "a.txt").read_text() == "one\n"
            r = await c.post(f"/v1/workspaces/{fid}/undo", json={"call_id": call_id})
            assert r.status_code == 200, r.text
            assert (Path(forks[0]["path"]) / "a.txt").read_text() == "two\n"
            r = await c.delete(f"/v1/workspaces/w1/snapshots/{sid}")
            assert r.status_code == 409 and len(r.json()["forks"]) == 2
            r = await c.delete(f"/v1/workspaces/w1/snapshots/{sid}?force=true")
            assert r.status_code == 200 and len(r.json()["left"]) == 2
            assert (await c.get(f"/v1/workspaces/w1/snapshots/{sid}")).status_code == 404
            assert (await c.post("/v1/workspaces/w1/restore", json={"snapshot": "nope"})).status_code == 404
            assert (await c.post("/v1/workspaces/w1/fork", json={"count": 0})).status_code == 422
            r = await c.post("/v1/workspaces/w1/fork", json={"count": 1})  # from the live workspace
            assert r.status_code == 201 and r.json()["snapshot"] != sid
            r = await c.get("/v1/workspaces/w1/snapshots", headers={"Authorization": ""})
            assert r.status_code == 401
    finally:
        await pool.aclose()


# -- MCP (orchestrator tools) ------------------------------------------------------------


async def test_mcp_snapshot_tools_for_an_orchestrator(reg: ToolRegistry, project: Path, tmp_path: Path) -> None:
    import json

    from mcp import Client

    from worker.mcp_server import build_server
    from worker.metrics import Metrics
    from worker.service import CallRunner
    from worker.snapshots.mcp_tools import OrchestratorTools

    snaps = snaps_of(reg, tmp_path)
    extra = OrchestratorTools(snaps, project)
    plain = build_server(reg, CallRunner(reg, Metrics()), lambda _ctx: project)
    async with Client(plain) as client:  # the agent's own server: no way to fork itself
        names = {t.name for t in (await client.list_tools()).tools}
        assert "workspace_fork" not in names and "shell_execute" in names
    server = build_server(reg, CallRunner(reg, Metrics()), lambda _ctx: project, extra=extra)
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"snapshot_create", "snapshot_list", "snapshot_delete", "workspace_fork", "workspace_restore"} <= set(
            tools
        )
        assert tools["workspace_fork"].input_schema["properties"]["count"]["maximum"] == 64
        r = await client.call_tool("snapshot_create", {"name": "prepared"})
        assert not r.is_error, r.content
        sid = r.structured_content["id"]
        r = await client.call_tool("workspace_fork", {"snapshot": sid, "count": 2})
        forks = r.structured_content["workspaces"]
        assert len(forks) == 2 and all(tree_hash(Path(f)) == tree_hash(project) for f in forks)
        await client.call_tool("shell_execute", {"command": "echo changed > README.md"})
        r = await client.call_tool("workspace_restore", {"snapshot": "prepared", "dry_run": True})
        assert "-changed" in r.structured_content["diff"]
        r = await client.call_tool("snapshot_create", {"workspace": forks[0]})  # a fork of its own
        assert not r.is_error and r.structured_content["parent"] == sid
        r = await client.call_tool("snapshot_list", {"workspace": str(tmp_path)})  # not of this lineage
        assert r.is_error and "not this server's workspace" in r.content[0].text
        r = await client.call_tool("workspace_fork", {"count": 65})
        assert r.is_error and "count" in r.content[0].text
        r = await client.call_tool("snapshot_delete", {"snapshot": sid})
        assert r.is_error and "live fork" in r.content[0].text
        listed = json.loads((await client.call_tool("snapshot_list", {})).content[0].text)
        assert [s["id"] for s in listed["snapshots"]] == [sid]


async def test_restore_inside_an_ignored_directory(reg: ToolRegistry, project: Path, tmp_path: Path) -> None:
    # A virtualenv's links and files are kept by stat only in the baseline: the restore
    # still compares links by target and untouched files by stat, and undo puts them back.
    await sh(reg, project, "mkdir -p .venv/bin .venv/lib && echo py > .venv/lib/x.py && ln -s x.py .venv/lib/link")
    await sh(reg, project, "ln -s lib .venv/lib64 && echo keep > .venv/bin/keep")
    snaps = snaps_of(reg, tmp_path)
    snap = await snaps.create(project)
    want = tree_state(project)
    assert (await snaps.restore(project, snap.id, dry_run=True)).plan.as_dict()["entries"] == []
    nothing = await snaps.restore(project, snap.id, dry_run=True)
    assert nothing.plan.created == nothing.plan.modified == nothing.plan.removed == []
    await sh(reg, project, "ln -sfn bin .venv/lib64 && rm .venv/lib/link && echo more >> .venv/lib/x.py")
    before = tree_state(project)
    done = await snaps.restore(project, snap.id)
    assert sorted(done.plan.modified + done.plan.created) == [".venv/lib/link", ".venv/lib/x.py", ".venv/lib64"]
    assert tree_state(project) == want
    ws = await reg.workspace(project)
    assert isinstance(ws.recorder, Changelog)
    undone = await ws.recorder.undo(ws.sandbox, call_id=done.call_id)
    assert not undone.failed and tree_state(project) == before, tree_diff(before, tree_state(project))
