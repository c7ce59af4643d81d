# long module: one standalone program, sent as its own source and run with no agent beside it
"""The supervisor of one background process: a small program of its own, not a module of
the running agent.

An agent starts it (``processes.op_proc_start``) with the agent runtime's interpreter and
this module's source as its program, and hands it one config line on stdin. From then on
it depends on no agent: the agent that started it may go (a CLI call ends, its worker
process exits) and the process goes on, its output kept here, until it ends, times out or
is killed, or the container goes.

It is the process's parent and, where the kernel allows (runc), the child subreaper of
everything it starts, so ``setsid``, double forks and ``nohup &`` inside it come back
here; under gVisor they are also found by the process's session and its ``LOOM_CALL``
marker. When the process ends (exit, timeout, kill) whatever it left running is killed,
as after a command.

Its output is kept per stream as a head and a tail with absolute offsets (bounded memory
whatever the process prints); a reader passes the cursor it got last and gets what came
after it, and the bytes that fell between head and tail are counted, not invented.

It listens on ``<dir>/<id>.sock`` (the directory is private to the sandbox's user) for
newline-delimited JSON requests: ``info``, ``output`` (long-polled), ``input``, ``kill``,
``signal``, ``resize``, ``release``, ``attach``. After the process ended it lingers
(``linger`` seconds) so its last output and exit can still be read, then removes its
socket and exits.

A terminal (``"pty": {"cols": C, "rows": R}`` in the config) is such a process on a
pseudo-terminal: its one output stream is what the terminal shows (kept as a tail only:
the scrollback a reattaching client gets replayed), ``input`` goes to the terminal as if
typed, ``resize`` sets its size (the foreground program gets ``SIGWINCH``), ``signal``
goes to its foreground process group (what Ctrl-C reaches). ``attach`` turns its
connection into a raw byte stream: one answer line (the process's info, the ``cursor`` the
stream starts at and the bytes ``dropped`` before it), then the output from that cursor as
it comes, and whatever the client sends is input; the stream ends (shut down for writing)
when the process has ended and its output is all sent. While a client is attached and
behind by half the scrollback, the terminal is not read: its program blocks on output as
on a real terminal instead of losing what the client has not seen.

Standard library only, Python >= 3.8, no import of the agent's package.
"""

import base64
import ctypes
import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # for mypy only: importing typing would cost the supervisor's start
    from typing import Any  # noqa: F401  (used in type comments)


#: Seconds after the process ended that its pipes are waited for before its output is
#: called complete.
DRAIN_LIMIT = 10.0


def _prctl(option, arg):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) == 0
    except Exception:
        return False


class Stream(object):
    """One output stream: its first ``head`` bytes and its last ``tail`` bytes, addressed
    by absolute offsets (cursors)."""

    def __init__(self, head, tail):
        self.head_cap = head
        self.tail_cap = tail
        self.head = bytearray()
        self.tail = bytearray()
        self.tail_start = 0  # offset of tail[0]
        self.total = 0

    def add(self, data):
        if len(self.head) < self.head_cap:
            take = data[: self.head_cap - len(self.head)]
            self.head += take
            self.total += len(take)
            self.tail_start = self.total
            data = data[len(take) :]
        if data:
            self.tail += data
            self.total += len(data)
            excess = len(self.tail) - self.tail_cap
            if excess > 0:
                del self.tail[:excess]
                self.tail_start += excess

    def read(self, cursor, max_bytes):
        """``(data, next cursor, bytes dropped before data)`` from ``cursor``."""
        cursor = max(0, min(int(cursor), self.total))
        if cursor < len(self.head):
            chunk = bytes(self.head[cursor : cursor + max_bytes])
            return chunk, cursor + len(chunk), 0
        dropped = 0
        if cursor < self.tail_start:
            dropped = self.tail_start - cursor
            cursor = self.tail_start
        off = cursor - self.tail_start
        chunk = bytes(self.tail[off : off + max_bytes])
        return chunk, cursor + len(chunk), dropped


class _Client(object):
    """An attached client: where its stream is, and whether it went."""

    def __init__(self, cursor, conn=None):
        self.cursor = cursor
        self.gone = False
        self.conn = conn
        #: Something is sending to it outside the lock (the attach answer, then its sender
        #: thread): nobody else may send meanwhile.
        self.busy = True


class Supervisor(object):
    def __init__(self, cfg):
        self.cfg = cfg
        self.id = cfg["id"]
        self.command = cfg.get("command") or " ".join(cfg.get("argv") or [])
        self.marker = cfg["marker"]
        self.grace = float(cfg.get("grace", 0.5))
        self.lock = threading.Condition()
        self.out = Stream(int(cfg.get("head", 64 << 10)), int(cfg.get("tail", 1 << 20)))
        self.err = Stream(int(cfg.get("head", 64 << 10)), int(cfg.get("tail", 1 << 20)))
        self.started = time.time()
        self.ended = None
        self.exit_code = None
        self.signal = None
        self.outcome = None
        self.reason = None  # "timeout", "killed": why it was ended from outside
        self.released = False
        self.proc = None  # type: Any
        self.subreaper = False
        self.readers_done = 0
        #: Both pipes read to their end (or given up on, DRAIN_LIMIT after the exit): only
        #: then is an ended process's output complete, and a reader told "done".
        self.drained = False
        self.stdin_closed = False
        #: Where a reader that passes no cursor goes on from: what "since the last read"
        #: means, shared by every worker process (the model's process_output).
        self.read_cursor = [0, 0]
        #: When a reader or writer last came (``info`` does not count): past ``idle``
        #: seconds without one, the process is ended as timed out.
        self.last_use = time.time()
        #: A terminal's: its size and master side (None for a process on pipes).
        self.pty = cfg.get("pty")
        self.master = None  # type: Any
        #: Attached clients (their cursors hold a terminal's output back).
        self.clients = []  # type: list

    # -- the process --------------------------------------------------------------

    def start(self):
        cfg = self.cfg
        self.subreaper = _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
        _prctl(4, 0)  # not dumpable: the process's own code cannot reach into us
        env = dict(cfg.get("env") or {})
        env["LOOM_CALL"] = self.marker
        argv = cfg.get("argv") or ["/bin/sh", "-c", cfg["command"]]
        if self.pty:
            self._start_pty(argv, env)
            return
        proc = subprocess.Popen(
            argv,
            cwd=cfg.get("cwd") or "/",
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            restore_signals=True,
        )  # type: Any
        self.proc = proc
        # Few threads: under gVisor's ptrace platform each is a host thread, counted
        # against the container's pids limit like a process.
        for target in (self._read, self._wait):
            t = threading.Thread(target=target)
            t.daemon = True
            t.start()

    def _start_pty(self, argv, env):
        master, slave = os.openpty()
        self._winsize(master)
        self.proc = subprocess.Popen(
            argv,
            cwd=self.cfg.get("cwd") or "/",
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            close_fds=True,
            restore_signals=True,
            # (after setsid) the terminal becomes the session's controlling terminal: job
            # control, Ctrl-C and SIGWINCH reach its foreground process group
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self.master = master
        self.readers_done = 1  # one stream: stderr is the terminal too
        for target in (self._read_pty, self._wait):
            t = threading.Thread(target=target)
            t.daemon = True
            t.start()

    def _winsize(self, fd):
        rows, cols = int(self.pty["rows"]), int(self.pty["cols"])
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def _held_back(self):
        """A terminal's output waits while an attached client is behind by half the tail."""
        slack = self.out.tail_cap // 2
        return any(c.cursor < self.out.total - slack for c in self.clients)

    def _read_pty(self):
        """The terminal's master side until every process holding the terminal is gone
        (then reading fails with EIO)."""
        while True:
            with self.lock:
                while self._held_back() and self.ended is None:
                    self.lock.wait(0.5)
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                chunk = b""
            with self.lock:
                if chunk:
                    self.out.add(chunk)
                    self._push(chunk)
                else:
                    self.readers_done = 2
                    self.drained = True
                self.lock.notify_all()
            if not chunk:
                return

    def _push(self, chunk):
        """(With the lock held) ``chunk``, just added, straight to each attached client that
        had everything before it and whose socket takes it now: a keystroke's echo goes
        out on this thread, without waking the client's sender (a thread hand-over costs
        more than the terminal's own round trip). What does not fit is the sender's."""
        start = self.out.total - len(chunk)
        for c in self.clients:
            if c.busy or c.gone or c.cursor != start or c.conn is None:
                continue
            try:
                c.cursor += c.conn.send(chunk, socket.MSG_DONTWAIT)
            except OSError:
                pass  # full (or gone): its sender takes it from the cursor

    def _read(self):
        """Both pipes, on one thread, until both end."""
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout.fileno(), selectors.EVENT_READ, self.out)
        sel.register(self.proc.stderr.fileno(), selectors.EVENT_READ, self.err)
        while sel.get_map():
            for key, _ in sel.select():
                try:
                    chunk = os.read(key.fd, 65536)
                except OSError:
                    chunk = b""
                with self.lock:
                    if chunk:
                        key.data.add(chunk)
                    else:
                        sel.unregister(key.fd)
                        self.readers_done += 1
                        if self.readers_done == 2:
                            self.drained = True
                    self.lock.notify_all()
        sel.close()

    def _wait(self):
        """Reap every child (orphans come back to us as subreaper); the main one's status
        ends the process, and whatever it left running is killed."""
        main = self.proc.pid
        status = None
        while status is None:
            try:
                pid, st = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            if pid == main:
                status = st
        self.kill_tree(self.grace if self.reason is None else 0.0)
        # The pipes' last bytes (a child that still held them was just killed).
        deadline = time.monotonic() + 1.0
        with self.lock:
            while self.readers_done < 2 and time.monotonic() < deadline:
                self.lock.wait(0.05)
            if status is None:
                self.exit_code, self.outcome = -1, "signal"
            elif os.WIFSIGNALED(status):
                self.signal = os.WTERMSIG(status)
                self.exit_code = 128 + self.signal
                self.outcome = "signal"
            else:
                self.exit_code = os.WEXITSTATUS(status)
                self.outcome = "exit"
            if self.reason == "timeout":
                self.outcome = "timeout"
            self.ended = time.time()
            self.lock.notify_all()
            # A slow reader (gVisor's ptrace platform on a busy host lags by seconds) still
            # has the pipes' last bytes to take: "done" waits for them. A pipe still held
            # open past DRAIN_LIMIT (by something that escaped the kill) is given up on.
            limit = time.monotonic() + DRAIN_LIMIT
            while not self.drained and time.monotonic() < limit:
                self.lock.wait(0.1)
            self.drained = True
            self.lock.notify_all()
        # Reap the rest as they die, until we go.
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(0.5)
            except OSError:
                time.sleep(0.5)

    def tick(self, now, last_touch):
        """Called by the main loop about every 0.2 s: the timeout, and the keeper's
        clock (while the process runs the sandbox is not idle). Returns the last touch."""
        if self.ended is not None:
            return last_touch
        if self.clients:
            self.last_use = now  # an attached client uses it
        timeout = float(self.cfg.get("timeout") or 0)
        idle = float(self.cfg.get("idle") or 0)
        if (
            (timeout > 0 and now - self.started > timeout) or (idle > 0 and now - self.last_use > idle)
        ) and self.reason is None:
            with self.lock:
                self.reason = "timeout"
            self.kill_tree(self.grace)
        path = self.cfg.get("activity_file")
        if path and now - last_touch >= 5.0:
            try:
                os.utime(path, None)
            except OSError:
                try:
                    open(path, "a").close()
                except OSError:
                    pass
            return now
        return last_touch

    # -- its tree -----------------------------------------------------------------------

    def _tree(self):
        me = os.getpid()
        table = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % name, "rb") as fh:
                    data = fh.read()
                rest = data[data.rindex(b")") + 2 :].split()
                if rest[0] in (b"Z", b"X"):
                    continue  # dead already, only not reaped yet: nothing to kill
                table[int(name)] = (int(rest[1]), int(rest[3]))  # ppid, session
            except (OSError, ValueError, IndexError):
                continue
        kids = {}  # type: dict
        for pid, (ppid, _sid) in table.items():
            kids.setdefault(ppid, []).append(pid)
        todo = list(kids.get(me, []))
        if not self.subreaper and self.proc is not None:
            # Without the subreaper bit orphans go to PID 1: find them by session and marker.
            for pid, (_ppid, sid) in table.items():
                if pid != me and (sid == self.proc.pid or self._marked(pid)):
                    todo.append(pid)
        found = set()
        while todo:
            pid = todo.pop()
            if pid in found or pid == me:
                continue
            found.add(pid)
            todo.extend(kids.get(pid, []))
        return found

    def _marked(self, pid):
        try:
            with open("/proc/%d/environ" % pid, "rb") as fh:
                env = fh.read()
        except OSError:
            return False
        return ("LOOM_CALL=" + self.marker).encode() in env.split(b"\x00")

    def kill_tree(self, grace, sig=signal.SIGTERM):
        """``sig`` to everything the process started, ``grace`` seconds, then KILL."""
        pids = self._tree()
        if not pids:
            return
        if grace > 0:
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            end = time.monotonic() + grace
            while time.monotonic() < end:
                time.sleep(0.02)
                pids = self._tree()
                if not pids:
                    return
        for _ in range(500):
            pids = self._tree()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGSTOP)  # freeze first: a fork bomb cannot outrun us
                except OSError:
                    pass
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.002)

    # -- requests -------------------------------------------------------------------------

    def info(self):
        return {
            "id": self.id,
            "command": self.command,
            "pid": self.proc.pid if self.proc is not None else None,
            "started": self.started,
            "running": self.ended is None,
            "ended": self.ended,
            "exit_code": self.exit_code,
            "outcome": self.outcome,
            "signal": self.signal,
            "stdout_bytes": self.out.total,
            "stderr_bytes": self.err.total,
            "pty": dict(self.pty) if self.pty else None,
        }

    def op_output(self, req):
        since = req.get("since")
        consume = since is None
        with self.lock:
            so, se = self.read_cursor if consume else (int(since[0]), int(since[1]))
        max_bytes = max(1, min(int(req.get("max", 1 << 20)), 8 << 20))
        wait = max(0.0, min(float(req.get("wait_ms", 0)) / 1000.0, 60.0))
        end = time.monotonic() + wait
        with self.lock:
            while so >= self.out.total and se >= self.err.total and not (self.ended is not None and self.drained):
                left = end - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(left)
            out, so2, do = self.out.read(so, max_bytes)
            err, se2, de = self.err.read(se, max_bytes)
            if consume:
                self.read_cursor = [so2, se2]
            answer = self.info()
        answer.update(
            {
                "stdout": base64.b64encode(out).decode("ascii"),
                "stderr": base64.b64encode(err).decode("ascii"),
                "cursor": [so2, se2],
                "dropped": [do, de],
                # Nothing more will come: ended, and both streams read to their end.
                "done": answer["ended"] is not None
                and self.drained
                and so2 >= self.out.total
                and se2 >= self.err.total,
            }
        )
        return answer

    def op_input(self, req):
        data = base64.b64decode(req.get("data") or "")
        if self.ended is not None or self.stdin_closed:
            raise ValueError("the process no longer reads its input")
        if self.master is not None:
            self._type(data + (b"\x04" if req.get("eof") else b""))  # Ctrl-D: end of input
            return {"written": len(data)}
        try:
            if data:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            if req.get("eof"):
                self.proc.stdin.close()
                self.stdin_closed = True
        except (BrokenPipeError, ValueError, OSError):
            raise ValueError("the process no longer reads its input")
        return {"written": len(data)}

    def op_kill(self, req):
        sig = int(req.get("signal") or signal.SIGTERM)
        grace = max(0.0, min(float(req.get("grace", self.grace)), 30.0))
        with self.lock:
            if self.ended is None and self.reason is None:
                self.reason = "killed"
        if self.ended is None:
            self.kill_tree(grace, sig)
        with self.lock:
            end = time.monotonic() + 5.0
            while self.ended is None and time.monotonic() < end:
                self.lock.wait(0.05)
        return self.info()

    def _type(self, data):
        """``data`` to a terminal as if typed. Raises ValueError once nothing reads it."""
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.master, view)
            except InterruptedError:
                continue
            except OSError:
                raise ValueError("the process no longer reads its input")
            view = view[n:]

    def _foreground(self):
        """The process group a signal for "the process" goes to: a terminal's foreground
        one (the program the user runs there), else the process's own."""
        if self.master is None:
            return self.proc.pid
        try:
            return os.tcgetpgrp(self.master)
        except OSError:
            pass
        # gVisor answers neither the master's TIOCGPGRP nor /proc's tpgid: the newest
        # process group of the terminal's session other than its leader's (the job the
        # shell runs now; a background job started later would be taken for it).
        best, newest = self.proc.pid, -1
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % name, "rb") as fh:
                    data = fh.read()
                rest = data[data.rindex(b")") + 2 :].split()
                pgrp, sid, start = int(rest[2]), int(rest[3]), int(rest[19])
            except (OSError, ValueError, IndexError):
                continue
            if sid == self.proc.pid and pgrp == int(name) and pgrp != sid and start > newest:
                best, newest = pgrp, start
        return best

    def op_signal(self, req):
        sig = int(req.get("signal") or signal.SIGINT)
        if self.ended is not None:
            raise ValueError("the process has ended")
        try:
            os.killpg(self._foreground(), sig)
        except OSError as e:
            raise ValueError("cannot signal the process: %s" % (e.strerror or e))
        return self.info()

    def op_resize(self, req):
        if self.master is None:
            raise ValueError("process %s has no terminal to resize" % self.id)
        cols, rows = int(req.get("cols") or 0), int(req.get("rows") or 0)
        if not (1 <= cols <= 1000 and 1 <= rows <= 1000):
            raise ValueError("cols and rows must be 1-1000")
        changed = (cols, rows) != (self.pty["cols"], self.pty["rows"])
        self.pty = {"cols": cols, "rows": rows}
        self._winsize(self.master)
        if changed and self.ended is None:
            try:  # (the kernel sends it too; gVisor's may not)
                os.killpg(self._foreground(), signal.SIGWINCH)
            except OSError:
                pass
        return self.info()

    def handle(self, req):
        op = req.get("op")
        if op != "info":
            self.last_use = time.time()
        if op == "info":
            return self.info()
        if op == "output":
            return self.op_output(req)
        if op == "input":
            return self.op_input(req)
        if op == "kill":
            return self.op_kill(req)
        if op == "signal":
            return self.op_signal(req)
        if op == "resize":
            return self.op_resize(req)
        if op == "release":
            self.released = True
            return {"released": True}
        raise ValueError("unknown op %r" % (op,))

    def serve(self, listener):
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            t = threading.Thread(target=self._client, args=(conn,))
            t.daemon = True
            t.start()

    def _client(self, conn):
        f = conn.makefile("rb")
        try:
            for line in f:
                try:
                    req = json.loads(line)
                    if req.get("op") == "attach":
                        self._attach(conn, f, req)
                        return
                    answer = {"ok": True, "result": self.handle(req)}
                except Exception as e:
                    answer = {"ok": False, "error": str(e) or type(e).__name__}
                conn.sendall(json.dumps(answer, separators=(",", ":")).encode() + b"\n")
        except OSError:
            pass
        finally:
            f.close()
            conn.close()

    # -- an attached client: the output as it comes, its bytes as input ---------------------

    def _attach(self, conn, f, req):
        since = req.get("since")
        with self.lock:
            # (a terminal keeps no head: its output is the tail, what it replays)
            cursor = self.out.tail_start if since is None else max(0, min(int(since), self.out.total))
            dropped = max(0, self.out.tail_start - cursor)
            client = _Client(max(cursor, self.out.tail_start), conn)
            self.clients.append(client)
            answer = self.info()
        self.last_use = time.time()
        answer.update({"cursor": client.cursor, "dropped": dropped})
        try:
            try:
                conn.sendall(json.dumps({"ok": True, "result": answer}, separators=(",", ":")).encode() + b"\n")
            finally:
                with self.lock:
                    client.busy = False  # (the answer is out: output may follow it)
            t = threading.Thread(target=self._send_output, args=(conn, client))
            t.daemon = True
            t.start()
            while True:
                data = f.read1(65536)
                if not data:
                    break
                self.last_use = time.time()
                if self.master is not None and self.ended is None:
                    try:
                        self._type(data)
                    except ValueError:
                        pass  # ended meanwhile: the stream's end tells the client
        except OSError:
            pass
        finally:
            with self.lock:
                if client in self.clients:
                    self.clients.remove(client)
                client.gone = True
                self.lock.notify_all()

    def _send_output(self, conn, client):
        while True:
            with self.lock:
                while (
                    not client.gone
                    and client.cursor >= self.out.total
                    and not (self.ended is not None and self.drained)
                ):
                    self.lock.wait()
                if client.gone:
                    return
                data, client.cursor, _ = self.out.read(client.cursor, 1 << 20)
                done = self.ended is not None and self.drained and client.cursor >= self.out.total
                client.busy = True
                self.lock.notify_all()  # (the terminal's reader may be waiting for us)
            try:
                if data:
                    conn.sendall(data)
                if done:
                    conn.shutdown(socket.SHUT_WR)
                    return
            except OSError:
                return
            finally:
                with self.lock:
                    client.busy = False


def main(cfg=None):
    """Supervise the process ``cfg`` describes (None: read the config line from stdin);
    the answer line (``ok``, the process's ``info``, this supervisor's pid) goes to stdout.
    Returns the exit status."""
    if cfg is None:
        cfg = json.loads(sys.stdin.buffer.readline())  # (the same buffer the bootstrap read us from)
    sup = Supervisor(cfg)
    path = os.path.join(cfg["dir"], cfg["id"] + ".sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ready = sys.stdout.buffer
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(64)
        sup.start()
    except Exception as e:
        ready.write(json.dumps({"ok": False, "error": "%s: %s" % (type(e).__name__, e)}).encode() + b"\n")
        ready.flush()
        return 1
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    ready.write(json.dumps({"ok": True, "info": sup.info(), "supervisor": os.getpid()}).encode() + b"\n")
    ready.flush()
    # From here on nothing ties us to the agent that started us.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sup.released = False
    t = threading.Thread(target=sup.serve, args=(listener,))
    t.daemon = True
    t.start()
    linger = float(cfg.get("linger", 600))
    touched = 0.0
    while True:
        time.sleep(0.2)
        now = time.time()
        touched = sup.tick(now, touched)
        if sup.released or (sup.ended is not None and now - sup.ended > linger):
            break
    try:
        os.unlink(path)
    except OSError:
        pass
    if sup.ended is None:
        sup.kill_tree(0.0)
    return 0


def zygote():
    """Serve supervisors by forking: for each config line on stdin, a child that
    supervises that process (in a session of its own) and writes its answer line to
    stdout. The program is loaded once, here, and the next child is forked ahead, while
    nothing waits for it (a fork costs ~1 ms under runc, ~18 ms under gVisor): it waits
    on a pipe of its own for its config. Children are not waited for (SIGCHLD ignored:
    the kernel reaps them). Ends at the end of stdin (its agent went); the child forked
    ahead then ends too (its pipe ends)."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    lines = sys.stdin.buffer
    ahead = _fork_ahead()
    while True:
        line = lines.readline()
        if not line:
            return 0
        if ahead is None:
            ahead = _fork_ahead()
            if ahead is None:
                sys.stdout.buffer.write(json.dumps({"ok": False, "error": "cannot fork a supervisor"}).encode() + b"\n")
                sys.stdout.buffer.flush()
                continue
        try:
            os.write(ahead, line)
        finally:
            os.close(ahead)
        ahead = _fork_ahead()


def _fork_ahead():
    """(In the zygote) a child waiting for its config line on a pipe; the pipe's end to
    write it to, or None when no child could be forked."""
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid:
        os.close(r)
        return w
    os.close(w)
    code = 1
    try:
        data = b""
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(r)
        if not data:
            code = 0  # the zygote ended: no process for us
        else:
            os.setsid()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = main(json.loads(data))
    except BaseException as e:  # (the answer the agent waits for, whatever happened)
        try:
            sys.stdout.buffer.write(json.dumps({"ok": False, "error": repr(e)}).encode() + b"\n")
            sys.stdout.buffer.flush()
        except BaseException:
            pass
    finally:
        os._exit(code or 0)


if __name__ == "__main__":
    sys.exit(zygote() if sys.argv[1:] == ["zygote"] else main())
