"""Space before action: a change does not start when the data directory cannot hold its
record."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ChangelogStorageError, ReserveError
from .model import size_text


def check_reserve(root: Path, reserve: int, what: str) -> None:
    """Refuse to start ``what`` when the filesystem of the changelog directory ``root`` has
    less than ``reserve`` bytes free (room to record its changes; 0: no check). One
    ``statvfs``: about a microsecond. Raises ReserveError (a limit: nothing was started),
    ChangelogStorageError."""
    if not reserve:
        return
    try:
        st = os.statvfs(root)
    except OSError as e:
        raise ChangelogStorageError(f"cannot check the free space of {root}: {e}") from e
    free = st.f_bavail * st.f_frsize
    if free < reserve:
        raise ReserveError(
            f"Not started: the changelog's data directory {root.parent.parent} has {size_text(free)} free, "
            f"less than the {size_text(reserve)} kept to record {what}'s changes (LOOM_CHANGELOG_RESERVE_BYTES); "
            "nothing was changed. Free space there, then retry."
        )
