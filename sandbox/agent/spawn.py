"""Long-lived processes with streamed stdio (a stdio MCP server, a language server):
``spawn``, ``stdin``, ``kill``. Their output travels as unsolicited events
``{"event": "stdout"|"exit", "proc": pid, ...}``. They are spared by the per-command tree
kill and killed when the host closes the stream."""

import os
import subprocess
import threading

from . import channel, environ, output, proctree
from .errors import Refused

_procs = {}  # type: dict  # pid -> Popen
_procs_lock = threading.Lock()
MAX_PROCS = 16


def _pump(proc, announced):
    pid = proc.pid
    err = output.Capped(64 * 1024)
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
    data = channel.unb64(req.get("data") or "")
    try:
        if data:
            proc.stdin.write(data)
            proc.stdin.flush()
        if req.get("close"):
            proc.stdin.close()
    except (BrokenPipeError, ValueError):
        raise Refused("conflict", "The process no longer reads its input")
    return {"written": len(data)}


def kill_all():
    """Kill every spawned process and what it started (the host is gone)."""
    with _procs_lock:
        spawned = list(_procs)
    for pid in spawned:
        proctree.kill_subtree(pid, 0.2)


def op_kill(req):
    proc = _get_proc(req)
    proctree.kill_subtree(proc.pid, float(req.get("grace", 0.5)))
    return {"killed": True}
