"""The changelog error tree.

::

    ChangelogError                  base of everything this package raises itself
    ├── ChangelogStorageError       infrastructure: the data directory failed (disk full,
    │                               I/O error, corrupt database); nothing in the workspace
    │                               was changed by the failing call
    ├── EntryNotFoundError          no entry with that id / call id / subtask id (LookupError)
    ├── UndoConflictError           a file changed since the entry; ``force`` overrides
    └── UndoRefusedError            the entry cannot be reverted at all (tampered path,
                                    before-image not kept, blob missing or corrupt)

Errors of the sandbox (``sandbox.errors``) raised while reading or writing through the
agent are re-raised unchanged, so the tool layer keeps its two channels.
"""

from __future__ import annotations


class ChangelogError(Exception):
    """Base class of the errors raised by :mod:`worker.changelog`."""


class ChangelogStorageError(ChangelogError):
    """The changelog store on the host failed; the workspace was not changed."""


class EntryNotFoundError(ChangelogError, LookupError):
    """No entry matches the selection."""


class UndoConflictError(ChangelogError):
    """Files changed since the entries to revert; nothing was changed. ``conflicts`` lists them."""

    def __init__(self, message: str, conflicts: list[str]) -> None:
        super().__init__(message)
        self.conflicts = conflicts


class UndoRefusedError(ChangelogError):
    """An entry cannot be reverted (tampered path, before-image not kept, corrupt blob)."""
