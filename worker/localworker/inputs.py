"""Fingerprints of the files a registry reads when it is built, so a long-lived one (the
local worker, a cached ``tools`` listing) can tell it is out of date.

A fresh CLI process reads the custom tools' directory, the MCP servers file and, when MCP
servers are configured, the MCP tools indexed in the catalog database. The fingerprint of
a path is its ``stat`` (size, mtime, inode), and for a directory that of each entry too:
a few ``stat`` calls, cheaper than any comparison of contents, and every edit, copy or
rename changes one of them. Standard library only (the client uses it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the local worker's client imports this module
    from ..registry import ToolRegistry
    from ..settings import Settings

Fingerprint = list[Any]


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode]


def fingerprint(paths: Sequence[str]) -> Fingerprint:
    """One JSON-able value per path: its stat, and a directory's entries' stats."""
    out: Fingerprint = []
    for p in paths:
        item: list[Any] = [p, _stat(p)]
        if os.path.isdir(p):
            try:
                names = sorted(os.listdir(p))
            except OSError:
                names = []
            item.append([[n, _stat(os.path.join(p, n))] for n in names])
        out.append(item)
    return out


def registry_inputs(settings: Settings, registry: ToolRegistry) -> list[str]:
    """The files ``registry`` (built from ``settings``) read when it was built: none
    without the tool catalog; with it the custom tools' directory, the MCP servers file
    and, when MCP servers are configured, the catalog database they were indexed in."""
    tools = registry.catalog_tools
    if tools is None:
        return []
    from ..catalog import db_path, mcp_file, tools_dir

    paths = [str(tools_dir(settings)), str(mcp_file(settings))]
    if tools.mcp_servers:  # only then does the database decide which tools are registered
        db = str(db_path(settings))
        paths += [db, db + "-wal"]
    return paths
