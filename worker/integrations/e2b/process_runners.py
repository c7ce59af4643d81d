"""How a process started through E2B's API runs in loom, one :class:`Runner` per process.

- :class:`BackgroundRunner`: the sandbox user's commands and PTYs. Each is one of loom's
  background processes of the workspace (``Workspace.start_background``, or
  ``Workspace.start_terminal`` for a PTY): it outlives the request that started it, runs
  beside any other (a server left running while other commands come and go), takes
  stdin, signals and a terminal size, and what it changes in the workspace is recorded
  in the changelog as that process's (its id is the entries' ``call_id``) when it ends.
  Its output is read by long polls (``process_output`` waits for something new), so a
  line reaches the client as soon as the process prints it.
- :class:`ExecRunner`: a command as another user of the image (``root`` where the
  workspace allows it): loom runs those through ``SandboxHandle.exec`` only (an agent of
  that user), so such a command has no stdin and no terminal, and holds the workspace's
  mutation lock while it runs, as loom's own harness commands do; its changes are
  recorded as the command's.

Each runner's :meth:`Runner.run` hands the output to a callback as it comes and returns
how the process ended (:class:`~.process_events.Ended`); it raises the sandbox's
infrastructure errors (``SandboxLostError``...) when the sandbox goes meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal as signals
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence

import structlog
from connectrpc.code import Code
from connectrpc.errors import ConnectError

from sandbox.base import ExecControl, ProcessInfo
from sandbox.capabilities import background, terminals
from sandbox.errors import AgentError, SandboxError

from ...background import new_process_id
from ...harness import SandboxHandle
from ...terminals import SCROLLBACK, new_terminal_id
from ...workspace import Workspace
from .process_events import Ended, from_exec, from_info

log = structlog.get_logger(__name__)

#: What one output event carries at most (envd reads 32 KiB at a time; a larger piece
#: would only make the client wait longer for its first bytes).
CHUNK = 64 << 10
#: Longest wait of one output poll: the process's end or output ends it sooner.
POLL_WAIT = 15.0

#: Called with each piece of output (``stdout``, ``stderr`` or ``pty``) as it comes.
Publish = Callable[[str, bytes], Awaitable[None]]


class Runner(ABC):
    """One running process's loom side."""

    #: The in-sandbox pid loom reports (None: loom has none, the caller makes one up).
    pid: int | None = None
    #: The time limit loom enforces, seconds.
    limit: float
    #: Killed, and loom says it ended (its end event may still be on its way): no longer
    #: listed nor addressable, as envd forgets a process once it is reaped.
    gone: bool = False

    @abstractmethod
    async def run(self, publish: Publish) -> Ended:
        """Hand the output to ``publish`` until the process ends; how it ended. Raises the
        infrastructure errors of ``sandbox.errors`` when the sandbox is lost."""

    async def release(self) -> None:
        """After its end was told: let loom forget it. Never raises."""
        return None

    @abstractmethod
    async def write(self, data: bytes, *, pty: bool) -> None:
        """Type ``data`` into its stdin (``pty``: its terminal). Raises ConnectError."""

    @abstractmethod
    async def close_stdin(self) -> None:
        """End its stdin. Raises ConnectError."""

    @abstractmethod
    async def signal(self, sig: int) -> None:
        """SIGTERM or SIGKILL. Raises ConnectError, the infrastructure errors."""

    @abstractmethod
    async def resize(self, cols: int, rows: int) -> None:
        """Its terminal's size. Raises ConnectError."""


def _chunks(data: bytes) -> list[bytes]:
    return [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]


class BackgroundRunner(Runner):
    """The sandbox user's process: a loom background process, or a terminal (see the
    module docstring)."""

    def __init__(self, ws: Workspace, info: ProcessInfo, *, pty: bool, stdin: bool, limit: float) -> None:
        self.ws = ws
        self.id = info.id
        self.pid = info.pid
        self.pty = pty
        self.stdin_open = stdin
        self.limit = limit
        self.settled = False

    @classmethod
    async def start(
        cls,
        ws: Workspace,
        argv: Sequence[str],
        *,
        cwd: str,
        outside: str | None,
        env: dict[str, str],
        stdin: bool,
        pty: tuple[int, int] | None,
        limit: float,
    ) -> BackgroundRunner:
        """Start ``argv`` in ``cwd`` (relative to the workspace; ``outside``: an absolute
        directory elsewhere in the sandbox, entered first) with ``env`` on top of the
        sandbox's; ``stdin``: it reads input sent later (else ``/dev/null``); ``pty``:
        (cols, rows) of its terminal. Raises AgentError (``limit``), PathNotFoundError
        (cwd), the infrastructure errors."""
        if pty is not None:
            run = list(argv)
            if outside is not None:
                run = ["/bin/sh", "-c", 'cd -- "$1" && shift && exec "$@"', "sh", outside, *run]
            info = await ws.start_terminal(
                new_terminal_id(),
                run,
                cols=pty[0],
                rows=pty[1],
                cwd=cwd,
                env=env,
                timeout=limit,
                scrollback=SCROLLBACK,
            )
            return cls(ws, info, pty=True, stdin=True, limit=limit)
        # ``sh -c`` execs the program itself (its pid is the process's); without stdin
        # it reads /dev/null, as envd's processes do.
        command = "exec " + shlex.join(argv) + ("" if stdin else " </dev/null")
        if outside is not None:
            command = f"cd -- {shlex.quote(outside)} && {command}"
        info = await ws.start_background(command, cwd=cwd, timeout=limit, process_id=new_process_id(), env=env)
        return cls(ws, info, pty=False, stdin=stdin, limit=limit)

    async def run(self, publish: Publish) -> Ended:
        box = background(self.ws.sandbox)
        cursor = (0, 0)
        while True:
            out = await box.process_output(self.id, since=cursor, wait=POLL_WAIT, max_bytes=1 << 20)
            cursor = out.cursor
            for data in _chunks(out.stdout):
                await publish("pty" if self.pty else "stdout", data)
            for data in _chunks(out.stderr):
                await publish("stderr", data)
            if out.done:
                break
        await self._settle()
        return from_info(out.info, self.limit)

    async def _settle(self) -> None:
        """Record what the process changed. A failure to record is logged: the changes
        stay pending, recorded as the process's by the workspace's next call."""
        try:
            await self.ws.settle_background(prefer=self.id)
            self.settled = True
        except SandboxError as e:  # the sandbox went with it (killed): nothing to catch up on now
            log.info("e2b.process.record_deferred", process=self.id, error=str(e)[:300])
        except Exception as e:  # (the client still gets the end; the record catches up)
            log.warning("e2b.process.record_failed", process=self.id, error=str(e)[:300])

    async def release(self) -> None:
        # E2B runs a process per command: ended ones lingering in loom would pile up.
        # (One whose changes are not recorded yet stays until they are: loom's next call.)
        if self.settled:
            with contextlib.suppress(SandboxError):
                await background(self.ws.sandbox).process_release(self.id)

    async def write(self, data: bytes, *, pty: bool) -> None:
        if pty and not self.pty:
            raise ConnectError(
                Code.INTERNAL,
                "error writing to tty: tty not assigned to process — input should be written to the stdin",
            )
        if not pty and self.pty:
            raise ConnectError(
                Code.INTERNAL, "error writing to stdin: tty assigned to process — input should be written to the pty"
            )
        if not self.stdin_open:
            raise ConnectError(
                Code.INTERNAL,
                "error writing to stdin: stdin not enabled or closed (start the command with stdin=True)",
            )
        try:
            await background(self.ws.sandbox).process_input(self.id, data)
        except AgentError as e:
            raise ConnectError(Code.INTERNAL, f"error writing to stdin: {e}") from None

    async def close_stdin(self) -> None:
        if self.pty:
            raise ConnectError(
                Code.UNKNOWN, "error closing stdin: cannot close stdin for PTY process — send Ctrl+D (0x04) instead"
            )
        if not self.stdin_open:
            return
        self.stdin_open = False
        with contextlib.suppress(AgentError):  # (it no longer reads: closed already)
            await background(self.ws.sandbox).process_input(self.id, b"", eof=True)

    async def signal(self, sig: int) -> None:
        try:
            if sig == signals.SIGKILL:
                # The whole tree, at once: what it started goes with it.
                info = await background(self.ws.sandbox).process_kill(self.id, signal=signals.SIGKILL, grace=0.0)
                self.gone = not info.running
            else:
                # To its process group only, as a terminal's Ctrl-C: it may handle it.
                await terminals(self.ws.sandbox).process_signal(self.id, sig)
        except AgentError as e:
            raise ConnectError(Code.INTERNAL, f"error sending signal: {e}") from None

    async def resize(self, cols: int, rows: int) -> None:
        if not self.pty:
            raise ConnectError(Code.INTERNAL, "error resizing tty: tty not assigned to process")
        try:
            await terminals(self.ws.sandbox).process_resize(self.id, cols, rows)
        except AgentError as e:
            raise ConnectError(Code.INTERNAL, f"error resizing tty: {e}") from None


class ExecRunner(Runner):
    """A command as another user (see the module docstring)."""

    def __init__(
        self,
        handle: SandboxHandle,
        argv: Sequence[str],
        *,
        cwd: str,
        env: dict[str, str],
        user: str,
        limit: float,
    ) -> None:
        self.handle = handle
        self.argv = list(argv)
        self.cwd = cwd
        self.env = env
        self.user = user
        self.limit = limit
        self.control = ExecControl()

    async def run(self, publish: Publish) -> Ended:
        # exec's callback must not block: its pieces go through a queue, in order.
        queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()

        def on_output(stream: str, data: bytes) -> None:
            queue.put_nowait((stream, data))

        async def forward() -> None:
            while (item := await queue.get()) is not None:
                for data in _chunks(item[1]):
                    await publish(item[0], data)

        forwarder = asyncio.create_task(forward())
        try:
            res = await self.handle.exec(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                user=self.user,
                timeout=self.limit,
                max_output=0,  # (the output goes out as it comes; nothing is kept)
                on_output=on_output,
                control=self.control,
            )
        finally:
            queue.put_nowait(None)
            await forwarder
        return from_exec(res, self.limit)

    async def write(self, data: bytes, *, pty: bool) -> None:
        raise ConnectError(
            Code.INTERNAL,
            f"error writing to stdin: stdin not enabled (loom runs commands of user {self.user!r} without stdin)",
        )

    async def close_stdin(self) -> None:
        return None  # (it has none)

    async def signal(self, sig: int) -> None:
        await self.control.signal(sig)

    async def resize(self, cols: int, rows: int) -> None:
        raise ConnectError(Code.INTERNAL, "error resizing tty: tty not assigned to process")
