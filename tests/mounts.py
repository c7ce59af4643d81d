"""Small filesystems mounted for a test: a size-limited tmpfs (a disk that fills), btrfs
and XFS on a loop device (copy-on-write). They need root and, for the loop ones,
``mkfs.btrfs``/``mkfs.xfs`` (btrfs-progs, xfsprogs: scripts/setup installs them); without
them a test skips, and fails under ``REQUIRE_DOCKER=1`` (CI) like the Docker tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_DOCKER


def _need(problem: str | None) -> None:
    if problem:
        if REQUIRE_DOCKER:
            pytest.fail(f"REQUIRE_DOCKER=1 but {problem}")
        pytest.skip(problem)


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (``8m``) mounted at ``path`` (made); with ``inodes``, that many
    at most (a directory costs one, no block: a tmpfs full for ``mkdir``)."""
    _need(None if os.geteuid() == 0 else "mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=0755" + (f",nr_inodes={inodes}" if inodes is not None else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        _umount(path)


@contextlib.contextmanager
def loop_fs(path: Path, fstype: str, size: str = "1G") -> Iterator[Path]:
    """A ``fstype`` (btrfs, xfs) filesystem on a sparse loop image, mounted at ``path``."""
    mkfs = shutil.which(f"mkfs.{fstype}")
    problem = None
    if os.geteuid() != 0:
        problem = "loop mounts need root"
    elif mkfs is None:
        problem = f"mkfs.{fstype} is not installed ({'btrfs-progs' if fstype == 'btrfs' else 'xfsprogs'})"
    _need(problem)
    assert mkfs is not None
    image = path.parent / f"{path.name}.img"
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    args = [mkfs, "-q", *(["-m", "reflink=1"] if fstype == "xfs" else []), str(image)]
    subprocess.run(args, check=True, capture_output=True)
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(path)], check=True)
    try:
        yield path
    finally:
        _umount(path)
        image.unlink(missing_ok=True)
