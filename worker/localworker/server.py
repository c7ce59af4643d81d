"""The local worker: one per user and key (see :mod:`.identity`), started by the CLI as
``python -P -m worker.localworker --key K --backend B`` with stdout a pipe the CLI reads
``ready`` (or ``error ...``) from and stderr its log file.

It builds the registry once, exactly as an in-process call does (:class:`.calls.Calls`),
and answers calls over a unix socket (mode 0600, in the user's 0700 run directory; each
peer's uid is checked with ``SO_PEERCRED`` too). Each call runs in its own task, so calls
of several CLI processes run side by side as they would in-process. It exits:

- after ``LOOM_CLI_DAEMON_IDLE`` seconds with no connection (900 by default);
- when the code under it changed (an upgrade, an edit of an editable install): new CLI
  processes compute another key and start a new worker, and this one leaves;
- when a file its registry was built from changed (a custom tool, the MCP servers file,
  an MCP tool indexed by another process): the call that notices is answered ``retry``
  before anything runs, and the CLI sends it to a fresh worker;
- when its socket was removed or replaced, on ``shutdown`` (``loom-worker daemon stop``)
  and on SIGTERM/SIGINT, after the calls in flight have finished.

A client that goes away mid-call (Ctrl-C, a CI job's timeout) does not cancel the call:
it finishes, so what it changed is recorded in the changelog (in-process, the process
ends with the call and a command's changes then go unrecorded).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import os
import signal
import socket
import struct
import sys
import time
from typing import Any

from sandbox import __version__
from sandbox.base import ExecControl
from sandbox.logs import get_logger
from sandbox.pulls import PULL_SINK, PullEvent

from ..limits import too_large
from ..logging import level_number
from ..registry.recovery import reconcile_interrupted
from ..settings import Settings, describe_errors
from . import daemon_logs, wire
from .calls import Calls
from .daemon_logs import SINK, client_renderer
from .identity import code_identity
from .inputs import fingerprint, registry_inputs
from .rundir import WorkerFiles

log = get_logger("worker.localworker")

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _send(writer: asyncio.StreamWriter, frame: dict[str, Any]) -> None:
    """Write one frame, unless the client went away (then it is dropped)."""
    if writer.is_closing():
        return
    try:
        writer.write(wire.encode(frame))
    except (RuntimeError, ConnectionError):  # uvloop: a transport closed under us
        pass


#: How much of a frame the connection's buffer holds before it is taken (read_frame).
_PIECE = 1 << 20


class FrameTooLarge(Exception):
    """A frame over its op's limit (:func:`wire.frame_limit`), refused while read."""

    def __init__(self, op: str | None, rid: int | None, read: int, limit: int, max_request: int) -> None:
        self.op, self.rid, self.read, self.limit = op, rid, read, limit
        if op == "call":
            self.message = too_large(max_request)
        else:
            self.message = (
                f"Request too large: a {op or 'request'} frame of more than {limit} bytes; refused while reading it"
            )
        super().__init__(self.message)


async def read_frame(reader: asyncio.StreamReader, max_request: int, piece: int = _PIECE) -> bytes:
    """The next frame (b"" at the end of the stream), read ``piece`` bytes at a time and
    refused as soon as it is over its op's limit, which its first bytes name: an oversized
    frame costs at most its limit (and a piece) in memory. Raises FrameTooLarge,
    ConnectionError."""
    buf = bytearray()
    limit: int | None = None
    op = rid = None
    while True:
        try:
            buf += await reader.readuntil(b"\n")
            done = True
        except asyncio.IncompleteReadError as e:  # the end of the stream
            buf += e.partial
            done = True
        except asyncio.LimitOverrunError as e:  # no newline in the buffer yet: take it
            buf += await reader.readexactly(min(e.consumed, piece))
            done = False
        if limit is None and (done or len(buf) >= wire.HEAD):
            op, rid = wire.head_fields(bytes(buf[: wire.HEAD]))
            limit = wire.frame_limit(op, max_request)
        if limit is not None and len(buf) > limit:
            raise FrameTooLarge(op, rid, len(buf), limit, max_request)
        if done:
            return bytes(buf)


def peer_uid(sock: Any) -> int:
    """The uid of the process at the other end of unix socket ``sock`` (SO_PEERCRED)."""
    _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return int(uid)


class LocalWorker:
    """The worker's state: the registry, the connections, and why it should stop."""

    def __init__(self, settings: Settings, key: str, files: WorkerFiles, calls: Calls, startup: list[Any]) -> None:
        self.settings = settings
        self.key = key
        self.files = files
        self.calls = calls
        #: Events logged while the registry was built (a custom tool file that did not
        #: load): an in-process call logs them each time, so each call gets them too.
        self.startup_events = startup
        self.idle = settings.cli_daemon_idle
        #: The most a call's frame may hold, besides its envelope (LOOM_MAX_BODY_BYTES).
        self.max_request = settings.max_body_bytes
        self.code = code_identity()
        self.inputs = registry_inputs(settings, calls.registry)
        self.baseline = fingerprint(self.inputs)
        self.started = time.time()
        self.served = 0
        self.active = 0
        self.last = time.monotonic()
        self.retiring: str | None = None
        self._sock_ino = 0
        self._server: asyncio.AbstractServer | None = None
        self._stop = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, sock: socket.socket) -> str:
        """Serve on listening ``sock`` until it is time to stop; returns why."""
        self._sock_ino = os.stat(self.files.socket).st_ino
        # The stream's buffer holds one piece of a frame at a time (read_frame).
        self._server = await asyncio.start_unix_server(self._handle, sock=sock, limit=_PIECE)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.retire, f"signal {signal.Signals(sig).name}")
        house = asyncio.create_task(self._housekeeping())
        # A crashed worker's interrupted commands: recorded now (see registry.recovery).
        recon = asyncio.create_task(reconcile_interrupted(self.calls.registry, self.calls.settings.data_dir))
        try:
            await self._stop.wait()
        finally:
            house.cancel()
            recon.cancel()
            self._close_listener()
            await self.calls.aclose()
        return self.retiring or "stopped"

    def retire(self, reason: str) -> None:
        """Take no new connections (the socket is removed, so the next CLI starts a fresh
        worker); stop once the connections open now have ended."""
        if self.retiring is None:
            self.retiring = reason
            daemon_logs.lifecycle("local_worker.retiring", reason=reason, active=self.active)
            self._close_listener()
        if self.active == 0:
            self._stop.set()

    def _close_listener(self) -> None:
        if self._server is not None:
            # The name first, so no new client finds it; then the listener. A client that
            # connected in between is reset before its greeting, so it sent nothing.
            with contextlib.suppress(OSError):
                if os.stat(self.files.socket).st_ino == self._sock_ino:  # not a successor's
                    os.unlink(self.files.socket)
            self._server.close()
            self._server = None

    async def _housekeeping(self) -> None:
        tick = max(0.05, min(2.0, self.idle / 4))
        while True:
            await asyncio.sleep(tick)
            if self.retiring is not None:
                self.retire(self.retiring)
                continue
            if self.active == 0 and time.monotonic() - self.last >= self.idle:
                self.retire(f"idle for {self.idle} s")
            elif code_identity(fresh=True) != self.code:
                self.retire("the installed code changed")
            else:
                try:
                    ours = os.stat(self.files.socket).st_ino == self._sock_ino
                except OSError:
                    ours = False
                if not ours:
                    self.retire("its socket was removed or replaced")

    # -- connections -----------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            uid = peer_uid(sock)
        except OSError:
            uid = -1
        if uid != os.getuid():
            daemon_logs.lifecycle("local_worker.peer_refused", peer_uid=uid)
            writer.close()
            return
        # Before anything else: a client sends nothing until it has this, so a connection
        # reset before it (one queued when this worker stopped listening) lost nothing.
        _send(writer, {"t": "hello", "pid": os.getpid(), "key": self.key, "max_request": self.max_request})
        self.active += 1
        try:
            while True:
                try:
                    line = await read_frame(reader, self.max_request)
                except FrameTooLarge as e:
                    # Dropped at the limit, never held whole; the rest of it is not read, so
                    # the connection ends here (the client checks the size first).
                    log.warning("local_worker.request_too_large", op=e.op, read=e.read, limit=e.limit)
                    _send(writer, {"id": e.rid, "t": "error", "code": "too_large", "message": e.message})
                    with contextlib.suppress(ConnectionError):
                        await writer.drain()
                    break
                if not line:
                    break
                try:
                    req = wire.decode(line)
                except ValueError as e:
                    _send(writer, {"id": None, "t": "error", "message": f"not a frame: {e}"})
                    await writer.drain()
                    continue
                await self._request(req, writer, reader)
                await writer.drain()
        except (ConnectionError, RuntimeError, ValueError, asyncio.LimitOverrunError) as e:
            # A broken pipe.
            log.info("local_worker.connection_ended", error=repr(e))
        finally:
            self.active -= 1
            self.last = time.monotonic()
            writer.close()
            if self.retiring is not None:
                self.retire(self.retiring)

    async def _request(self, req: dict[str, Any], writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> None:
        rid = req.get("id")
        op = req.get("op")
        if op == "status":
            _send(writer, {"id": rid, "t": "status", **self.status()})
        elif op == "shutdown":
            _send(writer, {"id": rid, "t": "status", **self.status(), "stopping": True})
            self.retire("asked to stop")
        elif op == "call":
            await self._call(req, writer)
        elif op == "exec":
            await self._exec(req, writer, reader)
        else:
            _send(writer, {"id": rid, "t": "error", "message": f"unknown op {op!r}"})

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "key": self.key,
            "version": __version__,
            "backend": self.calls.backend,
            "started": self.started,
            "calls": self.served,
            "active": self.active,
            "idle_exit": self.idle,
            "retiring": self.retiring,
        }

    def _stale(self) -> str | None:
        if self.retiring is not None:
            return f"this local worker is stopping ({self.retiring})"
        if self.inputs and fingerprint(self.inputs) != self.baseline:
            return "a file its tools were loaded from changed (custom tools, MCP servers, the MCP tool index)"
        return None

    def _begin(self, req: dict[str, Any], writer: asyncio.StreamWriter) -> contextvars.Context | None:
        """A call's context (its log events go to the client), or None when it must go to
        a fresh worker (``retry`` was answered)."""
        rid = req.get("id")
        why = "it was started for other settings or code" if req.get("key") != self.key else self._stale()
        if why is not None:
            self.retire(why)  # first: the socket is gone before the client reads "retry"
            _send(writer, {"id": rid, "t": "retry", "reason": why})
            return None
        render = client_renderer(self.settings.log_format, bool(req.get("tty")))
        floor = _level(req.get("log_floor"), 0)  # the CLI's level: warnings unless -v or LOOM_LOG_LEVEL

        def sink(event_dict: Any) -> None:
            if floor and _level(event_dict.get("level"), floor) < floor:
                return
            if writer.is_closing():  # the client went away: the worker's own log keeps it
                daemon_logs.to_own_log(event_dict)
            else:
                _send(writer, {"id": rid, "t": "log", "text": render(event_dict)})

        for event in self.startup_events:
            sink(dict(event))

        def pull_sink(event: PullEvent) -> None:  # the client draws a pull's progress
            if not writer.is_closing():
                _send(writer, {"id": rid, "t": "pull", **event.as_dict()})

        ctx = contextvars.copy_context()
        ctx.run(SINK.set, sink)
        ctx.run(PULL_SINK.set, pull_sink)
        return ctx

    async def _call(self, req: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        rid = req.get("id")
        ctx = self._begin(req, writer)
        if ctx is None:
            return
        call_id = req.get("call_id")
        # A client that goes away mid-call (Ctrl-C, a CI job's timeout) does not cancel
        # it: cancelling would not stop a command in the sandbox (it runs to its own
        # timeout either way), only skip recording what it changed. So the call finishes
        # and its changes are in the changelog; the answer then goes nowhere.
        try:
            code, result = await asyncio.create_task(
                self.calls.execute(
                    str(req.get("tool")),
                    req.get("arguments"),
                    str(req.get("workspace")),
                    None if call_id is None else str(call_id),
                    check_unknown=bool(req.get("check_unknown", True)),
                ),
                context=ctx,
            )
        except Exception as e:  # a bug: the client reports it as an infrastructure failure
            log.exception("local_worker.call_failed", tool=req.get("tool"))
            _send(writer, {"id": rid, "t": "error", "message": f"{type(e).__name__}: {e}"})
            return
        self.served += 1
        _send(writer, {"id": rid, "t": "result", "exit": code, "result": result})
        if self.inputs:  # what the call itself wrote (the catalog's index) is no change from outside
            self.baseline = fingerprint(self.inputs)

    async def _exec(self, req: dict[str, Any], writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> None:
        """``loom-worker exec``: a command's output as ``output`` frames while it runs, then
        its ``result``. Meanwhile the client may send ``signal`` frames for it (Ctrl-C).
        A client that goes away does not stop it, as for ``call``."""
        rid = req.get("id")
        ctx = self._begin(req, writer)
        if ctx is None:
            return
        control = ExecControl()

        async def on_output(chunk: Any) -> None:
            if writer.is_closing():
                return
            frame = {"id": rid, "t": "output", "stream": chunk.stream, "data": base64.b64encode(chunk.data).decode()}
            if chunk.dropped:
                frame["dropped"] = chunk.dropped
            _send(writer, frame)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await writer.drain()  # a client that reads slowly holds the stream, not the command

        async def signals() -> None:
            while line := await reader.readline():
                with contextlib.suppress(ValueError, TypeError):
                    frame = wire.decode(line)
                    if frame.get("op") == "signal" and frame.get("id") == rid:
                        await control.signal(int(frame.get("signal", 2)))

        call_id = req.get("call_id")
        task = asyncio.create_task(
            self.calls.exec(
                str(req.get("workspace")),
                str(req.get("command")),
                timeout=req.get("timeout"),
                cwd=str(req.get("cwd", ".")),
                call_id=None if call_id is None else str(call_id),
                on_output=on_output,
                control=control,
                harness=req.get("harness") if isinstance(req.get("harness"), dict) else None,
            ),
            context=ctx,
        )
        listener = asyncio.create_task(signals())
        try:
            code, result = await task
        except Exception as e:  # a bug: the client reports it as an infrastructure failure
            log.exception("local_worker.exec_failed")
            _send(writer, {"id": rid, "t": "error", "message": f"{type(e).__name__}: {e}"})
            return
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listener
        self.served += 1
        _send(writer, {"id": rid, "t": "result", "exit": code, "result": result})


def _level(name: Any, default: int) -> int:
    try:
        return level_number(name) if isinstance(name, str) else default
    except ValueError:
        return default


def _say(line: str) -> None:
    """Tell the starting CLI (our stdout is its pipe); it may have stopped waiting."""
    with contextlib.suppress(OSError):
        os.write(1, (line + "\n").encode())


def bind(files: WorkerFiles) -> socket.socket | None:
    """A listening socket at ``files.socket`` (mode 0600), or None when a live worker
    already answers there. Bound under a temporary name in the private directory and
    renamed into place, so a client never finds a socket that does not listen yet, and a
    stale one left by a killed worker is simply replaced. Raises OSError."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(files.socket)
        if probe.recv(4096).startswith(b'{"t":"hello"'):  # only a worker that greets is alive
            return None
    except OSError:
        pass
    finally:
        probe.close()
    tmp = f"{files.dir}/.d-{files.key}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(tmp)
        os.chmod(tmp, 0o600)
        sock.listen(128)
        os.rename(tmp, files.socket)
    except OSError:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return sock


def main(argv: list[str] | None = None) -> int:
    """Start a local worker (see the module docstring). Returns the exit code."""
    import argparse

    from pydantic import ValidationError

    from .. import aio
    from .identity import daemon_key
    from .rundir import RunDirError, worker_files

    ap = argparse.ArgumentParser(prog="python -m worker.localworker")
    ap.add_argument("--key", required=True)
    ap.add_argument("--backend", choices=("docker", "local"), default="docker")
    args = ap.parse_args(argv)
    try:
        settings = Settings()
        daemon_logs.configure(settings.log_level)
    except ValidationError as e:
        _say(f"error the settings do not validate: {describe_errors(e)}")
        return 2
    except ValueError as e:  # a log level logging does not know
        _say(f"error the settings do not validate: {e}")
        return 2
    if daemon_key(args.backend) != args.key:
        _say("error this process's code, settings or identity give another key")
        return 2
    try:
        files = worker_files(args.key)
    except RunDirError as e:
        _say(f"error {e}")
        return 1
    startup: list[Any] = []
    token = SINK.set(startup.append)
    try:
        calls = Calls(settings, args.backend)
    except Exception as e:
        _say(f"error the registry could not be built: {type(e).__name__}: {e}")
        return 1
    finally:
        SINK.reset(token)
    try:
        sock = bind(files)
    except OSError as e:
        _say(f"error cannot listen at {files.socket}: {e}")
        return 1
    if sock is None:
        _say("exists")
        return 0

    async def serve() -> str:
        worker = LocalWorker(settings, args.key, files, calls, startup)
        daemon_logs.lifecycle("local_worker.started", key=args.key, backend=args.backend, idle_exit=worker.idle)
        _say(f"ready {os.getpid()}")
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the pipe is closed: the CLI has what it waited for
        os.close(devnull)
        return await worker.run(sock)

    reason = aio.run(serve())
    daemon_logs.lifecycle("local_worker.exit", reason=reason)
    sys.stderr.flush()
    return 0
