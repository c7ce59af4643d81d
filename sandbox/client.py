"""``Sandbox`` implemented over an agent connection, shared by every backend.

The connection is (re)opened lazily through ``connect``: when a call finds it lost, the
call fails with ``SandboxLostError`` (or ``outcome="sandbox_lost"`` for exec) and the next
call transparently gets a fresh agent, or a fresh container, from the backend.

Every answer is re-checked (:mod:`sandbox.answers`: types, sizes, workspace-relative
paths) because the agent runs next to untrusted code.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import protocol
from .answers import (
    agent_info,
    check_b64,
    check_entry_type,
    check_int,
    check_opt_int,
    check_relpath,
    check_stat,
    check_str,
    exec_result,
    list_result,
    output_events,
    scan_result,
    search_result,
)
from .background import BackgroundMixin
from .base import (
    DEFAULT_EXCLUDES,
    AgentInfo,
    ExecControl,
    ExecRequest,
    ExecResult,
    FileStat,
    ListResult,
    OutputCallback,
    ReadResult,
    Sandbox,
    ScanFirst,
    ScanResult,
    SearchResult,
    StagedWrite,
    TreeRemoval,
    WriteResult,
)
from .capabilities import (
    BackgroundProcesses,
    CodeKernels,
    HarnessFiles,
    HarnessTree,
    StagedWrites,
    Terminals,
    Tunnels,
)
from .connection import AgentConnection
from .errors import (
    AgentError,
    ProtocolError,
    SandboxLostError,
    SandboxTimeoutError,
    TooLargeError,
)
from .harness import HarnessMixin
from .kernels import KernelsMixin
from .process import SandboxProcess
from .treeops import TreeMixin
from .tunnel import AgentTunnel, SandboxTunnel

#: Opens a fresh agent connection; the flag is True when a previous one was lost.
Connector = Callable[[bool], Awaitable[AgentConnection]]

#: Host deadline = the operation's own budget + this slack for the round trip.
DEADLINE_SLACK = 5.0


class AgentSandbox(HarnessMixin, TreeMixin, BackgroundMixin, KernelsMixin, Sandbox):
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
        self._warming: asyncio.Task[AgentConnection] | None = None
        self._exec_lock = asyncio.Lock()
        self._io_timeout = io_timeout
        self.restarts = 0
        # Set by a backend that can see, on the host, OOM kills the agent cannot (gVisor):
        # the count of the sandbox's memory cgroup. See sandbox.docker.memcg.
        self.oom_counter: Callable[[], int | None] | None = None

    def warm(self) -> None:
        if self._conn is None and self._warming is None:
            self._warming = t = asyncio.create_task(self._open(), name="loom-sandbox-warm")
            # Its error is the first caller's to see; none may come (the call was refused).
            t.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def connection(self) -> AgentConnection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        warming, self._warming = self._warming, None
        if warming is not None and not warming.cancelled() and (not warming.done() or warming.exception()):
            # The first caller after :meth:`warm` takes its outcome, its error included (so
            # a sandbox that cannot start is not started twice). Shielded: a caller given up
            # on (a timeout) does not cancel the start under every later caller.
            return await asyncio.shield(warming)
        return await self._open()

    async def _open(self) -> AgentConnection:
        """The connection, made (or made again after a loss) by one caller at a time."""
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
        args: dict[str, Any] = {
            "path": path,
            "offset": offset,
            "length": length,
            "max_bytes": max_bytes,
            "raw_out": True,
        }
        if line_range is not None:
            args["line_range"] = [int(line_range[0]), int(line_range[1])]
        r = await self._call("read", args)
        raw = r.get("_raw")
        data = raw if isinstance(raw, bytes) else check_b64(r.get("data"), "data", max_bytes)
        if len(data) > max_bytes:
            raise ProtocolError("agent returned more bytes than requested")
        digest = r.get("sha256")
        if digest is not None:
            check_str(digest, "sha256", limit=64)
        return ReadResult(
            data=data,
            size=check_int(r.get("size"), "size"),
            truncated=bool(r.get("truncated")),
            sha256=digest,
            mtime_ns=check_int(r.get("mtime_ns"), "mtime_ns", lo=-(1 << 62)),
            binary=bool(r.get("binary")),
            total_lines=check_opt_int(r.get("total_lines"), "total_lines"),
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
        override_mode: bool = False,
    ) -> WriteResult:
        if len(data) > protocol.MAX_RAW_REQUEST:
            # Too large for one request: staged in pieces, then put in place.
            staged = await self.stage_write(
                path,
                data,
                expect_sha256=expect_sha256,
                expect_absent=expect_absent,
                fsync=fsync,
                mode=mode,
                override_mode=override_mode,
                mkdirs=mkdirs,
            )
            return await self.commit_write(staged)
        args = {
            "mode": mode,
            "fsync": fsync,
            "path": path,
            "expect_sha256": expect_sha256,
            "expect_absent": expect_absent,
            "mkdirs": mkdirs,
            "bypass_permissions": override_mode,
        }
        conn = await self.connection()
        r = await conn.request("write", args, timeout=self._io_timeout + DEADLINE_SLACK, raw=data)
        return WriteResult(
            size=check_int(r.get("size"), "size"),
            sha256=check_str(r.get("sha256"), "sha256", limit=64),
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
        override_mode: bool = False,
        mkdirs: bool = True,
    ) -> StagedWrite:
        piece = protocol.MAX_RAW_REQUEST
        args = {
            "mode": mode,
            "fsync": fsync,
            "path": path,
            "expect_sha256": expect_sha256,
            "expect_absent": expect_absent,
            "mkdirs": mkdirs,
            "stage": True,
            "token": token,
            "bypass_permissions": override_mode,
        }
        if len(data) > piece:
            args.update(more=True, total=len(data))
        conn = await self.connection()
        deadline = self._io_timeout + DEADLINE_SLACK
        r = await conn.request("write", args, timeout=deadline, raw=data if len(data) <= piece else data[:piece])
        mode = r.get("mode")
        got = check_str(r.get("staged"), "staged", limit=64)
        if token is not None and got != token:
            await conn.request("abort", {"staged": got}, timeout=deadline)
            raise ProtocolError("agent staged the write under another token")
        for start in range(piece, len(data), piece):
            more = {"staged": got, "last": start + piece >= len(data)}
            try:
                await conn.request("append", more, timeout=deadline, raw=data[start : start + piece])
            except AgentError:
                with contextlib.suppress(AgentError):
                    await conn.request("abort", {"staged": got}, timeout=deadline)
                raise
        return StagedWrite(
            token=got,
            path=check_relpath(r.get("path")),
            mode=None if mode is None else check_int(mode, "mode"),
        )

    async def commit_write(
        self, staged: StagedWrite | str, *, expect_path: str | None = None, snapshot: str | None = None
    ) -> WriteResult:
        token = staged.token if isinstance(staged, StagedWrite) else staged
        asked = (("staged", token), ("expect_path", expect_path), ("snapshot", snapshot))
        r = await self._call("commit", {k: v for k, v in asked if v is not None})
        return WriteResult(
            size=check_int(r.get("size"), "size"),
            sha256=check_str(r.get("sha256"), "sha256", limit=64),
            created=bool(r.get("created")),
            stat=check_stat(r.get("stat")),
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
            files=check_int(r.get("files", 0), "files"),
            dirs=check_int(r.get("dirs", 0), "dirs"),
            bytes=check_int(r.get("bytes", 0), "bytes"),
        )

    async def chmod(self, path: str, mode: int) -> None:
        await self._call("chmod", {"path": path, "mode": mode & 0o7777})

    async def symlink(self, path: str, target: str) -> None:
        await self._call("symlink", {"path": path, "target": target})

    async def stat(self, path: str) -> FileStat:
        r = await self._call("stat", {"path": path})
        target = r.get("target")
        return FileStat(
            path=check_relpath(r.get("path")),
            type=check_entry_type(r.get("type")),
            size=check_int(r.get("size"), "size"),
            mtime_ns=check_int(r.get("mtime_ns"), "mtime_ns", lo=-(1 << 62)),
            mode=check_int(r.get("mode"), "mode"),
            target=None if target is None else check_str(target, "target", limit=8192),
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
        return list_result(r, max_entries)

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
        return search_result(r, max_matches)

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
        return scan_result(await self._scan(req, timeout), max_files)

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
            out[p] = None if v is None else check_str(v, "sha256", limit=64)
        return out

    async def spawn(
        self, argv: builtins.list[str], *, cwd: str = ".", env: dict[str, str] | None = None
    ) -> SandboxProcess:
        """Start a long-lived process (its own session) with streamed stdin/stdout.

        Raises PathNotFoundError for a missing program or cwd, SandboxLostError.
        """
        conn = await self.connection()
        r = await conn.request("spawn", {"argv": list(argv), "cwd": cwd, "env": env or {}}, timeout=30)
        return SandboxProcess(conn, check_int(r.get("proc"), "proc", lo=1))

    async def lost_reason(self) -> str | None:
        """After a stream into this sandbox ended unexpectedly (a kernel's bridge), whether
        the sandbox itself went: None when its agent still answers; else what the backend
        found as it reset it (the next call starts a fresh one): ``"oom"`` (the engine
        killed it for memory), ``"reset"``, or ``"lost"`` (it could not tell)."""
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                await conn.request("hello", {}, timeout=10.0)
                return None
            except (SandboxLostError, SandboxTimeoutError):
                pass
        why = await self._on_exec_lost() if self._on_exec_lost is not None else None
        return why or "lost"

    async def info(self) -> AgentInfo:
        r = await self._call("hello", {})
        return agent_info(r)

    async def open_tunnel(self, port: int) -> AgentTunnel:
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise ValueError("port must be 1-65535")
        conn = await self.connection()
        return await SandboxTunnel.open(conn, port, timeout=self._io_timeout + DEADLINE_SLACK)

    # -- exec ------------------------------------------------------------------------

    async def exec(
        self,
        request: ExecRequest,
        *,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ExecResult:
        if request.user is not None:
            box = await self.as_user(request.user)
            if isinstance(box, ExecResult):
                return box  # no such user: the command's failure to start
            if box is not self:
                # Its scans belong to this agent's snapshot: the caller makes them around it.
                return await box.exec(replace(request, user=None, scan=None), on_output=on_output, control=control)
        stdin, scan, timeout = request.stdin, request.scan, request.timeout
        if stdin is not None and len(stdin) > protocol.MAX_RAW_REQUEST:
            raise TooLargeError(
                f"stdin of {len(stdin)} bytes is more than the {protocol.MAX_RAW_REQUEST} bytes a command "
                "may be given: write it to a file first",
                code="too_large",
            )
        # One command at a time per connection: the agent kills the whole process subtree
        # it owns when a command ends, so two commands must not share it.
        async with self._exec_lock:
            started = time.monotonic()
            max_output = max(0, min(request.max_output, protocol.MAX_EXEC_OUTPUT))
            args: dict[str, Any] = {
                "command": request.command,
                "cwd": request.cwd,
                "timeout": timeout,
                "env": request.env or {},
                "max_output": max_output,
                "output_limit": request.output_limit,
                "raw_out": True,
            }
            if request.argv is not None:
                args["argv"] = request.argv
            if request.any_cwd:
                args["cwd_any"] = True
            if stdin is not None:
                args["stdin"] = True
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
                on_event = output_events(on_output)
            deadline = timeout + 2.0 + (30.0 if scan is not None else 0.0) + DEADLINE_SLACK
            oom_before: int | None = None
            try:
                # The agent kills the command at ``timeout`` and needs its TERM grace on top.
                conn = await self.connection()
                counter = self.oom_counter
                oom_before = counter() if counter is not None else None
                sent = None
                if control is not None:

                    def sent(rid: int) -> None:
                        async def send(sig: int) -> None:
                            await conn.notify("exec_signal", {"req": rid, "signal": sig})

                        control.bind(send)

                try:
                    r = await conn.request("exec", args, timeout=deadline, on_event=on_event, on_sent=sent, raw=stdin)
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
                raise ScanFirst(scan_result(r.get("scan"), scan.max_files))
            result = exec_result(r, max_output, scan)
            if oom_before is not None and (
                result.outcome == "signal" or (result.outcome == "exit" and result.exit_code != 0)
            ):
                counter = self.oom_counter
                oom_after = counter() if counter is not None else None
                if oom_after is not None and oom_after > oom_before:
                    # the host's OOM killer, unseen inside
                    result = replace(result, outcome="oom", exit_code=None, signal=9)
            return result

    async def close(self) -> None:
        warming, self._warming = self._warming, None
        if warming is not None:
            warming.cancel()
            await asyncio.wait([warming])  # (its own error is not this close's)
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


if TYPE_CHECKING:

    def _capabilities(
        box: AgentSandbox,
    ) -> tuple[StagedWrites, BackgroundProcesses, Terminals, Tunnels, HarnessFiles, HarnessTree, CodeKernels]:
        return box, box, box, box, box, box, box  # mypy: every backend of this package has them all
