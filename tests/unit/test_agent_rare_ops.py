"""The agent's operations whose modules are imported where they run, not at its boot
(tests/unit/test_agent_boot_imports.py): a move across two file systems (shutil) and the
search's Python fallback with a glob (fnmatch), run in this process."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.agent import fsops, search, state


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    fd = os.open(ws, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    monkeypatch.setattr(state, "ROOT", str(ws))
    monkeypatch.setattr(state, "ROOT_FD", fd)
    yield ws
    os.close(fd)


def test_a_move_across_file_systems_copies_then_removes(root: Path, tmp_path: Path) -> None:
    other = Path(tempfile.mkdtemp(dir="/dev/shm"))  # a tmpfs: another file system than tmp_path's
    try:
        assert os.stat(other).st_dev != os.stat(tmp_path).st_dev
        (tmp_path / "out").mkdir()
        src = tmp_path / "out" / "tree"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "f.txt").write_text("moved")
        moved = fsops.op_fs_move({"source": str(src), "destination": str(other / "a" / "tree")})
        assert moved["entry"]["name"] == "tree" and moved["entry"]["type"] == "dir"
        assert (other / "a" / "tree" / "sub" / "f.txt").read_text() == "moved"
        assert not src.exists()
    finally:
        import shutil

        shutil.rmtree(other)


def test_the_python_search_takes_a_glob(root: Path) -> None:
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("needle = 1\n")
    (root / "src" / "b.txt").write_text("needle = 2\n")
    (root / "c.py").write_text("no\nneedle = 3\n")
    found = search.op_search({"pattern": "needle", "glob": "*.py", "force_python": True})
    assert found["engine"] == "python"
    assert found["matches"] == [["c.py", 2, "needle = 3"], ["src/a.py", 1, "needle = 1"]]  # [path, line, text]
    one = search.op_search({"pattern": "NEEDLE", "path": "src/b.txt", "ignore_case": True, "force_python": True})
    assert one["matches"] == [["src/b.txt", 1, "needle = 2"]]
