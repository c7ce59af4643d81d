"""Checks of what an agent answers: it runs next to untrusted code, so every field is
re-checked on the host (type, range, size; paths stay workspace-relative) before anything
uses it. Each check raises :class:`~sandbox.errors.ProtocolError` naming the field."""

from __future__ import annotations

import base64
import binascii
import posixpath
from typing import Any, cast

from .agent.scanwalk import MAX_PATH as _SCAN_MAX_PATH
from .errors import ProtocolError
from .results import AgentInfo, EntryType, ListEntry, ListResult, ScanEntry, ScanResult, SearchMatch, SearchResult

_ENTRY_TYPES = {"file", "dir", "symlink", "other"}
#: The longest path an agent may send: a scan's rows go as deep as the agent's walk
#: (``sandbox.agent.scanwalk.MAX_PATH``), plus one name.
MAX_RELPATH = _SCAN_MAX_PATH + 512


def check_int(v: Any, name: str, *, lo: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ProtocolError(f"agent sent an invalid {name}: {v!r:.80}")
    return v


def check_stat(v: Any) -> tuple[int, int, int, int] | None:
    """A file's (size, mtime_ns, inode, st_mode) as the agent sent it, None when it sent
    none (an older agent). Raises ProtocolError for anything else."""
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != 4:
        raise ProtocolError(f"agent sent an invalid stat: {v!r:.80}")
    size, mtime_ns, ino, mode = (check_int(x, "stat") for x in v)
    return size, mtime_ns, ino, mode


def check_opt_int(v: Any, name: str) -> int | None:
    return None if v is None else check_int(v, name, lo=-(1 << 62))


def check_str(v: Any, name: str, *, limit: int = 1 << 20) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise ProtocolError(f"agent sent an invalid {name}")
    return v


def check_b64(v: Any, name: str, limit: int) -> bytes:
    s = check_str(v, name, limit=limit * 4 // 3 + 8)
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ProtocolError(f"agent sent invalid base64 in {name}") from e


def check_relpath(v: Any) -> str:
    """A workspace-relative path from the agent: normalized, never absolute, never ``..``."""
    s = check_str(v, "path", limit=MAX_RELPATH)
    if s in ("", ".") or "\x00" in s:
        if s == ".":
            return s
        raise ProtocolError("agent sent an empty or NUL path")
    norm = posixpath.normpath(s)
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise ProtocolError(f"agent sent a path outside the workspace: {s[:200]!r}")
    return norm


def check_entry_type(v: Any) -> EntryType:
    if v not in _ENTRY_TYPES:
        raise ProtocolError(f"agent sent an unknown entry type {v!r:.40}")
    return cast(EntryType, v)


def scan_result(r: Any, max_files: int) -> ScanResult:
    """Validate an agent's scan answer."""
    if not isinstance(r, dict):
        raise ProtocolError("agent sent an invalid scan")
    raw = r.get("entries")
    removed = r.get("removed")
    if not isinstance(raw, list) or not isinstance(removed, list) or len(raw) > max_files:
        raise ProtocolError("agent sent an invalid scan")
    entries = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 6:
            raise ProtocolError("agent sent an invalid scan entry")
        entries.append(
            ScanEntry(
                path=check_relpath(item[0]),
                type=check_entry_type(item[1]),
                size=check_int(item[2], "size"),
                mtime_ns=check_int(item[3], "mtime_ns", lo=-(1 << 62)),
                ino=check_int(item[4], "ino"),
                mode=check_int(item[5], "mode"),
            )
        )
    return ScanResult(
        entries=entries,
        removed=[check_relpath(p) for p in removed],
        full=bool(r.get("full")),
        watched=r.get("watched") is True,
        from_events=r.get("from_events") is True,
        truncated=bool(r.get("truncated")),
        generation=check_str(r.get("generation", ""), "generation", limit=64),
    )


def agent_info(r: dict[str, Any]) -> AgentInfo:
    """Validate an agent's hello."""
    return AgentInfo(
        version=check_str(r.get("version"), "version", limit=40),
        uid=check_int(r.get("uid"), "uid"),
        gid=check_int(r.get("gid"), "gid"),
        pid=check_int(r.get("pid"), "pid"),
        python=check_str(r.get("python"), "python", limit=40),
        kernel=check_str(r.get("kernel"), "kernel", limit=200),
        subreaper=bool(r.get("subreaper")),
        ripgrep=bool(r.get("ripgrep")),
        extra=_hello_extra(r),
    )


def _hello_extra(r: dict[str, Any]) -> dict[str, object]:
    """The hello's optional facts: the CPU quota, the seccomp mode (2: a filter), and
    whether the agent's own filter (no setuid/setgid bits, no devices) is on ("on", or
    why not)."""
    extra: dict[str, object] = {}
    if isinstance(q := r.get("cpu_quota"), int | float) and not isinstance(q, bool):
        extra["cpu_quota"] = q
    if isinstance(m := r.get("seccomp"), int) and not isinstance(m, bool):
        extra["seccomp"] = m
    if isinstance(g := r.get("modeguard"), str):
        extra["modeguard"] = g[:200]
    return extra


def list_result(r: dict[str, Any], max_entries: int) -> ListResult:
    """Validate an agent's listing."""
    raw = r.get("entries")
    if not isinstance(raw, list) or len(raw) > max_entries:
        raise ProtocolError("agent sent an invalid listing")
    entries = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 4:
            raise ProtocolError("agent sent an invalid listing entry")
        entries.append(
            ListEntry(
                path=check_relpath(item[0]),
                type=check_entry_type(item[1]),
                size=check_int(item[2], "size"),
                depth=check_int(item[3], "depth", lo=1),
            )
        )
    return ListResult(entries=entries, truncated=bool(r.get("truncated")))


def search_result(r: dict[str, Any], max_matches: int) -> SearchResult:
    """Validate an agent's search answer."""
    raw = r.get("matches")
    if not isinstance(raw, list) or len(raw) > max_matches:
        raise ProtocolError("agent sent an invalid search result")
    matches = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 3:
            raise ProtocolError("agent sent an invalid match")
        matches.append(
            SearchMatch(
                path=check_relpath(item[0]),
                line=check_int(item[1], "line", lo=1),
                text=check_str(item[2], "text", limit=8192),
            )
        )
    return SearchResult(
        matches=matches,
        truncated=bool(r.get("truncated")),
        engine=check_str(r.get("engine"), "engine", limit=20),
    )
