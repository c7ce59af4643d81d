"""Host-side workspace changelog (Loom Spec 11) with undo that also covers shell commands.

Modules: ``api`` (:class:`Changelog`), ``recorder`` (record-before-write, recovery),
``write`` (the tools' recorded write), ``shellscan`` (baseline + change scan), ``undo``,
``diff``, ``groups`` (entries by call), ``store`` (SQLite), ``model``, ``paths``, ``errors``.
"""

from .api import Changelog
from .errors import (
    ChangelogError,
    ChangelogStorageError,
    EntryNotFoundError,
    UndoConflictError,
    UndoRefusedError,
)
from .groups import Group
from .model import Durability, Entry, Limits, Summary, UndoResult, UndoStep
from .shellscan import ShellToken

__all__ = [
    "Changelog",
    "ChangelogError",
    "ChangelogStorageError",
    "Durability",
    "Entry",
    "EntryNotFoundError",
    "Group",
    "Limits",
    "ShellToken",
    "Summary",
    "UndoConflictError",
    "UndoRefusedError",
    "UndoResult",
    "UndoStep",
]
