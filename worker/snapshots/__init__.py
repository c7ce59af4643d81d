"""Snapshots and forks of workspaces (issue 29): named, immutable points of a workspace's
tree, settings and changelog position; forks made from them by copy-on-write where the host
allows; restore, recorded in the changelog so it can be undone.

Modules: ``api`` (:class:`Snapshots`), ``strategy`` (how a tree is copied: btrfs
subvolumes, reflinks, a plain copy), ``overlay`` (forks as overlay volumes the engine
mounts: O(1) on ext4), ``index`` (the store's SQLite index and lineage),
``scratch`` (``/tmp`` and ``$HOME``), ``errors``. Restore's recording lives in
:mod:`worker.changelog.restore`.
"""

from .api import MAX_FORKS, Limits, Restored, Snapshots
from .errors import (
    ScratchError,
    ScratchLimitError,
    SnapshotDiskFullError,
    SnapshotError,
    SnapshotInUseError,
    SnapshotLimitError,
    SnapshotNotFoundError,
)
from .index import Fork, Snapshot

__all__ = [
    "MAX_FORKS",
    "Fork",
    "Limits",
    "Restored",
    "ScratchError",
    "ScratchLimitError",
    "Snapshot",
    "SnapshotDiskFullError",
    "SnapshotError",
    "SnapshotInUseError",
    "SnapshotLimitError",
    "SnapshotNotFoundError",
    "Snapshots",
]
