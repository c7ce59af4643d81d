"""``exec``: one command at a time, to its end, with its limits.

The command runs with ``/bin/sh -c`` (or an argv) in its own session, stdin from
/dev/null, the environment from ``environ``. Its output is captured per stream (head and
tail); it is stopped on timeout (TERM, a grace period, then KILL of its whole tree), on
too much output, and when it fills the workspace's disk; when it ends, whatever it left
running is killed. The changelog's scans before and after it can travel with it.

With ``"stream": true`` the output is also sent as it is read, each chunk an event
``{"event": "output", "req": <the request's id>, "stream": "stdout"|"stderr", "data":
<base64>}``, all of them before the answer (the capture for the answer is the same). While
it runs, the notification ``exec_signal {"req", "signal"}`` sends a signal to its process
group (a Ctrl-C passed on by the host's CLI)."""

import os
import selectors
import signal
import subprocess
import threading
import time

from . import activity, cgroup, channel, disk, environ, launch, output, proctree, scan, state
from .errors import Refused

#: On timeout: TERM to the command's tree, this long, then KILL.
KILL_GRACE = 0.5
#: How long the command's pipes are still read once it exited: a background child that
#: holds them open does not hold the call.
LINGER_AFTER_EXIT = 0.1
#: For this long after starting a command the agent polls for its output and exit
#: without sleeping (yielding the CPU on each round). A thread that sleeps lets its CPU go
#: idle, and under virtualization (no guest halt-polling) waking an idle vCPU is slow:
#: measured in the sandbox on this project's CI VM, `true` takes ~0.2 ms less this way
#: and 8-13 ms commands ~1 ms less. Bounded: at most this much CPU per command. Only on
#: the host's kernel (runc, where the agent is a subreaper): under gVisor each round is two
#: system calls the sentry serves, and `true` took ~0.75 ms longer with it, not less.
SPIN_WINDOW = 0.002
_sched_yield = getattr(os, "sched_yield", lambda: None)
#: The most of each stream a command's answer keeps (the host's ``MAX_EXEC_OUTPUT``).
MAX_CAPTURE = 16 << 20

_exec_lock = threading.Lock()
#: The command running now, for ``exec_signal``: (request id, Popen) or None; and
#: signals that came for a request whose command had not started yet (it is on its way
#: to a worker thread), delivered as it starts.
_running = [None]  # type: list
_early_signals = {}  # type: dict
_signal_lock = threading.Lock()


def op_exec(req):
    command = req.get("command")
    argv = req.get("argv")
    if argv is not None:
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise Refused("invalid", "argv must be a non-empty list of strings")
    elif not isinstance(command, str) or not command.strip():
        raise Refused("invalid", "Empty command")
    timeout = float(req.get("timeout", 60))
    cap = min(int(req.get("max_output", 256 * 1024)), MAX_CAPTURE)
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


def _set_oom_score_adj(pid):
    # (os.open and os.write: a text-mode open costs ~3x as much, on every command)
    try:
        fd = os.open("/proc/%d/oom_score_adj" % pid, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, b"1000")
    except OSError:
        pass
    finally:
        os.close(fd)


def _run_command(req, command, argv, timeout, cap, hard_limit, env, cwd):
    script = None
    if argv is None and len(command) > launch.ARGV_COMMAND_MAX // 4:
        if len(command.encode("utf-8", "surrogateescape")) > launch.ARGV_COMMAND_MAX:
            script = launch.script_file(command)
    try:
        return _run(req, command, argv, timeout, cap, hard_limit, env, cwd, script)
    finally:
        if script is not None:
            launch.remove_script(script)


def _run(req, command, argv, timeout, cap, hard_limit, env, cwd, script):
    marker = os.urandom(8).hex()
    env["LOOM_CALL"] = marker
    stdin_data = req.get("data") if req.get("stdin") else None
    if isinstance(stdin_data, str):
        stdin_data = channel.unb64(stdin_data)
    with _exec_lock:
        oom_before = cgroup.oom_kills()
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv or ["/bin/sh", "-c", (". %s" % script) if script else command],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            return launch.failure(e, cwd, argv)
        assert proc.stdout is not None and proc.stderr is not None
        if proc.stdin is not None:
            # The descriptor is handed to the feeding thread, which closes it.
            fd = os.dup(proc.stdin.fileno())
            proc.stdin.close()
            threading.Thread(target=launch.feed, args=(fd, stdin_data), daemon=True).start()
        # The start time is only needed where orphans are hunted by heuristics (gVisor).
        ctx = (proc.pid, 0 if state.subreaper else (proctree.start_ticks(proc.pid) or 0), marker)
        # The OOM killer must pick the command, never the agent.
        _set_oom_score_adj(proc.pid)
        out_buf, err_buf = output.Capped(cap), output.Capped(cap)
        bufs = {proc.stdout.fileno(): out_buf, proc.stderr.fileno(): err_buf}
        rid = req.get("id")
        # fd -> the stream's name, when the host asked for the output as it comes
        streamed = {}  # type: dict
        if req.get("stream"):
            streamed = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
        with _signal_lock:
            _running[0] = (rid, proc)
            early = _early_signals.pop(rid, None) if rid is not None else None
        if early is not None:
            _killpg(proc.pid, early)
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
            if state.subreaper and now - started < SPIN_WINDOW:
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
                if streamed:
                    _emit(rid, streamed[key.fd], chunk)
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
                    if streamed:
                        _emit(rid, streamed[fd], chunk)
                    if bufs[fd].total > hard_limit * 2:
                        break
            except OSError:
                pass
        sel.close()
        with _signal_lock:
            _running[0] = None
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
        # The streams raw after the answer's line when the host takes them so (no base64,
        # no JSON escaping: a command's 10 MiB cost a copy, not tens of milliseconds).
        if req.get("raw_out"):
            streams = {"stdout_len": len(out), "_raw": out + err}
        else:
            streams = {"stdout": channel.b64(out), "stderr": channel.b64(err)}
        return {
            "exit_code": exit_code,
            **streams,
            "outcome": outcome,
            "duration_ms": duration,
            "truncated": bool(t1 or t2),
            "signal": sig,
            "stdout_bytes": out_buf.total,
            "stderr_bytes": err_buf.total,
            "disk_used": disk_watch.used if disk_watch is not None and outcome == "disk_limit" else None,
        }


def _emit(rid, stream, chunk):
    channel.send({"event": "output", "req": rid, "stream": stream, "data": channel.b64(chunk)})


def op_exec_signal(req):
    """A notification: send ``signal`` (SIGINT, SIGTERM or SIGKILL) to the process group
    of the command that request ``req`` runs, if it still runs. Whatever it leaves behind
    is killed when it ends, as always."""
    sig = req.get("signal")
    rid = req.get("req")
    if sig not in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        raise Refused("invalid", "signal must be 2, 15 or 9")
    with _signal_lock:
        running = _running[0]
        if running is None or running[0] != rid:
            # Not started yet (or over): kept for the request, a few at most.
            if isinstance(rid, int) and not isinstance(rid, bool):
                while len(_early_signals) >= 8:
                    _early_signals.pop(next(iter(_early_signals)))
                if _early_signals.get(rid) != signal.SIGKILL:
                    _early_signals[rid] = sig
            return {"sent": False}
    return {"sent": _killpg(running[1].pid, sig)}


def _killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except OSError:
        return False
    return True
