"""The changelog error tree.

::

    ChangelogError                  base of everything this package raises itself
    ├── ChangelogStorageError       infrastructure: the data directory failed (disk full,
    │   │                           I/O error); nothing in the workspace was changed by the
    │   │                           failing call
    │   ├── ChangelogDamagedError   the record does not open, is truncated or fails its
    │   │                           integrity check: every call on the workspace stops
    │   └── ChangesNotRecordedError a command ran, but its changes could not be recorded
    │                               yet: they are at the next use (its intent is open)
    ├── ReserveError                a limit: the data directory has less free space than
    │                               the reserve, so the command or write did not start
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


class ChangelogDamagedError(ChangelogStorageError):
    """The changelog's database is damaged (unreadable, truncated, fails its integrity
    check). Its message names the file and what to do; nothing was changed."""

    def __init__(self, path: object, problem: str, workspace: object = None) -> None:
        where = "DIR" if workspace is None else str(workspace)
        super().__init__(
            f"the changelog {path} is damaged ({problem}); calls on this workspace stop until it is repaired: "
            f"`loom-worker repair --workspace {where}` keeps what is readable and says what was lost "
            f"(or move the directory {getattr(path, 'parent', path)} aside to start a new, empty history)"
        )
        self.path = path
        self.problem = problem


class ChangesNotRecordedError(ChangelogStorageError):
    """A command ran and changed the workspace, but the changelog could not record its
    changes now (storage failed after it ran). Its intent stays open, so they are recorded
    as that command's, marked interrupted, at the next use of the changelog."""


class ReserveError(ChangelogError):
    """The data directory has less free space than the reserve the changelog keeps for
    recording; the command or write was not started. A limit, not an infrastructure
    failure."""


class EntryNotFoundError(ChangelogError, LookupError):
    """No entry matches the selection."""


class UndoConflictError(ChangelogError):
    """Files changed since the entries to revert; nothing was changed. ``conflicts`` lists them."""

    def __init__(self, message: str, conflicts: list[str]) -> None:
        super().__init__(message)
        self.conflicts = conflicts


class UndoRefusedError(ChangelogError):
    """An entry cannot be reverted (tampered path, before-image not kept, corrupt blob)."""
