"""Staged writes (``StagedWrites.stage_write`` / ``commit_write`` / ``abort_write``), the
primitive the changelog's edit path uses to overlap its entry's fsync with the file's.
Run on the local agent and on the real Docker sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.base import Sandbox
from sandbox.errors import AgentError, ConflictError, PathEscapeError


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request: pytest.FixtureRequest) -> object:
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture
async def box(backend: object, workspace: Path) -> Sandbox:
    return await backend.get(workspace)  # type: ignore[attr-defined,no-any-return]


def user_files(ws: Path) -> list[str]:
    return sorted(str(p.relative_to(ws)) for p in ws.rglob("*"))


async def test_nothing_changes_before_commit(box: Sandbox, workspace: Path) -> None:
    (workspace / "f.txt").write_bytes(b"old\r\n")
    (workspace / "f.txt").chmod(0o750)
    sha = (await box.read("f.txt")).sha256
    staged = await box.stage_write("f.txt", b"new\r\n", expect_sha256=sha)
    assert staged.path == "f.txt" and staged.mode is not None and staged.mode & 0o777 == 0o750
    assert (workspace / "f.txt").read_bytes() == b"old\r\n"
    r = await box.commit_write(staged)
    assert (workspace / "f.txt").read_bytes() == b"new\r\n" and not r.created
    assert (workspace / "f.txt").stat().st_mode & 0o777 == 0o750
    assert user_files(workspace) == ["f.txt"]  # no temporary left


async def test_abort_leaves_no_trace(box: Sandbox, workspace: Path) -> None:
    staged = await box.stage_write("sub/new.txt", b"x")
    assert staged.path == "sub/new.txt" and staged.mode is None
    await box.abort_write(staged)
    assert not (workspace / "sub" / "new.txt").exists()
    assert [p for p in user_files(workspace) if "loom" in p] == []


async def test_change_between_stage_and_commit_is_a_conflict(box: Sandbox, workspace: Path) -> None:
    (workspace / "f.txt").write_text("v1")
    sha = (await box.read("f.txt")).sha256
    staged = await box.stage_write("f.txt", b"mine", expect_sha256=sha)
    (workspace / "f.txt").write_text("v2, someone else's")
    with pytest.raises(ConflictError):
        await box.commit_write(staged)
    assert (workspace / "f.txt").read_text() == "v2, someone else's"
    assert user_files(workspace) == ["f.txt"]
    with pytest.raises(Exception, match="No staged write"):
        await box.commit_write(staged)  # used up


async def test_directory_swapped_for_a_link_before_commit_writes_nothing_outside(
    box: Sandbox, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "d").mkdir()
    staged = await box.stage_write("d/f.txt", b"payload")
    (workspace / "d").rename(workspace / "d.old")
    (workspace / "d").symlink_to(outside)
    with pytest.raises(ConflictError):
        await box.commit_write(staged)
    assert list(outside.iterdir()) == []


async def test_expectations_are_checked_when_staging(box: Sandbox, workspace: Path) -> None:
    (workspace / "f.txt").write_text("v1")
    with pytest.raises(ConflictError):
        await box.stage_write("f.txt", b"x", expect_absent=True)
    with pytest.raises(ConflictError):
        await box.stage_write("f.txt", b"x", expect_sha256="0" * 64)
    with pytest.raises(PathEscapeError):
        await box.stage_write("../escape.txt", b"x")
    assert user_files(workspace) == ["f.txt"]


async def test_a_lost_agent_takes_its_staged_files_with_it(box: Sandbox, workspace: Path) -> None:
    staged = await box.stage_write("f.txt", b"never committed")
    conn = await box.connection()  # type: ignore[attr-defined]
    await conn.close("test: host went away")
    with pytest.raises(AgentError, match="No staged write"):
        await box.commit_write(staged)  # a fresh agent: the staged file went with the old one
    assert not (workspace / "f.txt").exists()
    # The agent removes what it staged when its host goes away.
    for _ in range(100):
        if not user_files(workspace):
            break
        import asyncio

        await asyncio.sleep(0.05)
    assert user_files(workspace) == []


async def test_commit_may_be_sent_before_the_stage_answers(box: Sandbox, workspace: Path) -> None:
    """A caller-chosen token: the commit is queued behind the staging (the agent serves
    them in order), so the entry's fsync and the file's overlap without a round trip."""
    import asyncio

    (workspace / "f.txt").write_text("v1")
    sha = (await box.read("f.txt")).sha256
    stage = asyncio.ensure_future(box.stage_write("f.txt", b"v2", expect_sha256=sha, token="t0ken"))
    await asyncio.sleep(0)
    result = await box.commit_write("t0ken", expect_path="f.txt")
    assert (await stage).path == "f.txt" and result.size == 2
    assert (workspace / "f.txt").read_text() == "v2"


async def test_commit_refuses_another_resolved_path(box: Sandbox, workspace: Path) -> None:
    (workspace / "real.txt").write_text("r")
    (workspace / "link.txt").symlink_to("real.txt")
    staged = await box.stage_write("link.txt", b"new")
    assert staged.path == "real.txt"
    with pytest.raises(ConflictError):
        await box.commit_write(staged, expect_path="link.txt")
    assert (workspace / "real.txt").read_text() == "r"
    assert sorted(p.name for p in workspace.iterdir()) == ["link.txt", "real.txt"]


@pytest.mark.parametrize("how", ["rewrite", "symlink"])
async def test_tampered_staged_temporary_is_refused(box: Sandbox, workspace: Path, tmp_path: Path, how: str) -> None:
    """Between staging and commit a process in the sandbox could rewrite our temporary or
    swap it for a link; the commit notices and writes nothing."""
    import asyncio

    (workspace / "f.txt").write_text("orig")
    staged = await box.stage_write("f.txt", b"ours")
    (tmp,) = [p for p in workspace.iterdir() if p.name.startswith(".f.txt.loom-")]
    await asyncio.sleep(0.01)  # a later mtime/ctime tick
    if how == "rewrite":
        tmp.write_bytes(b"evil")
    else:
        tmp.unlink()
        tmp.symlink_to(tmp_path)
    with pytest.raises(ConflictError, match="tampered"):
        await box.commit_write(staged)
    assert (workspace / "f.txt").read_text() == "orig"
    assert sorted(p.name for p in workspace.iterdir()) == ["f.txt"]
