"""The one atomic file write (:mod:`worker.storage.atomic`): replaced whole, its mode
given, no temporary left behind whatever happens."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from worker.storage.atomic import write_atomic


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    ("data", "mode", "fsync", "want"),
    [
        (b"\x00bytes\xff", 0o600, True, b"\x00bytes\xff"),
        ("text é\n", 0o600, False, "text é\n".encode()),
        ("public", 0o644, False, b"public"),
        ("", 0o640, True, b""),
    ],
)
def test_the_file_is_replaced_whole_with_its_mode(
    tmp_path: Path, data: bytes | str, mode: int, fsync: bool, want: bytes
) -> None:
    path = tmp_path / "f.json"
    path.write_text("old content, longer than the new one")
    os.chmod(path, 0o666)
    old_umask = os.umask(0o077)  # the mode is the one given, whatever the umask
    try:
        write_atomic(path, data, mode=mode, fsync=fsync)
    finally:
        os.umask(old_umask)
    assert path.read_bytes() == want and _mode(path) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "d"
    target.mkdir()
    (target / "inside").write_text("x")  # a directory that is not empty: the rename fails
    with pytest.raises(OSError):
        write_atomic(target, b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "f", b"new")  # no directory is made


def test_writers_at_once_leave_one_of_their_contents_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    bodies = [bytes([65 + i]) * 200_000 for i in range(8)]
    threads = [threading.Thread(target=write_atomic, args=(path, b)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert path.read_bytes() in bodies
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
