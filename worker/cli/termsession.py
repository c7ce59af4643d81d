"""One client of a terminal on our own terminal: what ``loom-worker shell`` and ``exec -t``
run once they know what to open (:mod:`worker.cli.shell`, :mod:`worker.cli.exec`).

In this process, on the core's Python API (:mod:`worker.terminals`): a registry of our
own with the changelog on, so what the terminal changes is recorded as it settles (the
per-user local worker has no terminal stream to offer). Keystrokes go out as they are
read (``loop.add_reader`` on standard input, one write to the terminal per read, nothing
waited for) and output is written with ``os.write`` as it comes, so a key costs the
sandbox's round trip and nothing of ours beyond a read and a write.

How it ends: the program exits (our exit code is its own, 128+N for a signal N, 124 when
``--timeout`` ended it or 137 for a limit), the detach escape is typed (``~.``: the terminal
goes on, exit 0), our terminal hangs up or SIGHUP/SIGTERM comes (the terminal goes on: 129,
143), or the stream to it breaks (125). Our terminal is given back as it was on every one
of those ways out (:class:`~worker.cli.localterm.RawMode`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from .localterm import DEFAULT_SIZE, EscapeFilter, RawMode, size_of, write_all

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every call.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from typing import Any

    from ..settings import Settings
    from ..terminals import Terminal

EXIT_TIMEOUT = 124
EXIT_INFRASTRUCTURE = 125
EXIT_REFUSED = 126
EXIT_KILLED = 137
#: Seconds without output after which the terminal counts as waiting for input (the end
#: of ours is typed then), and before that end is typed again if it is still running.
QUIET, EOF_AGAIN = 0.25, 2.0


@dataclass
class Options:
    """What to open (``command``, or ``attach`` an existing terminal) and how."""

    prog: str  # "loom-worker shell", "loom-worker exec": the start of our messages
    workspace: str  # a real path
    command: list[str] | None = None  # None: the sandbox user's login shell
    attach: str | None = None
    cwd: str = "."
    env: dict[str, str] = field(default_factory=dict)
    size: tuple[int, int] | None = None  # fixed (--size); None: ours, followed
    escape: bool = True  # the detach escape, where our standard input is a terminal
    timeout: float | None = None


def say(opts: Options, text: str) -> None:
    sys.stderr.write(f"{opts.prog}: {text}\n")
    sys.stderr.flush()


def run(opts: Options) -> int:
    """The session, start to end; the exit code (see the module docstring)."""
    import asyncio

    from . import verbosity
    from .common import load_settings

    settings = load_settings()
    verbosity.configure(settings)
    try:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is installed wherever the worker is
            return asyncio.run(_session(opts, settings))
        return uvloop.run(_session(opts, settings))
    except KeyboardInterrupt:  # Ctrl-C while it was starting (our terminal not raw yet)
        say(opts, "interrupted")
        return 130


async def _session(opts: Options, settings: Settings) -> int:
    from ..registry import default_registry

    interactive = os.isatty(0)
    size = opts.size or (size_of(0) or size_of(1) if interactive else None) or DEFAULT_SIZE
    registry = default_registry(settings, catalog=False)  # the changelog on: a terminal's changes are recorded
    async with registry:
        handle = registry.sandbox(opts.workspace)
        opened = await _open(opts, handle, size)
        if isinstance(opened, int):
            return opened
        raw = RawMode(0)
        try:
            if interactive:
                raw.enter()
            relay = Relay(opened, opts, size, interactive=interactive)
            how = await relay.run()
        finally:
            raw.restore()
        return _report(opts, opened, how)


async def _open(opts: Options, handle: Any, size: tuple[int, int]) -> Terminal | int:
    """The terminal opened or attached, or the exit code of why not (said on stderr)."""
    from sandbox.errors import AgentError, PathNotFoundError, SandboxError

    from ..terminals import TerminalArgumentError
    from ..tool import PolicyError

    try:
        if opts.attach is not None:
            try:
                return await handle.attach_terminal(opts.attach)
            except AgentError as e:  # (not_found, whatever type the agent's code maps to)
                say(opts, str(e))
                return 1
        return await handle.open_terminal(opts.command, cols=size[0], rows=size[1], cwd=opts.cwd, env=opts.env)
    except PolicyError as e:
        say(opts, e.message)
        return EXIT_REFUSED
    except (TerminalArgumentError, ValueError, PathNotFoundError) as e:
        say(opts, f"error: {e}")
        return 2
    except AgentError as e:  # no such terminal; too many background processes
        say(opts, str(e))
        return 1
    except (SandboxError, NotImplementedError, OSError) as e:
        say(opts, f"the sandbox is unavailable: {e}")
        return EXIT_INFRASTRUCTURE


def _report(opts: Options, term: Terminal, how: str) -> int:
    """Our exit code for how the session ended; the words on stderr where there are any."""
    if how in ("detach", "hangup", "sigterm"):
        if how != "hangup":
            ws = _shown(opts.workspace)
            sys.stderr.write("\n" if os.isatty(2) else "")
            say(opts, f"detached from {term.id} (it goes on); reattach: loom-worker shell -w {ws} --attach {term.id}")
        return {"detach": 0, "hangup": 129, "sigterm": 143}[how]
    info = term.info
    if info.running:
        say(opts, f"the connection to {term.id} was lost; it may still run (loom-worker shell --list)")
        return EXIT_INFRASTRUCTURE
    if how == "timeout" or info.outcome == "timeout":
        say(opts, f"{term.id} timed out and was killed")
        return EXIT_TIMEOUT
    if info.outcome == "oom":
        say(opts, f"{term.id} was killed for a limit (memory)")
        return EXIT_KILLED
    if info.signal:
        return 128 + info.signal if 0 < info.signal < 128 else EXIT_KILLED
    code = info.exit_code
    return code if code is not None and 0 <= code <= 255 else 1


def _shown(path: str) -> str:
    import shlex

    return shlex.quote(path)


class Relay:
    """Our standard input to the terminal, its output to our standard output, our size
    to it, until the session ends (:meth:`run` returns how: ``ended``, ``timeout``,
    ``detach``, ``hangup``, ``sigterm``)."""

    def __init__(self, term: Terminal, opts: Options, size: tuple[int, int], *, interactive: bool) -> None:
        import asyncio

        self.term = term
        self.opts = opts
        self.size = size
        self.interactive = interactive
        self.escape = EscapeFilter() if interactive and opts.escape else None
        self._outbox = bytearray()
        self._wake = asyncio.Event()
        self._done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._resizing = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._last_output = asyncio.get_running_loop().time()
        self._eof: asyncio.Task[None] | None = None  # typing the end of our input

    def finish(self, how: str) -> None:
        if not self._done.done():
            self._done.set_result(how)

    async def run(self) -> str:
        import asyncio
        import signal

        loop = asyncio.get_running_loop()
        pump = loop.create_task(self._pump())
        typist = loop.create_task(self._type())
        reader = None
        try:
            loop.add_reader(0, self._on_input)
        except PermissionError:  # a file or /dev/null (epoll refuses them; reads never wait there)
            reader = loop.create_task(self._read_file())
        handlers = {signal.SIGHUP: lambda: self.finish("hangup"), signal.SIGTERM: lambda: self.finish("sigterm")}
        handlers[signal.SIGINT] = self._on_sigint  # (raw mode: only a `kill -INT` gets here)
        if self.interactive and self.opts.size is None:
            handlers[signal.SIGWINCH] = self._on_winch
        for sig, handler in handlers.items():
            loop.add_signal_handler(sig, handler)
        timer = loop.call_later(self.opts.timeout, self._on_timeout) if self.opts.timeout else None
        if self.term.info.pty is not None and self.term.info.pty != self.size:  # (a reattach: our size now)
            self._spawn(self._resize(self.size))
        try:
            return await self._done
        finally:
            if timer is not None:
                timer.cancel()
            loop.remove_reader(0)
            if reader is not None:
                reader.cancel()
            for sig in handlers:
                loop.remove_signal_handler(sig)
            typist.cancel()
            how = self._done.result() if self._done.done() else "hangup"
            if how != "ended":
                pump.cancel()
            if self._eof is not None:
                self._eof.cancel()  # (it runs until the end)
            await asyncio.gather(pump, typist, *self._tasks, return_exceptions=True)
            await self._leave(how)

    async def _leave(self, how: str) -> None:
        """Timed out: the terminal killed; else detached (it goes on; what it changed so
        far recorded), or already closed (it ended)."""
        from sandbox.errors import SandboxError

        if how == "timeout":
            try:
                await self.term.kill()
            except SandboxError:
                pass
        await self.term.close()

    # -- input -------------------------------------------------------------------------

    def _on_input(self) -> None:
        try:
            data = os.read(0, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self._typed(data)

    async def _read_file(self) -> None:
        """Standard input that cannot be polled (a file), read in a thread to its end."""
        import asyncio

        while True:
            try:
                data = await asyncio.to_thread(os.read, 0, 65536)
            except OSError:
                data = b""
            self._typed(data)
            if not data:
                return

    def _typed(self, data: bytes) -> None:
        import asyncio

        if not data:  # the end of our input
            asyncio.get_running_loop().remove_reader(0)
            if self.interactive:
                self.finish("hangup")  # (a terminal that reads as ended has gone)
            elif self._eof is None:
                self._eof = asyncio.get_running_loop().create_task(self._end_of_input())
                self._tasks.add(self._eof)
            return
        if self.escape is not None:
            data, detach = self.escape.feed(data)
            if detach:
                self.finish("detach")
                if not data:
                    return
        self._send(data)

    def _send(self, data: bytes) -> None:
        if not self._outbox:  # nothing waiting: straight out, if the stream takes it now
            from sandbox.errors import TunnelClosedError

            try:
                data = data[self.term.write_nowait(data) :]
            except TunnelClosedError:
                return  # it ended: the output's end says how
            if not data:
                return
        self._outbox += data
        self._wake.set()

    async def _type(self) -> None:
        """The bytes read, written to the terminal as they come (what arrived meanwhile
        goes in the same write)."""
        from sandbox.errors import TunnelClosedError

        while True:
            await self._wake.wait()
            self._wake.clear()
            data, self._outbox = bytes(self._outbox), bytearray()
            if not data:
                continue
            try:
                await self.term.write(data)
            except TunnelClosedError:
                return  # it ended: the output's end says how

    async def _end_of_input(self) -> None:
        """Our input ended (not a terminal): Ctrl-D typed, as ``docker exec -i``'s closed
        stdin reads as the end. A terminal's end of input is one keystroke, read once, and
        lost on a program not yet reading (a shell starting): so it is typed once the
        terminal is quiet (:data:`QUIET` without output), and again each time it falls
        quiet after new output or :data:`EOF_AGAIN` later, until the program ends."""
        import asyncio

        loop = asyncio.get_running_loop()
        sent = float("-inf")
        while True:
            now = loop.time()
            if now - self._last_output >= QUIET and (self._last_output > sent or now - sent >= EOF_AGAIN):
                self._send(b"\x04")
                sent = now
            await asyncio.sleep(QUIET / 2)

    # -- output ------------------------------------------------------------------------

    async def _pump(self) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        try:
            async for data in self.term.output():
                self._last_output = loop.time()
                write_all(1, data)
        except OSError:  # our terminal hung up, or our reader went away
            self.finish("hangup")
            return
        self.finish("ended")

    # -- size, signals, time -----------------------------------------------------------

    def _on_winch(self) -> None:
        got = size_of(0) or size_of(1)
        if got is not None and got != self.size:
            self.size = got
            if not self._resizing:
                self._spawn(self._resize(got))

    async def _resize(self, size: tuple[int, int]) -> None:
        from sandbox.errors import SandboxError

        self._resizing = True
        try:
            while True:
                try:
                    await self.term.resize(*size)
                except SandboxError:
                    return  # it ended meanwhile: the output's end says how
                if size == self.size:
                    return
                size = self.size  # changed again while we asked: the latest
        finally:
            self._resizing = False

    def _on_sigint(self) -> None:
        self._spawn(self._signal("INT"))

    async def _signal(self, sig: str) -> None:
        from sandbox.errors import SandboxError

        try:
            await self.term.signal(sig)
        except SandboxError:
            pass

    def _on_timeout(self) -> None:
        self.finish("timeout")  # (killed on the way out)

    def _spawn(self, coro: Any) -> None:
        import asyncio

        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
