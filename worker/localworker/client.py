"""The CLI's side of the local worker: find it, or start it and wait for it; send a call
and read the frames that answer it.

Standard library only, blocking sockets, no asyncio: this is on the path of every
``loom-worker call``, where the interpreter's own start is most of the budget. For the
same reason it uses ``_socket`` (``socket`` imports ``selectors`` and ``array``) and
imports what only starting a worker needs (``subprocess``, ``fcntl``, ``select``) there.

Two failures, told apart because only one of them allows running the call elsewhere:

- :class:`Unavailable`: nothing was sent (no run directory, the worker did not start, a
  ``retry`` answer twice...). The CLI runs the call in-process, as it did before the
  local worker existed;
- :class:`Lost`: the worker went away after the request was sent (killed, crashed). The
  call may or may not have run, so it is **not** run again automatically unless it only
  reads (:data:`RETRY_SAFE`): the CLI prints an infrastructure failure for it and exits 1.
  The next call starts a fresh worker.
"""

from __future__ import annotations

import _socket
import json
import os
import sys
import time

from ..limits import max_request_bytes, too_large
from . import wire
from .identity import cwd_matters, settings_env
from .rundir import RunDirError, WorkerFiles, worker_files

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

#: The switch (``LOOM_CLI_DAEMON``), read here without pydantic-settings, which costs more
#: than a whole call through the worker; the same words as pydantic's bool.
SWITCH = "LOOM_CLI_DAEMON"
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})

#: Seconds the CLI waits for a worker it started to say it listens.
START_TIMEOUT = 30.0
#: Seconds a worker has to greet a connection (it does so as it accepts it).
GREETING_TIMEOUT = 10.0
#: Calls that only read: after a lost worker they are run again in-process.
RETRY_SAFE = frozenset({"read_file", "list_directory", "search_files"})
#: A worker's log is moved aside (``.log.1``) past this size when a new one starts.
LOG_ROTATE_BYTES = 1 << 20
#: Seconds after which the files of a worker that no longer runs are removed.
PRUNE_AFTER = 7 * 86400


class Unavailable(Exception):
    """The local worker cannot take this call, and nothing was sent to it."""


class Lost(Exception):
    """The local worker went away after the call was sent: it may or may not have run."""


class Retry(Exception):
    """The worker answered ``retry``: nothing ran; a fresh worker should take the call."""


def switch(environ: Mapping[str, str] | None = None) -> bool | None:
    """``LOOM_CLI_DAEMON`` as a bool (default True); None when it is not a valid bool."""
    raw = (os.environ if environ is None else environ).get(SWITCH)
    if raw is None:
        return True
    word = raw.strip().lower()
    return True if word in _TRUE else False if word in _FALSE else None


class WorkerClient:
    """One connection to a local worker; requests on it are answered one at a time."""

    def __init__(self, sock: _socket.socket, files: WorkerFiles, key: str) -> None:
        self.sock = sock
        self.files = files
        self.key = key
        self._buf = b""
        self._next_id = 0
        #: The id of the request sent last (``exec`` signals name it).
        self.last_id = 0
        #: The most a call may hold, as the worker said in its greeting (LOOM_MAX_BODY_BYTES).
        self.max_request = max_request_bytes()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _readline(self) -> bytes:
        """The next line (b"" at the end of the stream). Raises OSError."""
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                line, self._buf = self._buf[: end + 1], self._buf[end + 1 :]
                return line
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                line, self._buf = self._buf, b""
                return b"" if not line.endswith(b"\n") else line
            self._buf += chunk

    def request(
        self,
        frame: dict[str, Any],
        on_log: Callable[[str], None] | None = None,
        on_frame: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Send ``frame`` and return the final frame of its answer; ``log`` frames before it
        go to ``on_log``, other frames of it (``output``) to ``on_frame``. Raises
        Unavailable when the request could not be sent at all (the worker is gone
        already), Lost when the answer breaks off."""
        self._next_id += 1
        rid = self.last_id = self._next_id
        data = wire.encode({"id": rid, **frame})  # id and op first: the worker reads them before the rest
        limit = wire.frame_limit(frame.get("op"), self.max_request)
        if len(data) > limit:  # the worker would refuse it while reading: nothing is sent
            shown = too_large(self.max_request, len(data)) if frame.get("op") == "call" else f"{len(data)} bytes"
            return {"id": rid, "t": "error", "code": "too_large", "message": shown}
        try:
            self.sock.sendall(data)
        except OSError as e:  # it went away before taking anything: nothing ran
            refused = self._refusal(rid)
            if refused is not None:
                return refused
            raise Unavailable(f"the local worker closed its socket ({e.strerror})") from None
        while True:
            try:
                line = self._readline()
            except OSError as e:
                raise Lost(f"the connection to the local worker broke ({e.strerror})") from None
            if not line:
                raise Lost("the local worker ended before it answered")
            try:
                answer = wire.decode(line)
            except ValueError as e:
                raise Lost(f"the local worker sent something that is not a frame ({e})") from None
            kind = answer.get("t")
            if kind == "log":
                if on_log is not None:
                    on_log(str(answer.get("text", "")))
                continue
            if kind in wire.FINAL and answer.get("id") in (rid, None):
                return answer
            if on_frame is not None and answer.get("id") == rid:
                on_frame(answer)

    def _refusal(self, rid: int) -> dict[str, Any] | None:
        """The worker's ``too_large`` answer to request ``rid``, when that is why it stopped
        reading it (a worker whose limit is lower than this client thought)."""
        try:
            self.sock.settimeout(GREETING_TIMEOUT)
            answer = wire.decode(self._readline())
        except (OSError, ValueError):
            return None
        if answer.get("code") == "too_large" and answer.get("id") in (rid, None):
            return answer
        return None

    def send(self, frame: dict[str, Any]) -> None:
        """Send a frame about a request in progress (``signal``); no answer comes to it.
        Safe from a signal handler. Raises OSError when the worker is gone."""
        self.sock.sendall(wire.encode(frame))

    def call(
        self,
        tool: str,
        arguments: Any,
        workspace: str,
        call_id: str | None,
        *,
        check_unknown: bool,
        on_log: Callable[[str], None],
        tty: bool,
        log_floor: str | None = None,
        on_pull: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """One tool call: its exit code and result; the worker sends its log lines from
        ``log_floor`` up (None: at its own level), and an image pull the call waits for
        is shown through ``on_pull`` (``pull`` frames). Raises Unavailable, Retry or Lost."""
        frame = {
            "op": "call",
            "key": self.key,
            "tool": tool,
            "arguments": arguments,
            "workspace": workspace,
            "call_id": call_id,
            "tty": tty,
            "check_unknown": check_unknown,
            "log_floor": log_floor,
        }
        answer = self.request(
            frame, on_log, None if on_pull is None else lambda f: on_pull(f) if f.get("t") == "pull" else None
        )
        kind = answer.get("t")
        if kind == "retry":
            raise Retry(str(answer.get("reason")))
        if kind == "error" and answer.get("code") == "too_large":  # refused, as in-process it would be
            message = str(answer.get("message"))
            # (``ToolResult.fail``'s dict, as ``worker.cli.tools.fail_dict`` makes it)
            result = {"success": False, "output": f"Error: {message}", "data": {"error_kind": "too_large"}}
            return 1, {**result, "files_changed": [], "error": message}
        if kind == "result" and isinstance(answer.get("result"), dict) and isinstance(answer.get("exit"), int):
            return answer["exit"], answer["result"]
        raise Lost(f"the local worker could not run the call: {answer.get('message', answer)}")


def _peer_uid(sock: _socket.socket) -> int:
    """The peer's uid (SO_PEERCRED: a struct ucred of three ints, pid uid gid)."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder, signed=True)


def connect(files: WorkerFiles, key: str) -> WorkerClient | None:
    """A connection to the running worker of ``files``, or None when none is running.

    A worker greets each connection it accepted (a ``hello`` frame) before the client
    sends anything. So a listener that goes away with connections still in its backlog
    (a worker that just stopped) resets them before any request was sent: that is "not
    running", and the call can safely go elsewhere. Only after the greeting can a call be
    lost. Raises Unavailable when something other than a worker of ours is there."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.connect(files.socket)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as e:
        sock.close()
        raise Unavailable(f"cannot connect to {files.socket}: {e.strerror}") from None
    uid = _peer_uid(sock)
    if uid != os.getuid():  # the directory is ours, so only root could have put it there
        sock.close()
        raise Unavailable(f"{files.socket} is served by uid {uid}, not by this user")
    client = WorkerClient(sock, files, key)
    sock.settimeout(GREETING_TIMEOUT)
    try:
        hello = wire.decode(client._readline())
    except (OSError, ValueError):  # reset, closed or silent before greeting: not a live worker
        client.close()
        return None
    sock.settimeout(None)
    if hello.get("t") != "hello":
        client.close()
        raise Unavailable(f"{files.socket} answered something other than a local worker's greeting")
    if isinstance(hello.get("max_request"), int):
        client.max_request = hello["max_request"]
    return client


def note(files: WorkerFiles, event: str, **fields: Any) -> None:
    """Append one JSON line to the worker's log (what ``doctor`` shows as the last word)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    line = json.dumps({**fields, "event": event, "level": "info", "logger": "worker.cli", "timestamp": stamp})
    try:
        fd = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def _lock(files: WorkerFiles, deadline: float) -> int:
    import fcntl

    fd = os.open(files.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise Unavailable("another CLI process is starting the local worker and has not finished") from None
            time.sleep(0.02)


def _read_ready(fd: int, deadline: float) -> str:
    """The worker's first line on its stdout pipe ('' when it closed it first)."""
    import select

    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unavailable(f"the local worker did not start within {START_TIMEOUT:g} s")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace")


def _prune(files: WorkerFiles) -> None:
    """Remove the lock and log files of workers not seen for a week (every code change
    makes a new key, so a development checkout would pile them up)."""
    cutoff = time.time() - PRUNE_AFTER
    try:
        names = os.listdir(files.dir)
    except OSError:
        return
    live = {n[: -len(".sock")] for n in names if n.endswith(".sock")}
    for name in names:
        stem = name.split(".", 1)[0]
        if not name.startswith("d-") or stem in live or stem == f"d-{files.key}" or name.endswith(".sock"):
            continue
        path = os.path.join(files.dir, name)
        try:
            if os.lstat(path).st_mtime < cutoff:
                os.unlink(path)
        except OSError:
            pass


def _start(files: WorkerFiles, key: str, backend: str) -> WorkerClient:
    import subprocess  # only when a worker must be started

    deadline = time.monotonic() + START_TIMEOUT
    lock = _lock(files, deadline)
    try:
        client = connect(files, key)  # another CLI may have started it while we waited
        if client is not None:
            return client
        _prune(files)
        try:
            if os.stat(files.log).st_size > LOG_ROTATE_BYTES:
                os.replace(files.log, files.log + ".1")
        except OSError:
            pass
        log_fd = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        env = settings_env(os.environ)
        try:
            proc = subprocess.Popen(
                # -P: the working directory is not put on sys.path (a project's own
                # "worker" package must not be imported in our place).
                [sys.executable, "-P", "-m", "worker.localworker", "--key", key, "--backend", backend],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log_fd,
                # Its own session: no terminal signals, and a CI step's pipes are not held
                # open by it (its stdout is our pipe until it is ready, stderr its log).
                start_new_session=True,
                # The working directory matters only with a relative path setting (then it
                # is in the key); otherwise the worker keeps no directory busy.
                cwd=os.getcwd() if cwd_matters(env) else "/",
            )
        except OSError as e:
            raise Unavailable(f"cannot start the local worker: {e}") from None
        finally:
            os.close(log_fd)
        assert proc.stdout is not None
        try:
            line = _read_ready(proc.stdout.fileno(), deadline)
        finally:
            proc.stdout.close()
        word, _, rest = line.partition(" ")
        if word not in ("ready", "exists"):
            code = proc.poll()
            why = rest if word == "error" else f"it exited (code {code}) before it was ready"
            note(files, "local_worker.start_failed", reason=why)
            raise Unavailable(f"the local worker did not start: {why}")
        client = connect(files, key)
        if client is None:
            raise Unavailable("the local worker said it was ready, but does not answer")
        return client
    finally:
        os.close(lock)


def open_worker(key: str, backend: str, *, start: bool = True) -> WorkerClient:
    """A connection to the local worker with ``key``, started when none runs (``start``).
    Raises Unavailable."""
    try:
        files = worker_files(key)
    except RunDirError as e:
        raise Unavailable(str(e)) from None
    client = connect(files, key)
    if client is not None:
        return client
    if not start:
        raise Unavailable("no local worker is running")
    return _start(files, key, backend)
