"""``Sandbox`` implemented over an agent connection, shared by every backend.

The connection is (re)opened lazily through ``connect``: when a call finds it lost, the
call fails with ``SandboxLostError`` (or ``outcome="sandbox_lost"`` for exec) and the next
call transparently gets a fresh agent, or a fresh container, from the backend.

Every answer is re-checked here (types, sizes, workspace-relative paths) because the
agent runs next to untrusted code.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import builtins
import posixpath
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from . import protocol
from .background import BackgroundMixin
from .base import (
    DEFAULT_EXCLUDES,
    AgentInfo,
    EntryType,
    ExecControl,
    ExecResult,
    FileStat,
    ListEntry,
    ListResult,
    Outcome,
    OutputCallback,
    ReadResult,
    Sandbox,
    ScanEntry,
    ScanFirst,
    ScanRequest,
    ScanResult,
    SearchMatch,
    SearchResult,
    StagedWrite,
    TreeRemoval,
    WriteResult,
)
from .connection import AgentConnection
from .errors import AgentError, ProtocolError, SandboxLostError, SandboxTimeoutError
from .process import SandboxProcess
from .tunnel import SandboxTunnel, Tunnel

#: Opens a fresh agent connection; the flag is True when a previous one was lost.
Connector = Callable[[bool], Awaitable[AgentConnection]]

_TYPES = {"file", "dir", "symlink", "other"}
_OUTCOMES = {"exit", "timeout", "oom", "output_limit", "disk_limit", "signal", "sandbox_lost"}

#: Host deadline = the operation's own budget + this slack for the round trip.
DEADLINE_SLACK = 5.0


def _int(v: Any, name: str, *, lo: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ProtocolError(f"agent sent an invalid {name}: {v!r:.80}")
    return v


def _opt_int(v: Any, name: str) -> int | None:
    return None if v is None else _int(v, name, lo=-(1 << 62))


def _str(v: Any, name: str, *, limit: int = 1 << 20) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise ProtocolError(f"agent sent an invalid {name}")
    return v


def _b64(v: Any, name: str, limit: int) -> bytes:
    s = _str(v, name, limit=limit * 4 // 3 + 8)
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ProtocolError(f"agent sent invalid base64 in {name}") from e


def _relpath(v: Any) -> str:
    """A workspace-relative path from the agent: normalized, never absolute, never ``..``."""
    s = _str(v, "path", limit=8192)
    if s in ("", ".") or "\x00" in s:
        if s == ".":
            return s
        raise ProtocolError("agent sent an empty or NUL path")
    norm = posixpath.normpath(s)
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise ProtocolError(f"agent sent a path outside the workspace: {s[:200]!r}")
    return norm


def _etype(v: Any) -> EntryType:
    if v not in _TYPES:
        raise ProtocolError(f"agent sent an unknown entry type {v!r:.40}")
    return cast(EntryType, v)


class AgentSandbox(BackgroundMixin, Sandbox):
    """A :class:`~sandbox.base.Sandbox` whose work is done by the in-container agent."""

    def __init__(
        self,
        workspace: Path,
        connect: Connector,
        *,
        io_timeout: float = 30.0,
        on_exec_lost: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        """``on_exec_lost`` is awaited when the agent dies or stops answering while it
        runs a command: the command may have escaped the agent's tree-kill (it killed or
        froze its agent), so the backend resets the sandbox. It returns ``"reset"`` when it
        did, ``"oom"`` when the engine had killed the sandbox for memory (the result is
        then the command's ``oom``), None when it could not tell or do anything."""
        self.workspace = workspace
        self._connect = connect
        self._on_exec_lost = on_exec_lost
        self._conn: AgentConnection | None = None
        self._conn_lock = asyncio.Lock()
        self._exec_lock = asyncio.Lock()
        self._io_timeout = io_timeout
        self.restarts = 0

    async def connection(self) -> AgentConnection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        async with self._conn_lock:
            if self._conn is None or self._conn.closed:
                lost = self._conn is not None
                if lost:
                    self.restarts += 1
                self._conn = await self._connect(lost)
            return self._conn

    async def _call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        conn = await self.connection()
        return await conn.request(op, args, timeout=(timeout or self._io_timeout) + DEADLINE_SLACK)

    # -- file primitives -------------------------------------------------------------

    async def read(
        self,
        path: str,
        *,
        offset: int = 0,
        length: int | None = None,
        line_range: tuple[int, int] | None = None,
        max_bytes: int = 1 << 20,
    ) -> ReadResult:
        max_bytes = max(0, min(max_bytes, protocol.MAX_READ_BYTES))
        args: dict[str, Any] = {"path": path, "offset": offset, "length": length, "max_bytes": max_bytes}
        if line_range is not None:
            args["line_range"] = [int(line_range[0]), int(line_range[1])]
        r = await self._call("read", args)
        data = _b64(r.get("data"), "data", max_bytes)
        if len(data) > max_bytes:
            raise ProtocolError("agent returned more bytes than requested")
        digest = r.get("sha256")
        if digest is not None:
            _str(digest, "sha256", limit=64)
        return ReadResult(
            data=data,
            size=_int(r.get("size"), "size"),
            truncated=bool(r.get("truncated")),
            sha256=digest,
            mtime_ns=_int(r.get("mtime_ns"), "mtime_ns", lo=-(1 << 62)),
            binary=bool(r.get("binary")),
            total_lines=_opt_int(r.get("total_lines"), "total_lines"),
        )

    async def write(
        self,
        path: str,
        data: bytes,
        *,
        expect_sha256: str | None = None,
        expect_absent: bool = False,
        mkdirs: bool = True,
        fsync: bool = True,
        mode: int | None = None,
    ) -> WriteResult:
        args = {
            "mode": mode,
            "fsync": fsync,
            "path": path,
            "data": base64.b64encode(data).decode(),
            "expect_sha256": expect_sha256,
            "expect_absent": expect_absent,
            "mkdirs": mkdirs,
        }
        r = await self._call("write", args)
        return WriteResult(
            size=_int(r.get("size"), "size"),
            sha256=_str(r.get("sha256"), "sha256", limit=64),
            created=bool(r.get("created")),
        )

    async def stage_write(
        self,
        path: str,
        data: bytes,
        *,
        expect_sha256: str | None = None,
        expect_absent: bool = False,
        fsync: bool = True,
        token: str | None = None,
        mode: int | None = None,
    ) -> StagedWrite:
        args = {
            "mode": mode,
            "fsync": fsync,
            "path": path,
            "data": base64.b64encode(data).decode(),
            "expect_sha256": expect_sha256,
            "expect_absent": expect_absent,
            "mkdirs": True,
            "stage": True,
            "token": token,
        }
        conn = await self.connection()
        r = await conn.request("write", args, timeout=self._io_timeout + DEADLINE_SLACK)
        mode = r.get("mode")
        got = _str(r.get("staged"), "staged", limit=64)
        if token is not None and got != token:
            await conn.request("abort", {"staged": got}, timeout=self._io_timeout + DEADLINE_SLACK)
            raise ProtocolError("agent staged the write under another token")
        return StagedWrite(
            token=got,
            path=_relpath(r.get("path")),
            mode=None if mode is None else _int(mode, "mode"),
        )

    async def commit_write(self, staged: StagedWrite | str, *, expect_path: str | None = None) -> WriteResult:
        # Staged files live in the agent that staged them (it removes them when it exits),
        # so a commit on a fresh connection finds nothing: the agent says so.
        token = staged.token if isinstance(staged, StagedWrite) else staged
        args: dict[str, Any] = {"staged": token}
        if expect_path is not None:
            args["expect_path"] = expect_path
        r = await self._call("commit", args)
        return WriteResult(
            size=_int(r.get("size"), "size"),
            sha256=_str(r.get("sha256"), "sha256", limit=64),
            created=bool(r.get("created")),
        )

    async def abort_write(self, staged: StagedWrite | str) -> None:
        token = staged.token if isinstance(staged, StagedWrite) else staged
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                await conn.request("abort", {"staged": token}, timeout=self._io_timeout + DEADLINE_SLACK)
            except AgentError:
                pass  # already committed, aborted or expired

    async def remove(self, path: str, *, expect_sha256: str | None = None) -> bool:
        r = await self._call("remove", {"path": path, "expect_sha256": expect_sha256})
        return bool(r.get("removed"))

    async def mkdir(self, path: str, *, mode: int | None = None) -> bool:
        args: dict[str, Any] = {"path": path}
        if mode is not None:
            args["mode"] = mode & 0o7777
        r = await self._call("mkdir", args)
        return bool(r.get("created"))

    async def remove_tree(self, path: str) -> TreeRemoval:
        # Generous: a tree of 100,000 files takes seconds (more under gVisor).
        r = await self._call("remove_tree", {"path": path}, timeout=max(self._io_timeout, 600.0))
        return TreeRemoval(
            removed=bool(r.get("removed")),
            files=_int(r.get("files", 0), "files"),
            dirs=_int(r.get("dirs", 0), "dirs"),
            bytes=_int(r.get("bytes", 0), "bytes"),
        )

    async def chmod(self, path: str, mode: int) -> None:
        await self._call("chmod", {"path": path, "mode": mode & 0o7777})

    async def symlink(self, path: str, target: str) -> None:
        await self._call("symlink", {"path": path, "target": target})

    async def stat(self, path: str) -> FileStat:
        r = await self._call("stat", {"path": path})
        target = r.get("target")
        return FileStat(
            path=_relpath(r.get("path")),
            type=_etype(r.get("type")),
            size=_int(r.get("size"), "size"),
            mtime_ns=_int(r.get("mtime_ns"), "mtime_ns", lo=-(1 << 62)),
            mode=_int(r.get("mode"), "mode"),
            target=None if target is None else _str(target, "target", limit=8192),
        )

    async def list(
        self,
        path: str = ".",
        *,
        depth: int = 2,
        exclude: tuple[str, ...] = DEFAULT_EXCLUDES,
        max_entries: int = 5000,
    ) -> ListResult:
        r = await self._call(
            "list", {"path": path, "depth": depth, "exclude": list(exclude), "max_entries": max_entries}
        )
        raw = r.get("entries")
        if not isinstance(raw, list) or len(raw) > max_entries:
            raise ProtocolError("agent sent an invalid listing")
        entries = []
        for item in raw:
            if not isinstance(item, list) or len(item) != 4:
                raise ProtocolError("agent sent an invalid listing entry")
            entries.append(
                ListEntry(
                    path=_relpath(item[0]),
                    type=_etype(item[1]),
                    size=_int(item[2], "size"),
                    depth=_int(item[3], "depth", lo=1),
                )
            )
        return ListResult(entries=entries, truncated=bool(r.get("truncated")))

    async def search(
        self,
        pattern: str,
        *,
        path: str = ".",
        glob: str | None = None,
        max_matches: int = 200,
        exclude: tuple[str, ...] = DEFAULT_EXCLUDES,
        ignore_case: bool = False,
        timeout: float = 30.0,
    ) -> SearchResult:
        r = await self._call(
            "search",
            {
                "pattern": pattern,
                "path": path,
                "glob": glob,
                "max_matches": max_matches,
                "exclude": list(exclude),
                "ignore_case": ignore_case,
            },
            timeout=timeout,
        )
        raw = r.get("matches")
        if not isinstance(raw, list) or len(raw) > max_matches:
            raise ProtocolError("agent sent an invalid search result")
        matches = []
        for item in raw:
            if not isinstance(item, list) or len(item) != 3:
                raise ProtocolError("agent sent an invalid match")
            matches.append(
                SearchMatch(
                    path=_relpath(item[0]),
                    line=_int(item[1], "line", lo=1),
                    text=_str(item[2], "text", limit=8192),
                )
            )
        return SearchResult(
            matches=matches,
            truncated=bool(r.get("truncated")),
            engine=_str(r.get("engine"), "engine", limit=20),
        )

    async def scan(
        self,
        path: str = ".",
        *,
        exclude: tuple[str, ...] = (),
        max_files: int = 100_000,
        snapshot: str | None = None,
        since: str | None = None,
        timeout: float = 60.0,
        walk: bool = False,
    ) -> ScanResult:
        req = {
            "path": path,
            "exclude": list(exclude),
            "max_files": max_files,
            "snapshot": snapshot,
            "since": since,
            "walk": walk,
        }
        return _scan_result(await self._scan(req, timeout), max_files)

    async def _scan(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The unchecked answer to a scan request (gVisor sandboxes answer some on the host)."""
        return await self._call("scan", req, timeout=timeout)

    async def hash(self, paths: builtins.list[str]) -> dict[str, str | None]:
        r = await self._call("hash", {"paths": list(paths)}, timeout=max(self._io_timeout, len(paths) * 0.1))
        raw = r.get("hashes")
        if not isinstance(raw, dict):
            raise ProtocolError("agent sent an invalid hash map")
        out: dict[str, str | None] = {}
        for p in paths:
            v = raw.get(p)
            out[p] = None if v is None else _str(v, "sha256", limit=64)
        return out

    async def spawn(
        self, argv: builtins.list[str], *, cwd: str = ".", env: dict[str, str] | None = None
    ) -> SandboxProcess:
        """Start a long-lived process (its own session) with streamed stdin/stdout.

        Raises PathNotFoundError for a missing program or cwd, SandboxLostError.
        """
        conn = await self.connection()
        r = await conn.request("spawn", {"argv": list(argv), "cwd": cwd, "env": env or {}}, timeout=30)
        return SandboxProcess(conn, _int(r.get("proc"), "proc", lo=1))

    async def info(self) -> AgentInfo:
        r = await self._call("hello", {})
        return agent_info(r)

    async def open_tunnel(self, port: int) -> Tunnel:
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise ValueError("port must be 1-65535")
        conn = await self.connection()
        return await SandboxTunnel.open(conn, port, timeout=self._io_timeout + DEADLINE_SLACK)

    # -- exec ------------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        *,
        cwd: str = ".",
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        max_output: int = 256 * 1024,
        argv: builtins.list[str] | None = None,
        output_limit: int = 64 << 20,
        scan: ScanRequest | None = None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ExecResult:
        # One command at a time per connection: the agent kills the whole process subtree
        # it owns when a command ends, so two commands must not share it.
        async with self._exec_lock:
            started = time.monotonic()
            args: dict[str, Any] = {
                "command": command,
                "cwd": cwd,
                "timeout": timeout,
                "env": env or {},
                "max_output": max_output,
                "output_limit": output_limit,
            }
            if argv is not None:
                args["argv"] = argv
            if scan is not None:
                args["scan"] = {
                    "snapshot": scan.snapshot,
                    "since": scan.since,
                    "path": scan.path,
                    "exclude": list(scan.exclude),
                    "max_files": scan.max_files,
                }
            on_event = None
            if on_output is not None:
                args["stream"] = True
                on_event = _output_events(on_output)
            deadline = timeout + 2.0 + (30.0 if scan is not None else 0.0) + DEADLINE_SLACK
            try:
                # The agent kills the command at ``timeout`` and needs its TERM grace on top.
                conn = await self.connection()
                sent = None
                if control is not None:

                    def sent(rid: int) -> None:
                        async def send(sig: int) -> None:
                            await conn.notify("exec_signal", {"req": rid, "signal": sig})

                        control.bind(send)

                try:
                    r = await conn.request("exec", args, timeout=deadline, on_event=on_event, on_sent=sent)
                finally:
                    if control is not None:
                        control.bind(None)
            except (SandboxLostError, SandboxTimeoutError) as e:
                detail = str(e)
                why = await self._on_exec_lost() if self._on_exec_lost is not None else None
                if why == "oom":
                    # The engine killed the whole sandbox for memory (gVisor's sentry is one
                    # process to the host's cgroup): the command's own doing, a limit hit.
                    return ExecResult(
                        exit_code=None,
                        stdout=b"",
                        stderr=b"",
                        outcome="oom",
                        duration_ms=(time.monotonic() - started) * 1000.0,
                        truncated=False,
                        signal=9,
                    )
                if why is not None:
                    detail += (
                        "; the sandbox was restarted, so no process the command started is left "
                        "(the workspace's files are kept)"
                    )
                return ExecResult(
                    exit_code=None,
                    stdout=b"",
                    stderr=detail.encode(),
                    outcome="sandbox_lost",
                    duration_ms=(time.monotonic() - started) * 1000.0,
                    truncated=False,
                )
            if scan is not None and r.get("ran") is False:
                raise ScanFirst(_scan_result(r.get("scan"), scan.max_files))
            scan_after = None
            if scan is not None and r.get("scan") is not None:
                scan_after = _scan_result(r.get("scan"), scan.max_files)
            outcome = r.get("outcome")
            if outcome not in _OUTCOMES:
                raise ProtocolError(f"agent sent an unknown outcome {outcome!r:.40}")
            limit = max_output + 256
            sig = r.get("signal")
            duration = r.get("duration_ms")
            if not isinstance(duration, int | float) or isinstance(duration, bool):
                raise ProtocolError("agent sent an invalid duration")
            return ExecResult(
                exit_code=_opt_int(r.get("exit_code"), "exit_code"),
                stdout=_b64(r.get("stdout"), "stdout", limit),
                stderr=_b64(r.get("stderr"), "stderr", limit),
                outcome=cast(Outcome, outcome),
                duration_ms=float(duration),
                truncated=bool(r.get("truncated")),
                signal=None if sig is None else _int(sig, "signal"),
                stdout_bytes=_int(r.get("stdout_bytes", 0), "stdout_bytes"),
                stderr_bytes=_int(r.get("stderr_bytes", 0), "stderr_bytes"),
                scan_after=scan_after,
                disk_used=_opt_int(r.get("disk_used"), "disk_used"),
            )

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


def _output_events(on_output: OutputCallback) -> Callable[[dict[str, Any]], None]:
    """The handler of a streamed command's ``output`` events: checked, decoded, handed on."""

    def on_event(msg: dict[str, Any]) -> None:
        if msg.get("event") != "output":
            return  # "lost": the exec call itself reports it
        stream = msg.get("stream")
        if stream not in ("stdout", "stderr"):
            raise ProtocolError(f"agent sent output of an unknown stream {stream!r:.40}")
        data = _b64(msg.get("data"), "output", 1 << 20)
        if data:
            on_output(stream, data)

    return on_event


def _scan_result(r: Any, max_files: int) -> ScanResult:
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
                path=_relpath(item[0]),
                type=_etype(item[1]),
                size=_int(item[2], "size"),
                mtime_ns=_int(item[3], "mtime_ns", lo=-(1 << 62)),
                ino=_int(item[4], "ino"),
                mode=_int(item[5], "mode"),
            )
        )
    return ScanResult(
        entries=entries,
        removed=[_relpath(p) for p in removed],
        full=bool(r.get("full")),
        watched=r.get("watched") is True,
        from_events=r.get("from_events") is True,
        truncated=bool(r.get("truncated")),
        generation=_str(r.get("generation", ""), "generation", limit=64),
    )


def agent_info(r: dict[str, Any]) -> AgentInfo:
    """Validate an agent's hello."""
    return AgentInfo(
        version=_str(r.get("version"), "version", limit=40),
        uid=_int(r.get("uid"), "uid"),
        gid=_int(r.get("gid"), "gid"),
        pid=_int(r.get("pid"), "pid"),
        python=_str(r.get("python"), "python", limit=40),
        kernel=_str(r.get("kernel"), "kernel", limit=200),
        subreaper=bool(r.get("subreaper")),
        ripgrep=bool(r.get("ripgrep")),
        extra=_hello_extra(r),
    )


def _hello_extra(r: dict[str, Any]) -> dict[str, object]:
    """The hello's optional facts: the CPU quota, the seccomp mode (2: a filter)."""
    extra: dict[str, object] = {}
    if isinstance(q := r.get("cpu_quota"), int | float) and not isinstance(q, bool):
        extra["cpu_quota"] = q
    if isinstance(m := r.get("seccomp"), int) and not isinstance(m, bool):
        extra["seccomp"] = m
    return extra
