"""``loom-worker log/diff/undo`` end to end on the local backend (no Docker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.base import ExecRequest
from sandbox.local import LocalProcessBackend
from worker.changelog import Changelog
from worker.cli import main


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LOOM_ALLOW_UNSAFE_LOCAL", "1")
    return tmp_path / "data"


_TWO_WRITES = (("a.txt", b"one\n", "c1"), ("a.txt", b"two\n", "c2"))


async def _seed(data: Path, workspace: Path, writes: tuple[tuple[str, bytes, str], ...] = _TWO_WRITES) -> None:
    """Record ``writes`` (path, content, call id) through the changelog, in order."""
    backend = LocalProcessBackend()
    try:
        box = await backend.get(workspace)
        async with Changelog.open(data, workspace) as cl:
            for path, data_, call_id in writes:
                await cl.write(box, path, data_, call_id=call_id)
    finally:
        await backend.aclose()


def test_log_diff_undo(env: Path, workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    asyncio.run(_seed(env, workspace))
    assert main(["log", "--workspace", str(workspace)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "create" in out[0] and "call=c2" in out[1]
    assert main(["diff", "--workspace", str(workspace), "--backend", "local"]) == 0
    assert "+two\n" in capsys.readouterr().out
    assert main(["undo", "--workspace", str(workspace), "--call", "c2", "--dry-run", "--backend", "local"]) == 0
    assert "-two\n+one\n" in capsys.readouterr().out
    assert (workspace / "a.txt").read_text() == "two\n"
    assert main(["undo", "--workspace", str(workspace), "--all", "--backend", "local"]) == 0
    assert not (workspace / "a.txt").exists()


def test_undo_conflict_exit_1(env: Path, workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    asyncio.run(_seed(env, workspace))
    (workspace / "a.txt").write_text("edited by hand\n")
    assert main(["undo", "--workspace", str(workspace), "--entry", "2", "--backend", "local"]) == 1
    assert "refusing to undo" in capsys.readouterr().err
    assert main(["undo", "--workspace", str(workspace), "--entry", "2", "--force", "--backend", "local"]) == 0
    assert (workspace / "a.txt").read_text() == "one\n"


def test_undo_needs_one_selector(env: Path, workspace: Path) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["undo", "--workspace", str(workspace)])
    assert ei.value.code == 2


def test_odd_file_names_are_quoted_and_taken_back(
    env: Path, workspace: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """A recorded file whose name is not UTF-8 (or holds a newline): log, diff and undo
    print strict UTF-8, the name quoted as git does, and take the quoted name back."""
    import asyncio
    import json
    import os

    asyncio.run(_seed(env, workspace, (("bad\udcff.txt", b"one\n", "c1"), ("new\nline", b"two\n", "c2"))))
    assert main(["log", "--workspace", str(workspace), "--json"]) == 0
    lines = capsysbinary.readouterr().out.decode("utf-8").splitlines()
    assert [json.loads(x)["path"] for x in lines] == ['"bad\\377.txt"', '"new\\nline"']
    assert main(["log", "--workspace", str(workspace)]) == 0
    assert len(capsysbinary.readouterr().out.decode("utf-8").splitlines()) == 2  # no forged line
    assert main(["log", "--workspace", str(workspace), "--path", '"bad\\377.txt"', "--json"]) == 0
    assert len(capsysbinary.readouterr().out.decode("utf-8").splitlines()) == 1
    assert main(["diff", "--workspace", str(workspace), "--backend", "local", '"new\\nline"']) == 0
    out = capsysbinary.readouterr().out.decode("utf-8")
    assert '+++ "b/new\\nline"' in out and "bad" not in out
    assert main(["undo", "--workspace", str(workspace), "--all", "--backend", "local", "--json"]) == 0
    steps = json.loads(capsysbinary.readouterr().out.decode("utf-8"))["steps"]
    assert [s["path"] for s in steps] == ['"new\\nline"', '"bad\\377.txt"']
    assert os.listdir(workspace) == []


def test_directories_a_command_made_show_and_undo(
    env: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``log`` marks a directory entry as ls -F does; ``undo --all`` removes it."""
    import asyncio

    from worker.workspace import Workspace

    async def seed() -> None:
        backend = LocalProcessBackend()
        try:
            box = await backend.get(workspace)
            async with Changelog.open(env, workspace) as cl:
                ws = Workspace(workspace, box, cl)
                await ws.run_shell(ExecRequest("true"))
                await ws.run_shell(ExecRequest("mkdir -p out/x && echo o > out/x/f"), call_id="m")
        finally:
            await backend.aclose()

    asyncio.run(seed())
    assert main(["log", "--workspace", str(workspace)]) == 0
    out = capsys.readouterr().out
    assert " out/  " in out and " out/x/  " in out and " out/x/f  " in out
    assert main(["undo", "--workspace", str(workspace), "--all", "--backend", "local"]) == 0
    assert list(workspace.iterdir()) == []
