"""The six built-in tools, in one visible, stable order."""

from __future__ import annotations

from ..tool import Tool
from . import files, search, shell

#: Names of the built-in tools, in the order schemas are listed.
BUILTIN_NAMES = ("read_file", "write_file", "edit_file", "shell_execute", "search_files", "list_directory")


def builtin_tools() -> list[Tool]:
    """Fresh list of the six built-in tools, in :data:`BUILTIN_NAMES` order."""
    by_name = {t.name: t for t in (*files.TOOLS, *shell.TOOLS, *search.TOOLS)}
    return [by_name[n] for n in BUILTIN_NAMES]


__all__ = ["BUILTIN_NAMES", "builtin_tools"]
