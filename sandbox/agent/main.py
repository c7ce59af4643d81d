"""The agent's main loop and, for now, all of its operations (see the package's docstring)."""

import base64
import collections
import ctypes
import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time

from . import (
    activity,
    cgroup,
    channel,
    disk,
    environ,
    files,
    listing,
    proctree,
    scan,
    search,
    state,
    tidy,
    tree,
    write,
)
from .errors import Refused, error_answer

AGENT_VERSION = "1"

KILL_GRACE = 0.5
LINGER_AFTER_EXIT = 0.1
#: For this long after starting a command the agent polls for its output and exit
#: without sleeping (yielding the CPU on each round). A thread that sleeps lets its CPU go
#: idle, and under virtualization (no guest halt-polling) waking an idle vCPU is slow:
#: measured in the sandbox on this project's CI VM, `true` takes ~0.2 ms less this way
#: and 8-13 ms commands ~1 ms less. Bounded: at most this much CPU per command.
SPIN_WINDOW = 0.002
_sched_yield = getattr(os, "sched_yield", lambda: None)

_exec_lock = threading.Lock()


# --------------------------------------------------------------------------- helpers


def _prctl(option, arg):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) == 0
    except Exception:
        return False


# --------------------------------------------------------------------------- file ops


def op_hello(req):
    return {
        "version": AGENT_VERSION,
        "uid": os.getuid(),
        "gid": os.getgid(),
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "kernel": os.uname().release,
        "subreaper": state.subreaper,
        "ripgrep": search.rg_command() is not None,
        # Commands run with the image's own /bin/sh: an image without one cannot serve.
        "shell": os.access("/bin/sh", os.X_OK),
        "cpu_quota": cgroup.cpu_quota(),
    }


# --------------------------------------------------------------------------- search


# --------------------------------------------------------------------------- exec


class _Capped(object):
    """Keeps the first and last ``cap/2`` bytes of a stream; memory stays bounded."""

    def __init__(self, cap):
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = collections.deque()  # type: collections.deque
        self.tail_len = 0
        self.total = 0

    def add(self, chunk):
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(bytes(chunk))
            self.tail_len += len(chunk)
            while self.tail_len - len(self.tail[0]) >= self.tail_cap:
                self.tail_len -= len(self.tail.popleft())

    def value(self):
        tail = b"".join(self.tail)
        if len(tail) > self.tail_cap:
            tail = tail[len(tail) - self.tail_cap :]
        kept = len(self.head) + len(tail)
        if kept >= self.total:
            return bytes(self.head) + tail, False
        marker = ("\n[... %d bytes omitted ...]\n" % (self.total - kept)).encode()
        return bytes(self.head) + marker + tail, True


def op_exec(req):
    command = req.get("command")
    argv = req.get("argv")
    if argv is not None:
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise Refused("invalid", "argv must be a non-empty list of strings")
    elif not isinstance(command, str) or not command.strip():
        raise Refused("invalid", "Empty command")
    timeout = float(req.get("timeout", 60))
    cap = int(req.get("max_output", 256 * 1024))
    hard_limit = int(req.get("output_limit", 64 << 20))
    env, cwd = environ.command_env_cwd(req)
    scan_req = req.get("scan")
    if isinstance(scan_req, dict):
        # The scans bracketing the command travel with it. Run only if the tree is known
        # unchanged since the host's last scan; otherwise hand that scan back unrun, so
        # the host records outside changes before the command can touch the same files.
        pre = scan.op_scan(scan_req)
        if not (pre.get("from_events") and not pre["entries"] and not pre["removed"]):
            return {"ran": False, "scan": pre}
        scan_req = dict(scan_req)
        scan_req["since"] = pre["generation"]
    else:
        scan_req = None
    result = _run_command(req, command, argv, timeout, cap, hard_limit, env, cwd)
    if scan_req is not None:
        try:
            result["scan"] = scan.op_scan(scan_req)
        except Exception:
            pass  # the host's next scan (a full diff) catches up
    return result


def _run_command(req, command, argv, timeout, cap, hard_limit, env, cwd):
    marker = os.urandom(8).hex()
    env["LOOM_CALL"] = marker
    with _exec_lock:
        oom_before = cgroup.oom_kills()
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv or ["/bin/sh", "-c", command],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            return {
                "exit_code": 127,
                "stdout": "",
                "stderr": channel.b64(("%s\n" % e).encode()),
                "outcome": "exit",
                "duration_ms": 0.0,
                "truncated": False,
                "signal": None,
                "stdout_bytes": 0,
                "stderr_bytes": 0,
            }
        assert proc.stdout is not None and proc.stderr is not None
        # The start time is only needed where orphans are hunted by heuristics (gVisor).
        ctx = (proc.pid, 0 if state.subreaper else (proctree.start_ticks(proc.pid) or 0), marker)
        try:
            # The OOM killer must pick the command, never the agent.
            with open("/proc/%d/oom_score_adj" % proc.pid, "w") as fh:
                fh.write("1000")
        except OSError:
            pass
        out_buf, err_buf = _Capped(cap), _Capped(cap)
        bufs = {proc.stdout.fileno(): out_buf, proc.stderr.fileno(): err_buf}
        sel = selectors.DefaultSelector()
        for f in (proc.stdout, proc.stderr):
            os.set_blocking(f.fileno(), False)
            sel.register(f.fileno(), selectors.EVENT_READ)
        deadline = started + timeout
        outcome = None
        disk_watch = disk.DiskWatch(started) if (state.DISK_LIMIT or state.DISK_RESERVE or state.INODE_LIMIT) else None
        exited_at = None
        open_fds = set(bufs)
        last_touch = started
        while open_fds:
            now = time.monotonic()
            if now >= deadline:
                outcome = "timeout"
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > LINGER_AFTER_EXIT:
                break  # a background child still holds the pipe: do not wait for it
            if now - last_touch > 30:
                activity.touch()
                last_touch = now
            if disk_watch is not None and disk_watch.exceeded(now):
                outcome = "disk_limit"
                break
            wait = min(deadline - now, disk.DISK_POLL if exited_at is None else LINGER_AFTER_EXIT)
            if now - started < SPIN_WINDOW:
                wait = 0
                _sched_yield()
            for key, _ in sel.select(max(wait, 0)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    open_fds.discard(key.fd)
                    continue
                bufs[key.fd].add(chunk)
            if sum(b.total for b in bufs.values()) > hard_limit:
                outcome = "output_limit"
                break
        while outcome is None and proc.poll() is None:
            # Its output is closed but it still runs: wait for it, watching the disk.
            now = time.monotonic()
            if now >= deadline:
                outcome = "timeout"
            elif disk_watch is not None and disk_watch.exceeded(now):
                outcome = "disk_limit"
            else:
                try:
                    proc.wait(min(deadline - now, disk.DISK_POLL) if disk_watch is not None else deadline - now)
                except subprocess.TimeoutExpired:
                    pass
        clean = proctree.kill_tree(KILL_GRACE if outcome == "timeout" else 0, ctx)
        # Drain what is left in the pipes now that every writer is dead.
        for fd in list(open_fds):
            try:
                while True:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    bufs[fd].add(chunk)
                    if bufs[fd].total > hard_limit * 2:
                        break
            except OSError:
                pass
        sel.close()
        code = proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        if not clean and not (state.subreaper and proctree.own_children() == set()):
            proctree.reap(proctree.command_pids(ctx))
        duration = (time.monotonic() - started) * 1000.0
        sig = None
        exit_code = code  # type: int | None
        if code < 0:
            sig = -code
            exit_code = None
        if outcome is None:
            # The OOM killer sends SIGKILL, to the command or to a child (sh then exits 137).
            killed = sig == signal.SIGKILL or (exit_code is not None and exit_code > 128)
            oom_after = cgroup.oom_kills() if killed else None
            if oom_before is not None and oom_after is not None and oom_after > oom_before:
                outcome = "oom"
            elif sig is not None:
                outcome = "signal"
            else:
                outcome = "exit"
        if outcome in ("timeout", "output_limit", "disk_limit"):
            exit_code = None
        out, t1 = out_buf.value()
        err, t2 = err_buf.value()
        return {
            "exit_code": exit_code,
            "stdout": channel.b64(out),
            "stderr": channel.b64(err),
            "outcome": outcome,
            "duration_ms": duration,
            "truncated": bool(t1 or t2),
            "signal": sig,
            "stdout_bytes": out_buf.total,
            "stderr_bytes": err_buf.total,
            "disk_used": disk_watch.used if disk_watch is not None and outcome == "disk_limit" else None,
        }


# --------------------------------------------------------------------------- spawn
#
# Long-lived processes with streamed stdio (a stdio MCP server, a language server). Their
# output travels as unsolicited events {"event": "stdout"|"exit", "proc": pid, ...}. They
# are spared by the per-command tree kill and killed when the host closes the stream.

_procs = {}  # type: dict
_procs_lock = threading.Lock()
MAX_PROCS = 16


def _pump(proc, announced):
    pid = proc.pid
    err = _Capped(64 * 1024)
    # No event before the host has the spawn's answer (and so its handler): it would be
    # dropped as being about an unknown process.
    announced.wait(30)

    def drain_err():
        while True:
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                return
            err.add(chunk)

    t = threading.Thread(target=drain_err, daemon=True)
    t.start()
    fd = proc.stdout.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        channel.send({"event": "stdout", "proc": pid, "data": channel.b64(chunk)})
    code = proc.wait()
    t.join(1.0)
    with _procs_lock:
        _procs.pop(pid, None)
    proctree.unspare(pid)
    tail, _ = err.value()
    channel.send({"event": "exit", "proc": pid, "code": code, "stderr": channel.b64(tail)})


def op_spawn(req):
    argv = req.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise Refused("invalid", "argv must be a non-empty list of strings")
    with _procs_lock:
        if len(_procs) >= MAX_PROCS:
            raise Refused("too_large", "Too many long-lived processes (max %d)" % MAX_PROCS)
    env, cwd = environ.command_env_cwd(req)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        raise Refused("not_found", "Cannot start %s: %s" % (argv[0], e.strerror or e))
    proctree.spare(proc.pid)
    with _procs_lock:
        _procs[proc.pid] = proc
    announced = threading.Event()
    threading.Thread(target=_pump, args=(proc, announced), daemon=True).start()
    return {"proc": proc.pid, "_after_send": announced.set}


def _get_proc(req):
    with _procs_lock:
        proc = _procs.get(req.get("proc"))
    if proc is None:
        raise Refused("not_found", "No such process")
    return proc


def op_stdin(req):
    proc = _get_proc(req)
    data = base64.b64decode(req.get("data") or "")
    try:
        if data:
            proc.stdin.write(data)
            proc.stdin.flush()
        if req.get("close"):
            proc.stdin.close()
    except (BrokenPipeError, ValueError):
        raise Refused("conflict", "The process no longer reads its input")
    return {"written": len(data)}


def op_kill(req):
    proc = _get_proc(req)
    proctree.kill_subtree(proc.pid, float(req.get("grace", 0.5)))
    return {"killed": True}


# --------------------------------------------------------------------------- main loop


def op_direct(req):
    """Offer the host the direct channel (see ``channel.offer_direct``)."""
    return channel.offer_direct(_serve_direct)


def _serve_direct(reader):
    """Serve the direct channel; when the host leaves it, the agent's work is over."""
    _serve(reader)
    _host_gone()
    if not state.keeper_ttl:
        os._exit(0)


FAST_OPS = {
    "hello": op_hello,
    "read": files.op_read,
    "write": write.op_write,
    "remove": tree.op_remove,
    "mkdir": tree.op_mkdir,
    "chmod": tree.op_chmod,
    "symlink": tree.op_symlink,
    "stat": files.op_stat,
    "hash": files.op_hash,
    "commit": write.op_commit,
    "abort": write.op_abort,
}
SLOW_OPS = {
    "direct": op_direct,
    "list": listing.op_list,
    "remove_tree": tree.op_remove_tree,
    "scan": scan.op_scan,
    "search": search.op_search,
    "exec": op_exec,
    "spawn": op_spawn,
    "stdin": op_stdin,
    "kill": op_kill,
}


def _handle(req):
    rid = req.get("id")
    op = req.get("op")
    fn = FAST_OPS.get(op) or SLOW_OPS.get(op)
    after = None
    try:
        if fn is None:
            raise Refused("invalid", "Unknown op %r" % (op,))
        result = fn(req)
        after = result.pop("_after_send", None) if isinstance(result, dict) else None
        resp = {"id": rid, "ok": True, "result": result}
    except Exception as e:  # never let one request kill the agent
        resp = error_answer(rid, e)
    channel.send(resp)
    if after is not None:
        after()


_work = queue.Queue()  # type: queue.Queue
_idle = [0]
_idle_lock = threading.Lock()


def _worker():
    while True:
        req = _work.get()
        _handle(req)
        with _idle_lock:
            _idle[0] += 1


def _dispatch_slow(req):
    """Slow ops run on reusable worker threads (a new thread per call costs ~0.1 ms);
    one more thread is started whenever every worker is busy, so nothing waits."""
    with _idle_lock:
        if _idle[0] > 0:
            _idle[0] -= 1
            start = False
        else:
            start = True
    if start:
        threading.Thread(target=_worker, daemon=True).start()
    _work.put(req)


def main(config):
    state.configure(config)
    channel.open_stdout(sys.stdout.buffer)
    state.subreaper = _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of commands come back to us
    _prctl(4, 0)  # PR_SET_DUMPABLE=0: commands (same uid) cannot open /proc/<agent>/fd to forge replies
    os.umask(0o022)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    stdin = sys.stdin.buffer
    keeper_ttl = state.keeper_ttl
    if keeper_ttl:
        activity.touch()
        threading.Thread(target=activity.keeper, args=(float(keeper_ttl),), daemon=True).start()
    channel.send({"id": 0, "ok": True, "result": op_hello({})})
    _serve(stdin)
    _host_gone()
    if keeper_ttl:
        # The container's main process: stay as its keeper until the idle TTL ends it.
        threading.Event().wait()


_gone_lock = threading.Lock()


def _serve(reader):
    """Read requests until EOF: fast ops inline, slow ones on worker threads."""
    while True:
        line = reader.readline()
        if not line:
            return
        activity.touch()
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("request is not an object")
        except ValueError as e:
            channel.send({"id": None, "ok": False, "code": "invalid", "error": "Malformed request: %s" % e})
            continue
        if req.get("op") in SLOW_OPS:
            _dispatch_slow(req)
        else:
            _handle(req)


def _host_gone():
    """The host went away (either channel ended): leave nothing running behind us, and no
    staged temporary."""
    with _gone_lock:
        write.drop_staged()
        tidy.drain(5.0)
        with _procs_lock:
            spawned = list(_procs)
        for pid in spawned:
            proctree.kill_subtree(pid, 0.2)
        proctree.kill_tree(0)


def run(argv=None):
    """Run the agent: the config from ``argv`` (``[root]``, when run by hand as
    ``python3 -m sandbox.agent ROOT``) or else from the first line on stdin."""
    if argv:
        cfg = {"root": argv[0]}
    else:
        cfg = json.loads(sys.stdin.buffer.readline() or b"{}")
    try:
        main(cfg)
    except KeyboardInterrupt:
        pass
