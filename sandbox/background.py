"""Background processes on an agent sandbox: the host's side of ``proc_*`` (see
``sandbox/agent/processes.py``). Every answer is checked as untrusted, like the others."""

from __future__ import annotations

import base64
import binascii
import builtins
from typing import Any, cast

from .base import Outcome, ProcessInfo, ProcessOutput
from .errors import ProtocolError
from .results import ProcessAttach
from .tunnel import SandboxTunnel, Tunnel

_OUTCOMES = {"exit", "timeout", "signal", "oom"}


def _num(v: Any, name: str, *, optional: bool = False) -> Any:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ProtocolError(f"agent sent an invalid {name}")
    return v


def process_info(r: Any) -> ProcessInfo:
    """Raises ProtocolError."""
    if not isinstance(r, dict) or not isinstance(r.get("id"), str) or not isinstance(r.get("command"), str):
        raise ProtocolError("agent sent an invalid process")
    outcome = r.get("outcome")
    if outcome is not None and outcome not in _OUTCOMES:
        raise ProtocolError("agent sent an invalid process outcome")
    pid = _num(r.get("pid"), "pid", optional=True)
    code = _num(r.get("exit_code"), "exit code", optional=True)
    sig = _num(r.get("signal"), "signal", optional=True)
    ended = _num(r.get("ended"), "end time", optional=True)
    pty = r.get("pty")
    size = None
    if pty is not None:
        if not isinstance(pty, dict):
            raise ProtocolError("agent sent an invalid terminal size")
        size = (int(_num(pty.get("cols"), "terminal size")), int(_num(pty.get("rows"), "terminal size")))
    return ProcessInfo(
        id=r["id"][:64],
        command=r["command"][:100_000],
        pid=None if pid is None else int(pid),
        started=float(_num(r.get("started"), "start time")),
        running=bool(r.get("running")),
        ended=None if ended is None else float(ended),
        exit_code=None if code is None else int(code),
        outcome=cast("Outcome | None", outcome),
        signal=None if sig is None else int(sig),
        stdout_bytes=int(_num(r.get("stdout_bytes", 0), "byte count")),
        stderr_bytes=int(_num(r.get("stderr_bytes", 0), "byte count")),
        pty=size,
    )


def _pair(v: Any, name: str) -> tuple[int, int]:
    if not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, int) and x >= 0 for x in v):
        raise ProtocolError(f"agent sent an invalid {name}")
    return int(v[0]), int(v[1])


def _bytes(v: Any, limit: int) -> bytes:
    if not isinstance(v, str) or len(v) > limit * 4 // 3 + 8:
        raise ProtocolError("agent sent invalid output")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("agent sent invalid output") from None


def process_output(r: Any, max_bytes: int) -> ProcessOutput:
    """Raises ProtocolError."""
    return ProcessOutput(
        info=process_info(r),
        stdout=_bytes(r.get("stdout"), max_bytes),
        stderr=_bytes(r.get("stderr"), max_bytes),
        cursor=_pair(r.get("cursor"), "cursor"),
        dropped=_pair(r.get("dropped"), "dropped count"),
        done=bool(r.get("done")),
    )


def process_attach(r: Any) -> ProcessAttach:
    """Raises ProtocolError."""
    if not isinstance(r, dict):
        raise ProtocolError("agent sent an invalid attach answer")
    return ProcessAttach(
        info=process_info(r),
        cursor=int(_num(r.get("cursor"), "cursor")),
        dropped=int(_num(r.get("dropped", 0), "dropped count")),
    )


class BackgroundMixin:
    """The background-process methods of :class:`~sandbox.client.AgentSandbox` (a
    terminal's too: :class:`~sandbox.capabilities.Terminals`)."""

    async def _call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        raise NotImplementedError  # pragma: no cover - AgentSandbox's

    async def connection(self) -> Any:
        raise NotImplementedError  # pragma: no cover - AgentSandbox's

    async def start_process(
        self,
        process_id: str,
        command: str,
        *,
        cwd: str = ".",
        timeout: float = 3600.0,
        env: dict[str, str] | None = None,
        max_running: int = 8,
        head: int = 64 << 10,
        tail: int = 1 << 20,
        linger: float = 600.0,
        idle: float = 0.0,
        argv: builtins.list[str] | None = None,
        pty: tuple[int, int] | None = None,
    ) -> ProcessInfo:
        args: dict[str, Any] = {
            "proc_id": process_id,
            "command": command,
            "argv": argv,
            "cwd": cwd,
            "timeout": timeout,
            "env": env or {},
            "max_running": max_running,
            "head": head,
            "tail": tail,
            "linger": linger,
            "idle": idle,
        }
        if pty is not None:
            args["pty"] = {"cols": pty[0], "rows": pty[1]}
        return process_info(await self._call("proc_start", args, timeout=30.0))

    async def process_output(
        self,
        process_id: str,
        *,
        since: tuple[int, int] | None = None,
        wait: float = 0.0,
        max_bytes: int = 1 << 20,
    ) -> ProcessOutput:
        since_arg = None if since is None else list(since)
        args = {"proc_id": process_id, "since": since_arg, "wait_ms": int(wait * 1000), "max": max_bytes}
        return process_output(await self._call("proc_output", args, timeout=wait + 10.0), max_bytes)

    async def process_input(self, process_id: str, data: bytes, *, eof: bool = False) -> int:
        r = await self._call(
            "proc_input", {"proc_id": process_id, "data": base64.b64encode(data).decode(), "eof": eof}, timeout=10.0
        )
        return int(_num(r.get("written"), "byte count"))

    async def process_kill(self, process_id: str, *, signal: int = 15, grace: float = 0.5) -> ProcessInfo:
        args = {"proc_id": process_id, "signal": signal, "grace": grace}
        r = await self._call("proc_kill", args, timeout=grace + 40.0)
        return process_info(r)

    async def start_terminal(
        self,
        process_id: str,
        argv: builtins.list[str] | None,
        *,
        cols: int,
        rows: int,
        cwd: str = ".",
        env: dict[str, str] | None = None,
        timeout: float = 86_400.0,
        idle: float = 0.0,
        max_running: int = 8,
        scrollback: int = 256 << 10,
        linger: float = 600.0,
    ) -> ProcessInfo:
        shown = " ".join(argv) if argv else ""
        return await self.start_process(
            process_id,
            shown,
            argv=argv or None,
            pty=(cols, rows),
            cwd=cwd,
            env=env,
            timeout=timeout,
            idle=idle,
            max_running=max_running,
            head=0,
            tail=scrollback,
            linger=linger,
        )

    async def process_signal(self, process_id: str, signal: int) -> ProcessInfo:
        r = await self._call("proc_signal", {"proc_id": process_id, "signal": int(signal)}, timeout=15.0)
        return process_info(r)

    async def process_resize(self, process_id: str, cols: int, rows: int) -> ProcessInfo:
        r = await self._call("proc_resize", {"proc_id": process_id, "cols": cols, "rows": rows}, timeout=15.0)
        return process_info(r)

    async def attach_process(self, process_id: str, *, since: int | None = None) -> tuple[Tunnel, ProcessAttach]:
        conn = await self.connection()
        tunnel, answer = await SandboxTunnel.open_process(conn, process_id, since)
        try:
            return tunnel, process_attach(answer)
        except ProtocolError:
            await tunnel.close()
            raise

    async def process_release(self, process_id: str) -> None:
        """Let an ended process go (its output is no longer kept). Raises AgentError."""
        await self._call("proc_release", {"proc_id": process_id}, timeout=5.0)

    async def processes(self) -> builtins.list[ProcessInfo]:
        r = await self._call("proc_list", {}, timeout=10.0)
        raw = r.get("processes")
        if not isinstance(raw, list):
            raise ProtocolError("agent sent an invalid process list")
        return sorted((process_info(p) for p in raw), key=lambda p: p.started)
