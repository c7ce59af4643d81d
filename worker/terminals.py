"""Terminals: a program on a pseudo-terminal in a workspace's sandbox, for a person or a
harness (``loom-worker shell``, the dashboard's Terminal tab, the WebSocket route,
``registry.sandbox(ws).open_terminal()``), never a tool a model is offered.

A terminal is a background process of the workspace started on a terminal (see
``sandbox/agent/supervisor.py``): it has an id (``term-...``), counts against the
workspace's background processes (``LOOM_MAX_PROCESSES``) and the sandbox's limits, and
outlives the connection that opened it: :func:`attach` reattaches with its recent output
(the scrollback) replayed. It ends when its program exits, when it is killed, after
:data:`DETACHED_IDLE` seconds with no client attached and nothing typed, or with the
sandbox.

What its programs change in the workspace is recorded in the changelog as the terminal's,
``call_id`` its id (``undo --call term-...`` takes all of it back, ``undo`` the last
entry), one entry each time the terminal **settles**: :data:`SETTLE_AFTER` seconds after
input with no output since (a command typed and finished; an editor's save), when a client
detaches, and when the terminal ends. A change made while no client of this process is
attached (a build left running) is recorded by the next call on the workspace, as any
background process's. So an entry is about one command line at a shell, or one save in an
editor.

The byte stream is the supervisor's own socket, handed to the worker under runc (nothing
relayed) and carried over the agent's channel under gVisor (:mod:`sandbox.tunnel`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal as signals
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import structlog

from sandbox.base import ProcessInfo
from sandbox.capabilities import background, terminals
from sandbox.errors import AgentError, SandboxError, TunnelClosedError
from sandbox.handover import SocketTunnel
from sandbox.protocol import env_problem

if TYPE_CHECKING:
    from sandbox.tunnel import Tunnel

    from .workspace import Workspace

log = structlog.get_logger(__name__)

PREFIX = "term-"
#: Seconds of quiet (no output) after input before the terminal's changes are recorded.
SETTLE_AFTER = 0.5
#: A terminal nobody is attached to and nobody typed into is ended after this long.
DETACHED_IDLE = 3600.0
#: Its longest life (a terminal is for a session of work, not a service: that is a
#: background process's or a container's job).
MAX_LIFE = 86_400.0
#: Output kept for a client that attaches (its replay), in bytes.
SCROLLBACK = 256 << 10
MIN_SIZE, MAX_SIZE = 1, 1000


class TerminalArgumentError(ValueError):
    """An argument refused before anything started (a size out of range, an empty argv)."""


def new_terminal_id() -> str:
    return PREFIX + secrets.token_hex(6)


def check_size(cols: int, rows: int) -> None:
    """Raises TerminalArgumentError naming the field out of 1-1000."""
    for name, v in (("cols", cols), ("rows", rows)):
        if isinstance(v, bool) or not isinstance(v, int) or not MIN_SIZE <= v <= MAX_SIZE:
            raise TerminalArgumentError(f"{name} must be an integer {MIN_SIZE}-{MAX_SIZE}, not {v!r}")


def signal_number(sig: int | str) -> int:
    """``sig`` as a number: a number, or a name with or without ``SIG`` (``INT``,
    ``SIGWINCH``). Raises TerminalArgumentError."""
    if isinstance(sig, int) and not isinstance(sig, bool):
        if 1 <= sig <= 64:
            return sig
    elif isinstance(sig, str):
        name = sig.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        found = getattr(signals.Signals, name, None) if name.isidentifier() else None
        if found is not None:
            return int(found)
    raise TerminalArgumentError(f"not a signal: {sig!r}")


class Terminal:
    """One client's connection to a terminal: its output as it comes (:meth:`output`),
    input (:meth:`write`), size, signals. Made by :func:`open_terminal` or
    :func:`attach`; :meth:`close` detaches (the terminal goes on), :meth:`kill` ends it.

    Read :meth:`output`: while this client is behind by half the scrollback the program
    in the terminal waits, as on a real terminal, rather than lose what it has not read.
    """

    def __init__(self, ws: Workspace, tunnel: Tunnel, info: ProcessInfo, cursor: int, dropped: int) -> None:
        self.ws = ws
        self.id = info.id
        #: What the supervisor said at attach, then at each resize, signal and the end.
        self.info = info
        #: The offset of the next output byte (pass as ``since`` to attach after it).
        self.cursor = cursor
        #: Bytes lost between the offset asked for and the replay's start.
        self.dropped = dropped
        self._tunnel = tunnel
        self._closed = False
        self._typed = False  # input since the last record
        self._writing = 0  # writes under way (write_nowait must not pass them)
        self._activity = 0.0  # loop time of the last input or output
        self._wake = asyncio.Event()
        self._settler = asyncio.get_running_loop().create_task(self._settle_loop(), name=f"settle {self.id}")

    # -- streams -----------------------------------------------------------------------

    async def output(self) -> AsyncIterator[bytes]:
        """The terminal's output as it comes; ends when the program has ended and all it
        printed was read (then :attr:`info` has its exit), or when this client closed."""
        while True:
            data = await self._tunnel.read()
            if not data:
                break
            self.cursor += len(data)
            self._activity = asyncio.get_running_loop().time()
            yield data
        if not self._closed:
            await self._finished()

    async def write(self, data: bytes) -> None:
        """Type ``data`` into the terminal. Raises TunnelClosedError once it ended or
        this client closed."""
        if self._closed:
            raise TunnelClosedError("this terminal connection is closed")
        self._writing += 1
        try:
            await self._tunnel.write(data)
        finally:
            self._writing -= 1
        self._typed_now()

    def write_nowait(self, data: bytes) -> int:
        """Type what of ``data`` goes at once, without waiting; returns how many bytes
        that was (0: none, when the stream is full, relayed as under gVisor, or a
        :meth:`write` is under way): the caller passes the rest to :meth:`write`. For a
        client reading keys in a callback, which would otherwise wake a task per key.
        Raises TunnelClosedError once it ended or this client closed."""
        if self._closed:
            raise TunnelClosedError("this terminal connection is closed")
        if self._writing or not isinstance(self._tunnel, SocketTunnel):
            return 0
        n = self._tunnel.try_write(data)
        if n:
            self._typed_now()
        return n

    def _typed_now(self) -> None:
        self._typed = True
        self._activity = asyncio.get_running_loop().time()
        self._wake.set()

    async def resize(self, cols: int, rows: int) -> ProcessInfo:
        """Raises TerminalArgumentError (a size out of 1-1000), AgentError (``not_found``:
        it ended long ago)."""
        check_size(cols, rows)
        self.info = await terminals(self.ws.sandbox).process_resize(self.id, cols, rows)
        return self.info

    async def signal(self, sig: int | str) -> ProcessInfo:
        """``sig`` (a number or a name: ``INT``, ``TERM``...) to the program in the
        foreground of the terminal. Raises TerminalArgumentError, AgentError
        (``conflict``: it has ended)."""
        self.info = await terminals(self.ws.sandbox).process_signal(self.id, signal_number(sig))
        return self.info

    async def wait(self) -> ProcessInfo:
        """Wait for the program to end (another client may be reading its output); its
        info. Raises AgentError (``not_found``: it ended more than its linger time ago)."""
        box = background(self.ws.sandbox)
        while True:
            out = await box.process_output(self.id, since=(1 << 62, 1 << 62), wait=30.0, max_bytes=1)
            if not out.info.running:
                self.info = out.info
                return out.info

    async def kill(self) -> ProcessInfo:
        """End the terminal's program and everything it started; its changes are recorded."""
        self.info = await background(self.ws.sandbox).process_kill(self.id, signal=signals.SIGHUP)
        await self.close()
        return self.info

    async def close(self) -> None:
        """Detach: the terminal goes on (reattach with :func:`attach`). What it changed
        until now is recorded."""
        if self._closed:
            return
        self._closed = True
        await self._tunnel.close()
        self._settler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._settler
        await self._record()

    async def __aenter__(self) -> Terminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the record ------------------------------------------------------------------------

    async def _finished(self) -> None:
        """The stream ended: the program's exit, then its last changes recorded."""
        with contextlib.suppress(SandboxError):
            for p in await background(self.ws.sandbox).processes():
                if p.id == self.id:
                    self.info = p
        self._typed = True  # (whatever happened, the end is a settle point)
        await self.close()

    async def _settle_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:  # quiet for SETTLE_AFTER since the last input or output
                left = self._activity + SETTLE_AFTER - loop.time()
                if left <= 0:
                    break
                await asyncio.sleep(left)
            await self._record()

    async def _record(self) -> None:
        """Record what changed since the last scan as this terminal's. A failure is
        logged, not raised: the changes stay pending and the next call records them."""
        if not self._typed:
            return
        self._typed = False
        try:
            await self.ws.settle_background(prefer=self.id)
        except Exception as e:  # (the terminal goes on; the record catches up later)
            log.warning("terminal.record_failed", terminal=self.id, error=str(e)[:300])


async def open_terminal(
    ws: Workspace,
    command: list[str] | None = None,
    *,
    cols: int = 80,
    rows: int = 24,
    cwd: str = ".",
    env: dict[str, str] | None = None,
    idle: float = DETACHED_IDLE,
) -> Terminal:
    """Start ``command`` (an argv; None: the sandbox user's login shell) on a new terminal
    of ``cols`` x ``rows`` in ``ws``'s sandbox and attach to it.

    Raises TerminalArgumentError (a size, ``command``, ``env``), AgentError (``limit``: the workspace runs as many
    background processes as it may; ``not_found``: no shell in the image),
    PathNotFoundError (``cwd``), NotImplementedError (a sandbox without terminals), the
    infrastructure errors of any call."""
    check_size(cols, rows)
    if command is not None and (not command or not all(isinstance(a, str) and a for a in command)):
        raise TerminalArgumentError("command must be a non-empty list of non-empty strings")
    if (problem := env_problem(env)) is not None:
        raise TerminalArgumentError(f"env: {problem}")
    info = await ws.start_terminal(
        new_terminal_id(),
        command,
        cols=cols,
        rows=rows,
        cwd=cwd,
        env=env,
        idle=idle,
        timeout=MAX_LIFE,
        scrollback=SCROLLBACK,
    )
    return await attach(ws, info.id, since=0)


async def attach(ws: Workspace, terminal_id: str, *, since: int | None = None) -> Terminal:
    """Attach to terminal ``terminal_id``: its output from offset ``since`` (None: all it
    keeps, the scrollback) then as it comes. Raises AgentError (``not_found``)."""
    tunnel, at = await terminals(ws.sandbox).attach_process(terminal_id, since=since)
    if at.info.pty is None:
        await tunnel.close()
        raise AgentError(f"No terminal {terminal_id} in this workspace (a background process)", code="not_found")
    return Terminal(ws, tunnel, at.info, at.cursor, at.dropped)


async def list_terminals(ws: Workspace) -> list[ProcessInfo]:
    """The workspace's terminals, running or ended within their linger time."""
    return [p for p in await background(ws.sandbox).processes() if p.pty is not None]


async def kill_terminal(ws: Workspace, terminal_id: str) -> ProcessInfo:
    """End terminal ``terminal_id`` and record its changes. Raises AgentError (``not_found``)."""
    if not terminal_id.startswith(PREFIX):
        raise AgentError(f"No terminal {terminal_id} in this workspace", code="not_found")
    info = await background(ws.sandbox).process_kill(terminal_id, signal=signals.SIGHUP)
    await ws.settle_background(prefer=terminal_id)
    return info
