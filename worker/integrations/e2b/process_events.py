"""envd's process messages, made from what loom knows of a process: the events of a
``Start``/``Connect`` stream (``process.ProcessEvent``), how a process ended as envd
says it (Go's ``os.ProcessState``: ``exit status 1``, ``signal: killed``), and the
errors E2B's SDK maps to its exceptions (``connectrpc.errors.ConnectError``).

Pure functions over the SDK's generated messages (``e2b.envd.process.process_pb``);
nothing here touches a sandbox.
"""

from __future__ import annotations

import signal as signals
from dataclasses import dataclass
from typing import Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_pb as pb
from protobuf import Oneof

from sandbox.base import ProcessInfo

from ...harness.results import ExecOutput

#: Go's names of the signals (``syscall.Signal.String()``), as envd's ``status`` says
#: them: ``signal: killed``.
_GO_SIGNAL_NAMES: dict[int, str] = {
    signals.SIGHUP: "hangup",
    signals.SIGINT: "interrupt",
    signals.SIGQUIT: "quit",
    signals.SIGILL: "illegal instruction",
    signals.SIGTRAP: "trace/breakpoint trap",
    signals.SIGABRT: "aborted",
    signals.SIGBUS: "bus error",
    signals.SIGFPE: "floating point exception",
    signals.SIGKILL: "killed",
    signals.SIGUSR1: "user defined signal 1",
    signals.SIGSEGV: "segmentation fault",
    signals.SIGUSR2: "user defined signal 2",
    signals.SIGPIPE: "broken pipe",
    signals.SIGALRM: "alarm clock",
    signals.SIGTERM: "terminated",
    signals.SIGXCPU: "CPU time limit exceeded",
    signals.SIGXFSZ: "file size limit exceeded",
}


@dataclass(frozen=True)
class Ended:
    """How a process ended, in envd's words (``process.ProcessEvent.EndEvent``)."""

    exit_code: int
    exited: bool
    status: str
    error: str | None = None
    #: loom's time limit ended it.
    timed_out: bool = False

    def message(self) -> pb.ProcessEvent.EndEvent:
        if self.error is None:
            return pb.ProcessEvent.EndEvent(exit_code=self.exit_code, exited=self.exited, status=self.status)
        return pb.ProcessEvent.EndEvent(
            exit_code=self.exit_code, exited=self.exited, status=self.status, error=self.error
        )


def exited(code: int) -> Ended:
    """A process that exited with ``code`` (envd: an error only when it is not 0)."""
    status = f"exit status {code}"
    return Ended(code, True, status, None if code == 0 else status)


def signalled(sig: int, why: str | None = None, *, timed_out: bool = False) -> Ended:
    """A process ended by signal ``sig`` (Go: exit code -1, not exited); ``why`` says who
    sent it when loom did (a time limit, memory), after Go's own words."""
    status = f"signal: {_GO_SIGNAL_NAMES.get(sig, f'signal {sig}')}"
    return Ended(-1, False, status, status if why is None else f"{status} ({why})", timed_out)


def _timed_out(limit: float | None) -> Ended:
    why = f"loom ended it at its time limit of {limit:g} s" if limit else None
    return signalled(signals.SIGKILL, why, timed_out=True)


def from_info(info: ProcessInfo, limit: float | None) -> Ended:
    """How loom's background process ``info`` ended, as envd says it; ``limit``: the time
    limit loom enforced on it (seconds), named when that ended it."""
    if info.outcome == "timeout":
        return _timed_out(limit)
    if info.outcome == "oom":
        return signalled(signals.SIGKILL, "out of memory: the sandbox's memory limit was reached")
    if info.outcome == "signal" or info.signal is not None:
        return signalled(info.signal or signals.SIGKILL)
    return exited(info.exit_code if info.exit_code is not None else -1)


def from_exec(res: ExecOutput, limit: float | None) -> Ended:
    """How a command run by the harness's ``exec`` ended (another user's), as envd says it."""
    if res.outcome == "timeout":
        return _timed_out(limit)
    if res.outcome == "oom":
        return signalled(signals.SIGKILL, "out of memory: the sandbox's memory limit was reached")
    if res.outcome == "output_limit":
        return signalled(signals.SIGKILL, "it printed more than loom's output limit")
    if res.outcome == "disk_limit":
        return signalled(signals.SIGKILL, "it used more than the workspace's disk limit")
    if res.outcome == "signal" or res.signal is not None:
        return signalled(res.signal or signals.SIGKILL)
    code = res.returncode if res.returncode is not None else -1
    if res.launch_error is not None or res.outcome != "exit":  # (could not start; refused)
        return Ended(code, True, f"exit status {code}", res.stderr.decode("utf-8", "replace").strip() or None)
    return exited(code)


# -- the stream's events -----------------------------------------------------------------

Event = pb.ProcessEvent


def start_event(pid: int) -> Event:
    start: Oneof[Literal["start"], pb.ProcessEvent.StartEvent] = Oneof("start", pb.ProcessEvent.StartEvent(pid=pid))
    return pb.ProcessEvent(event=start)


def data_event(stream: str, data: bytes) -> Event:
    """``stream``: ``stdout``, ``stderr`` or ``pty``."""
    if stream == "stdout":
        stdout: Oneof[Literal["stdout"], bytes] = Oneof("stdout", data)
        out = pb.ProcessEvent.DataEvent(output=stdout)
    elif stream == "stderr":
        stderr: Oneof[Literal["stderr"], bytes] = Oneof("stderr", data)
        out = pb.ProcessEvent.DataEvent(output=stderr)
    else:
        pty: Oneof[Literal["pty"], bytes] = Oneof("pty", data)
        out = pb.ProcessEvent.DataEvent(output=pty)
    event: Oneof[Literal["data"], pb.ProcessEvent.DataEvent] = Oneof("data", out)
    return pb.ProcessEvent(event=event)


def end_event(ended: Ended) -> Event:
    end: Oneof[Literal["end"], pb.ProcessEvent.EndEvent] = Oneof("end", ended.message())
    return pb.ProcessEvent(event=end)


def keepalive_event() -> Event:
    ka: Oneof[Literal["keepalive"], pb.ProcessEvent.KeepAlive] = Oneof("keepalive", pb.ProcessEvent.KeepAlive())
    return pb.ProcessEvent(event=ka)


# -- errors --------------------------------------------------------------------------------


def not_found(selector: pb.ProcessSelector | None) -> ConnectError:
    """envd's answer for a process it does not have."""
    sel = selector.selector if selector is not None else None
    if sel is not None and sel.field == "tag":
        return ConnectError(Code.NOT_FOUND, f"process with tag {sel.value} not found")
    pid = sel.value if sel is not None else 0
    return ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found")


def sandbox_gone(sandbox_id: str, detail: str = "") -> ConnectError:
    """A sandbox that does not exist (killed, or never made): E2B's proxy says "was not
    found", which its SDK turns into ``SandboxNotRunningException``."""
    more = f": {detail}" if detail else ""
    return ConnectError(Code.UNAVAILABLE, f"The sandbox {sandbox_id} was not found{more}")


def unavailable(sandbox_id: str, detail: str) -> ConnectError:
    """The sandbox's container cannot be reached now, or was lost mid-call
    (infrastructure: never a command's own failure)."""
    return ConnectError(Code.UNAVAILABLE, f"sandbox {sandbox_id} is unavailable: {detail}")
