"""The built-in tools, in one visible, stable order: the six core tools, those of
background processes, then the code interpreter's."""

from __future__ import annotations

from ..tool import Tool
from . import code, files, processes, search, shell

#: Names of the built-in tools, in the order schemas are listed.
BUILTIN_NAMES = ("read_file", "write_file", "edit_file", "shell_execute", "search_files", "list_directory")
#: The background processes' tools (``shell_execute`` with ``background``/``yield_ms``).
PROCESS_NAMES = ("process_output", "process_input", "process_kill", "process_list")
#: The code interpreter's tool (a kernel that keeps its state: docs/code-interpreter.md).
CODE_NAMES = ("run_code",)
TOOL_NAMES = BUILTIN_NAMES + PROCESS_NAMES + CODE_NAMES


def builtin_tools() -> list[Tool]:
    """Fresh list of the built-in tools, in :data:`TOOL_NAMES` order."""
    by_name = {t.name: t for t in (*files.TOOLS, *shell.TOOLS, *search.TOOLS, *processes.TOOLS, *code.TOOLS)}
    return [by_name[n] for n in TOOL_NAMES]


__all__ = ["BUILTIN_NAMES", "CODE_NAMES", "PROCESS_NAMES", "TOOL_NAMES", "builtin_tools"]
