"""Checks of what an agent answers: it runs next to untrusted code, so every field is
re-checked on the host (type, range, size; paths stay workspace-relative) before anything
uses it. Each check raises :class:`~sandbox.errors.ProtocolError` naming the field."""

from __future__ import annotations

import base64
import binascii
import posixpath
from collections.abc import Callable
from typing import Any, cast

from .agent.scanwalk import MAX_PATH as _SCAN_MAX_PATH
from .errors import ProtocolError
from .results import (
    AgentInfo,
    EntryType,
    ExecResult,
    ListEntry,
    ListResult,
    Outcome,
    ScanEntry,
    ScanRequest,
    ScanResult,
    SearchMatch,
    SearchResult,
    StreamName,
)

_ENTRY_TYPES = {"file", "dir", "symlink", "other"}
#: The longest path an agent may send: a scan's rows go as deep as the agent's walk
#: (``sandbox.agent.scanwalk.MAX_PATH``), plus one name.
MAX_RELPATH = _SCAN_MAX_PATH + 512
_OUTCOMES = {"exit", "timeout", "oom", "output_limit", "disk_limit", "signal", "sandbox_lost"}
_LAUNCH_ERRORS = {"not_found", "permission", "cwd", "user", "exec"}


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


def exec_result(r: dict[str, Any], max_output: int, scan: ScanRequest | None) -> ExecResult:
    """Validate an agent's answer to an ``exec`` that ran: ``max_output`` is what the
    request asked to keep of each stream (already capped), ``scan`` the scan that
    travelled with it, if any."""
    scan_after = None
    if scan is not None and r.get("scan") is not None:
        scan_after = scan_result(r.get("scan"), scan.max_files)
    outcome = r.get("outcome")
    if outcome not in _OUTCOMES:
        raise ProtocolError(f"agent sent an unknown outcome {outcome!r:.40}")
    duration = r.get("duration_ms")
    if not isinstance(duration, int | float) or isinstance(duration, bool):
        raise ProtocolError("agent sent an invalid duration")
    stdout, stderr = _streams(r, max_output + 256)
    launch = r.get("launch_error")
    if launch is not None and launch not in _LAUNCH_ERRORS:
        raise ProtocolError(f"agent sent an unknown launch error {launch!r:.40}")
    sig = r.get("signal")
    return ExecResult(
        exit_code=check_opt_int(r.get("exit_code"), "exit_code"),
        stdout=stdout,
        stderr=stderr,
        outcome=cast(Outcome, outcome),
        duration_ms=float(duration),
        truncated=bool(r.get("truncated")),
        signal=None if sig is None else check_int(sig, "signal"),
        stdout_bytes=check_int(r.get("stdout_bytes", 0), "stdout_bytes"),
        stderr_bytes=check_int(r.get("stderr_bytes", 0), "stderr_bytes"),
        scan_after=scan_after,
        disk_used=check_opt_int(r.get("disk_used"), "disk_used"),
        launch_error=launch,
    )


def _streams(r: dict[str, Any], limit: int) -> tuple[bytes, bytes]:
    """A command's two streams from its answer: raw after the line (``stdout_len`` bytes
    of stdout, then stderr), or base64 in it. Raises ProtocolError."""
    raw = r.get("_raw")
    if not isinstance(raw, bytes):
        return check_b64(r.get("stdout"), "stdout", limit), check_b64(r.get("stderr"), "stderr", limit)
    n = check_int(r.get("stdout_len"), "stdout_len")
    if n > len(raw) or n > limit or len(raw) - n > limit:
        raise ProtocolError("agent sent more output than asked for")
    return raw[:n], raw[n:]


def output_events(on_output: Callable[[StreamName, bytes], None]) -> Callable[[dict[str, Any]], None]:
    """The handler of a streamed command's ``output`` events: checked, decoded, handed on
    to ``on_output``. Raises ProtocolError."""

    def on_event(msg: dict[str, Any]) -> None:
        if msg.get("event") != "output":
            return  # "lost": the exec call itself reports it
        stream = msg.get("stream")
        if stream not in ("stdout", "stderr"):
            raise ProtocolError(f"agent sent output of an unknown stream {stream!r:.40}")
        data = check_b64(msg.get("data"), "output", 1 << 20)
        if data:
            on_output(stream, data)

    return on_event
