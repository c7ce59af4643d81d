"""The snapshot error tree.

::

    SnapshotError                     base of everything this package raises itself
    ├── SnapshotNotFoundError         no snapshot with that id or name (also LookupError)
    ├── SnapshotInUseError            deleting a snapshot that live forks came from (no --force)
    ├── SnapshotLimitError            LOOM_MAX_SNAPSHOTS or LOOM_MAX_SNAPSHOT_BYTES reached:
    │   │                             a refusal, nothing was made
    │   └── ScratchLimitError         the sandbox's own limits (its processes, the time or
    │                                 size an archive may take; at a fork, its /tmp or $HOME
    │                                 too small for the archive) stopped --with-scratch
    ├── ScratchError                  the sandbox could not archive its /tmp and $HOME, or a
    │                                 fork unpack them, for another reason of its own (no tar
    │                                 in its image, tar's own failure): nothing was made
    └── SnapshotDiskFullError         the disk filled during a copy: the partial copy was
                                      removed, the source is untouched (also OSError)

Sandbox and changelog errors raised on the way (the sandbox lost while its scratch is
read, the changelog's storage failing) are re-raised unchanged.
"""

from __future__ import annotations

import errno


class SnapshotError(Exception):
    """Base class of the errors raised by :mod:`worker.snapshots`."""


class SnapshotNotFoundError(SnapshotError, LookupError):
    """No snapshot matches."""


class SnapshotInUseError(SnapshotError):
    """Live forks came from the snapshot; ``forks`` lists their directories."""

    def __init__(self, message: str, forks: list[str]) -> None:
        super().__init__(message)
        self.forks = forks


class SnapshotLimitError(SnapshotError):
    """A configured limit refuses the snapshot; nothing was made."""


class ScratchLimitError(SnapshotLimitError):
    """The sandbox's own limits stopped the archive of its ``/tmp`` and ``$HOME``
    (``--with-scratch``): its process limit reached, or the time or size the archive may
    take; or, at a fork, the fork's ``/tmp`` or ``$HOME`` too small for the archive or
    its unpack too slow. Nothing was made (a fork is removed again)."""


class ScratchError(SnapshotError):
    """The sandbox could not archive its ``/tmp`` and ``$HOME`` (``--with-scratch``), or a
    fork's sandbox unpack them, for a reason of its own: its image has no ``tar``, or
    ``tar`` failed on what is there; nothing was made (a fork is removed again)."""


class SnapshotDiskFullError(SnapshotError, OSError):
    """No space left while copying; the partial copy is gone and the source untouched."""

    def __init__(self, message: str) -> None:
        SnapshotError.__init__(self, message)
        self.errno = errno.ENOSPC
        self.strerror = message

    def __str__(self) -> str:
        return self.strerror or ""
