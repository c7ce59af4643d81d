"""Background processes: ``proc_start``, ``proc_output``, ``proc_input``, ``proc_kill``,
``proc_signal``, ``proc_resize``, ``proc_list``; a terminal is one started with ``pty``
(see ``supervisor.py``), reached as a byte stream through a tunnel (``attach``).

Each background process has its own supervisor (``supervisor.py``, a separate program
run by the agent runtime's interpreter) that owns it, keeps its output and serves it on a
unix socket in ``state.PROCS_DIR``. Any agent of the sandbox (each worker process has its
own) reaches any process through that socket, so a process outlives the call, the
connection and the worker process that started it, and stops only when it ends, times
out, is killed, or the container goes. The agent spares supervisors from its commands'
tree-kill and reaps them when they exit.

Starting a supervisor is mostly the interpreter booting, compiling its source and
importing its modules (about 25 ms of a 30 ms start). So the first start of an agent
also starts a **zygote** (``supervisor.zygote``): a supervisor program loaded once that
forks a supervisor for each config line it is sent, the next one forked ahead while
nothing waits; a start then costs what the supervisor does for its process. The
zygote goes when its agent goes (its stdin ends); one that died or does not answer is
replaced, and meanwhile a supervisor is started the slow way.
"""

import errno
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

from . import environ, jsonline, proctree, state
from .errors import Refused

TYPE_CHECKING = False
if TYPE_CHECKING:  # for mypy only: importing typing would cost every start of the agent
    from typing import Any  # noqa: F401  (used in type comments)

#: The characters of a process id (``^[A-Za-z0-9_-]{1,64}$``, checked without ``re``,
#: which the agent's boot does not import).
_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _valid_id(value):
    return isinstance(value, str) and 1 <= len(value) <= 64 and _ID_CHARS.issuperset(value)


START_TIMEOUT = 20.0
_started = {}  # type: dict  # supervisor pid -> Popen (ours: to reap, then unspare)
_lock = threading.Lock()


def _dir():
    """The private directory of the supervisors' sockets. Raises Refused when something
    else (a link, another owner, other modes) sits there."""
    d = state.PROCS_DIR
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise Refused("io", "cannot make %s: %s" % (d, e.strerror))
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
        raise Refused("conflict", "%s is not the agent's private directory (a command replaced it?)" % d)
    return d


def _interpreter():
    """How to run a Python program here: the agent runtime's loader and interpreter, as
    this agent was started (no image interpreter is assumed)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "surrogateescape") for a in f.read().split(b"\x00") if a]
    except OSError:
        argv = []
    for i, arg in enumerate(argv):
        if os.path.basename(arg).startswith("python"):
            return argv[: i + 1]
    return [sys.executable]


#: The supervisor's ``-c`` program: its source follows on stdin (a short command line in
#: ``ps``, not the whole program), then its config line, from the same buffered object.
_BOOT = (
    "import sys;r=sys.stdin.buffer;n=int(r.readline());"
    "exec(compile(r.read(n),'loom-supervisor','exec'),{'__name__':'__main__'})"
)


def _supervisor_source():
    """The supervisor's program: its module's source, as this agent got it (imported only
    here: an agent that never starts a background process never loads it)."""
    from . import supervisor

    loader = supervisor.__spec__.loader  # type: Any
    return loader.get_source(supervisor.__name__)


#: Every supervisor's own LOOM_CALL (its process's is ``bg-<id>``): not a command's, so
#: no command's tree-kill takes a supervisor reparented to PID 1 for one of its orphans.
SUPERVISOR_MARKER = "bg-supervisor"
_SUP_ENV = {"PATH": "/usr/bin:/bin", "LOOM_CALL": SUPERVISOR_MARKER}
#: The zygote (a Popen) and what was read of its answers; one start at a time uses it.
_zygote = [None, b""]  # type: list
_zygote_lock = threading.Lock()
#: Supervisors forked by the zygote (not this agent's children: spared by pid, let go
#: once they are gone).
_forked = set()  # type: set


def _boot(extra, tail):
    """A supervisor program started and fed its source then ``tail`` (its config line,
    or nothing for the zygote, which keeps stdin open). Raises Refused("io")."""
    try:
        p = subprocess.Popen(
            _interpreter() + ["-I", "-S", "-c", _BOOT] + extra,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_SUP_ENV,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )  # type: Any
    except OSError as e:
        raise Refused("io", "cannot start a supervisor: %s" % (e.strerror or e))
    proctree.spare(p.pid)
    with _lock:
        _started[p.pid] = p
    src = _supervisor_source().encode("utf-8")

    def feed():
        try:
            p.stdin.write(b"%d\n" % len(src) + src + tail)
            if tail:
                p.stdin.close()
            else:
                p.stdin.flush()
        except OSError:
            pass

    _quiet(feed)
    return p


def _read_line(p, buffered, timeout):
    """One line of ``p``'s stdout within ``timeout`` seconds (what came after it is
    returned too); (None, ...) when none came (it ended, or is stuck)."""
    fd = p.stdout.fileno()
    end = time.monotonic() + timeout
    while b"\n" not in buffered:
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None, buffered
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            return None, buffered
        buffered += chunk
    line, _, rest = buffered.partition(b"\n")
    return line, rest


def _drop_zygote():
    """(With _zygote_lock) let the zygote go: its stdin closed, it exits."""
    p, _zygote[0], _zygote[1] = _zygote[0], None, b""
    if p is not None:
        _quiet(p.stdin.close)
        p.stdout.close()


def _start_forked(cfg):
    """The supervisor's answer line, from one the zygote forked (the zygote started
    first when there is none); None when the zygote failed (dropped: the caller starts
    one the slow way)."""
    with _zygote_lock:
        p = _zygote[0]
        if p is None or p.poll() is not None:
            _drop_zygote()
            p = _zygote[0] = _boot(["zygote"], b"")

        def send():
            p.stdin.write(jsonline.dumps(cfg) + b"\n")
            p.stdin.flush()

        try:
            _quiet(send)
        except (OSError, ValueError):
            _drop_zygote()
            return None
        line, _zygote[1] = _read_line(p, _zygote[1], START_TIMEOUT)
        if line is None:
            _drop_zygote()
        return line


def _start_alone(cfg):
    """The answer line of a supervisor started by itself (its own interpreter)."""
    p = _boot([], jsonline.dumps(cfg) + b"\n")
    line, _ = _read_line(p, b"", START_TIMEOUT)
    p.stdout.close()
    return line


def _forget_forked():
    """Let go of the forked supervisors that are gone (reaped here if they were left to
    this agent)."""
    for pid in list(_forked):
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _forked.discard(pid)
            proctree.unspare(pid)
        except OSError:
            pass


def _quiet(fn, *args):
    """``fn(*args)`` with SIGPIPE held off this thread: the agent keeps SIGPIPE's default
    (so commands inherit it), which would end the agent on a write to a supervisor that
    just died. A SIGPIPE raised meanwhile is taken off (the write fails with EPIPE)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
    try:
        return fn(*args)
    finally:
        try:
            signal.sigtimedwait({signal.SIGPIPE}, 0)
        except (OSError, AttributeError):
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _reap():
    """Unspare the supervisors of ours that exited (reaped here, so no pid was reused),
    and the zygote's that are gone."""
    with _lock:
        done = [pid for pid, p in _started.items() if p.poll() is not None]
        for pid in done:
            _started.pop(pid, None)
            proctree.unspare(pid)
        _forget_forked()


#: One open connection per supervisor, reused (a connect and a thread in the supervisor
#: per request cost a third of a process_output); a busy one is not waited for.
_pool = {}  # type: dict  # process id -> [socket, reader, lock]
_pool_lock = threading.Lock()


def _connect(pid_id, timeout):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(os.path.join(_dir(), pid_id + ".sock"))
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        raise Refused(
            "not_found",
            "No process %s in this workspace (unknown, or it ended more than its linger time ago)" % pid_id,
        )
    except OSError:
        s.close()
        raise
    return [s, s.makefile("rb"), threading.Lock()]


def _drop(pid_id, conn):
    with _pool_lock:
        if _pool.get(pid_id) is conn:
            del _pool[pid_id]
    for c in conn[:2]:
        try:
            c.close()
        except OSError:
            pass


def _roundtrip(conn, req, timeout):
    conn[0].settimeout(timeout)
    _quiet(conn[0].sendall, jsonline.dumps(req) + b"\n")
    line = conn[1].readline()
    if not line:
        raise EOFError
    return line


def _ask(pid_id, req, timeout):
    """One request to process ``pid_id``'s supervisor. Raises Refused("not_found")."""
    if not _valid_id(pid_id):
        raise Refused("invalid", "Not a process id: %r" % (pid_id,))
    line = None
    for attempt in range(2):
        with _pool_lock:
            conn = _pool.get(pid_id)  # type: Any
        pooled = conn is not None and conn[2].acquire(False)
        if not pooled:
            try:
                conn = _connect(pid_id, timeout)
            except socket.timeout:
                raise Refused("timeout", "process %s did not answer" % pid_id)
            except OSError as e:
                raise Refused("not_found", "process %s is gone (%s)" % (pid_id, e.strerror or e))
            conn[2].acquire()
        try:
            line = _roundtrip(conn, req, timeout)
        except socket.timeout:
            _drop(pid_id, conn)
            raise Refused("timeout", "process %s did not answer" % pid_id)
        except (OSError, EOFError) as e:
            _drop(pid_id, conn)
            if pooled and attempt == 0:
                continue  # a stale pooled connection (the supervisor went): once more, afresh
            raise Refused("not_found", "process %s is gone (%s)" % (pid_id, getattr(e, "strerror", None) or e))
        finally:
            if conn[2].locked():
                conn[2].release()
        if not pooled:
            with _pool_lock:
                kept = _pool.setdefault(pid_id, conn) is conn
            if not kept:
                _drop(pid_id, conn)  # another thread pooled one meanwhile: close ours
        break
    try:
        answer = jsonline.loads(line or b"")
    except (TypeError, ValueError):
        raise Refused("not_found", "process %s is gone" % pid_id)
    if not answer.get("ok"):
        raise Refused("conflict", str(answer.get("error")))
    return answer["result"]


def _all():
    out = []
    d = _dir()
    for name in sorted(os.listdir(d)):
        if not name.endswith(".sock"):
            continue
        try:
            out.append(_ask(name[:-5], {"op": "info"}, 5.0))
        except Refused:
            continue
    return out


#: A terminal's environment: what an interactive program expects (colours, a pager, its
#: prompts), instead of the non-interactive base the tools' commands get.
TERMINAL_ENV = {"TERM": "xterm-256color", "COLORTERM": "truecolor"}
_NON_INTERACTIVE = ("CI", "NO_COLOR", "DEBIAN_FRONTEND", "GIT_TERMINAL_PROMPT", "PIP_NO_INPUT")


def _pty(req):
    """A terminal's size from ``req["pty"]`` (None: pipes). Raises Refused."""
    pty = req.get("pty")
    if pty is None:
        return None
    try:
        cols, rows = int(pty["cols"]), int(pty["rows"])
    except (TypeError, KeyError, ValueError):
        raise Refused("invalid", "pty must be {cols, rows}")
    if not (1 <= cols <= 1000 and 1 <= rows <= 1000):
        raise Refused("invalid", "a terminal's cols and rows must be 1-1000")
    return {"cols": cols, "rows": rows}


def _login_shell(env):
    """The sandbox user's login shell (its passwd entry's, else bash, else sh), as a login."""
    shells = []
    try:
        import pwd

        shells.append(pwd.getpwuid(os.getuid()).pw_shell)
    except (ImportError, KeyError):
        pass
    shells += ["/bin/bash", "/bin/sh"]
    for sh in shells:
        if sh and os.path.isabs(sh) and os.access(sh, os.X_OK) and not sh.endswith(("/nologin", "/false")):
            return [sh, "-l"]
    raise Refused("not_found", "No shell in this sandbox's image (tried %s): name a command" % ", ".join(shells))


def _terminal_env(env, asked):
    for k in _NON_INTERACTIVE:
        if k not in asked:
            env.pop(k, None)
    for k, v in TERMINAL_ENV.items():
        if k not in asked:
            env[k] = v
    path = env.get("PATH", "/usr/bin:/bin").split(":")
    if not any(os.access(os.path.join(d, "less"), os.X_OK) for d in path if d):
        return  # no pager to offer: the base's PAGER=cat stays
    for k in ("PAGER", "GIT_PAGER"):
        if k not in asked:
            env.pop(k, None)


def op_proc_start(req):
    _reap()
    pid_id = req.get("proc_id")
    if not _valid_id(pid_id):
        raise Refused("invalid", "Not a process id: %r" % (pid_id,))
    command, argv = req.get("command"), req.get("argv")
    pty = _pty(req)
    env, cwd = environ.command_env_cwd(req)
    if pty is not None:
        _terminal_env(env, req.get("env") or {})
        if not argv and not (isinstance(command, str) and command.strip()):
            argv = _login_shell(env)
    if argv is not None:
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise Refused("invalid", "argv must be a non-empty list of strings")
    elif not isinstance(command, str) or not command.strip():
        raise Refused("invalid", "Empty command")
    limit = int(req.get("max_running", 8))
    running = [p for p in _all() if p.get("running")]
    if len(running) >= limit:
        raise Refused(
            "limit",
            "This workspace already runs %d background processes (at most %d): wait for one to end or "
            "kill one (process_kill) before starting another" % (len(running), limit),
        )
    cfg = {
        "id": pid_id,
        "dir": _dir(),
        "command": command or " ".join(argv or []),
        "argv": argv,
        "pty": pty,
        "cwd": cwd,
        "env": env,
        "timeout": float(req.get("timeout", 3600)),
        "head": int(req.get("head", 64 << 10)),
        "tail": int(req.get("tail", 1 << 20)),
        "linger": float(req.get("linger", 600)),
        "grace": float(req.get("grace", 0.5)),
        "idle": float(req.get("idle") or 0),
        "marker": "bg-" + pid_id,
        "activity_file": state.ACTIVITY_FILE,
    }
    line = _start_forked(cfg)
    if line is None:
        line = _start_alone(cfg)
    try:
        answer = jsonline.loads(line or b"")
    except ValueError:
        answer = {"ok": False, "error": "the supervisor did not start"}
    if not answer.get("ok"):
        _reap()
        error = str(answer.get("error"))
        if "Errno %d]" % errno.EAGAIN in error:  # (no process could start: the pids limit)
            error += ": the sandbox's process limit is reached; end some of its processes"
        raise Refused("io", "cannot start the process: %s" % error)
    forked = answer.get("supervisor")
    if isinstance(forked, int) and not isinstance(forked, bool) and forked not in _started:
        proctree.spare(forked)
        _forked.add(forked)
    return answer["info"]


def op_proc_output(req):
    _reap()
    wait_ms = max(0, min(int(req.get("wait_ms") or 0), 60000))
    ask = {"op": "output", "since": req.get("since"), "wait_ms": wait_ms}  # since None: from the last read
    if req.get("max"):
        ask["max"] = int(req["max"])
    return _ask(req.get("proc_id"), ask, wait_ms / 1000.0 + 10.0)


def op_proc_input(req):
    return _ask(req.get("proc_id"), {"op": "input", "data": req.get("data") or "", "eof": bool(req.get("eof"))}, 10.0)


def op_proc_kill(req):
    _reap()
    ask = {"op": "kill", "signal": int(req.get("signal") or 15), "grace": float(req.get("grace", 0.5))}
    return _ask(req.get("proc_id"), ask, 40.0)


def op_proc_signal(req):
    """A signal to the process's foreground process group (a terminal's: what Ctrl-C reaches)."""
    return _ask(req.get("proc_id"), {"op": "signal", "signal": int(req.get("signal") or 2)}, 10.0)


def op_proc_resize(req):
    ask = {"op": "resize", "cols": req.get("cols"), "rows": req.get("rows")}
    return _ask(req.get("proc_id"), ask, 10.0)


def attach(pid_id, since):
    """A new connection to process ``pid_id``'s supervisor turned into its byte stream
    (see ``supervisor.py``): returns the connected socket and the attach answer (the
    process's info, ``cursor``, ``dropped``). Raises Refused("not_found")."""
    if not _valid_id(pid_id):
        raise Refused("invalid", "Not a process id: %r" % (pid_id,))
    if since is not None and (not isinstance(since, int) or isinstance(since, bool) or since < 0):
        raise Refused("invalid", "since must be a byte offset")
    try:
        conn = _connect(pid_id, 10.0)
    except OSError as e:
        raise Refused("not_found", "process %s is gone (%s)" % (pid_id, e.strerror or e))
    conn[1].close()  # (the line reader: this socket is read by hand below, then by its next holder)
    s = conn[0]
    try:
        _quiet(s.sendall, jsonline.dumps({"op": "attach", "since": since}) + b"\n")
        # The answer line alone: what follows it is the stream's, for whoever holds the
        # socket next (the host, when it is handed over), so nothing past it is read here.
        head = b""
        while not head.endswith(b"\n"):
            peek = s.recv(65536, socket.MSG_PEEK)
            if not peek:
                raise EOFError
            cut = peek.find(b"\n")
            head += s.recv(len(peek) if cut < 0 else cut + 1)
            if len(head) > 1 << 20:
                raise EOFError
        answer = jsonline.loads(head)
    except (OSError, EOFError, ValueError):
        s.close()
        raise Refused("not_found", "process %s is gone" % pid_id)
    if not answer.get("ok"):
        s.close()
        raise Refused("conflict", str(answer.get("error")))
    s.settimeout(None)
    return s, answer["result"]


def op_proc_release(req):
    """Let an ended process's supervisor go now rather than after its linger time."""
    return _ask(req.get("proc_id"), {"op": "release"}, 5.0)


def op_proc_list(req):
    _reap()
    return {"processes": _all()}
