"""The agent's entry point and main loop.

:func:`run` takes the config line, :func:`main` sets the process up (subreaper, not
dumpable, the idle keeper) and says hello, then requests are read until the host goes:
fast operations inline on the reading thread, slow ones (anything that walks a tree or
waits for a process) on the thread that read them while another takes over reading
(:class:`_Reading`). When the host is gone, whatever the
agent started is killed and no staged temporary is left behind.
"""

import _thread
import ctypes
import os
import signal
import sys
import threading

from . import (
    activity,
    cgroup,
    channel,
    command,
    files,
    fsops,
    fswatch,
    handover,
    jsonline,
    listing,
    modeguard,
    processes,
    proctree,
    relay,
    scan,
    search,
    spawn,
    state,
    sysfiles,
    tidy,
    tree,
    tunnel,
    write,
)
from .errors import Refused, error_answer

AGENT_VERSION = "1"
_gone_lock = threading.Lock()


def _prctl(option, arg):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) == 0
    except Exception:
        return False


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
        # The engine's profile, as it was before the agent added its own filter.
        "seccomp": state.engine_seccomp if state.engine_seccomp is not None else _seccomp_mode(),
        "modeguard": state.modeguard,
    }


def _own_dirs(dirs):
    """Give the sandbox's own directories (/tmp, $HOME: tmpfs mounts owned by this uid) the
    modes they must have, 1777 and 0700, where the runtime left the image's instead (runc
    before 1.2 chmods a tmpfs mountpoint to the mode of the directory it covers, over the
    mount's mode=). Only what this uid owns is touched, never through a link; best effort:
    a command sees an error of its own if a directory stays unusable."""
    if not isinstance(dirs, dict):
        return
    for path, mode in dirs.items():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, TypeError, ValueError):
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and isinstance(mode, int) and (st.st_mode & 0o7777) != mode:
                os.fchmod(fd, mode)
        except OSError:
            pass
        finally:
            os.close(fd)


def _seccomp_mode():
    """This process's seccomp mode as the kernel reports it (2: a filter is in effect, 0:
    none), None where /proc does not say: the host checks that the profile took effect."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Seccomp:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def op_direct(req):
    """Offer the host the direct channel (see ``channel.offer_direct``), or, with
    ``dial``, connect to the host's socket at that path (``channel.dial_direct``)."""
    if req.get("dial") is not None:
        return channel.dial_direct(req.get("dial"), _serve_direct)
    return channel.offer_direct(_serve_direct)


def _serve_direct(reader):
    """Serve the direct channel; when the host leaves it, the agent's work is over."""
    _serve(reader)
    _host_gone()
    if not state.keeper_ttl:
        os._exit(0)


_keeper_started = []  # type: list
_keeper_lock = threading.Lock()


def _start_keeper(ttl):
    """Keep the container for ``ttl`` idle seconds from now on, also after the host goes
    (once: a later call changes nothing)."""
    with _keeper_lock:
        if _keeper_started:
            return
        _keeper_started.append(ttl)
    state.keeper_ttl = ttl
    activity.touch()
    threading.Thread(target=activity.keeper, args=(ttl,), daemon=True).start()


def op_keeper(req):
    """Become the container's keeper now: a warm sandbox's main agent, booted in the pool
    without one (so it ends with the worker that pooled it), at its claim
    (``sandbox.docker.pool``). ``ttl``: the idle TTL in seconds. ``root`` (runc's claim):
    the claimed workspace's ``[st_dev, st_ino]``, now bound over /workspace; the agent's
    root is opened again and must be that directory (refused otherwise, before it keeps
    anything)."""
    ttl = req.get("ttl")
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < float("inf"):
        raise Refused("invalid", "ttl must be a positive number of seconds")
    root = req.get("root")
    if root is not None:
        if not isinstance(root, list) or len(root) != 2 or any(type(x) is not int for x in root):
            raise Refused("invalid", "root must be [st_dev, st_ino]")
        if not state.reopen_root(root):
            raise Refused("conflict", "the directory at %s is not the claimed workspace" % state.ROOT)
    _start_keeper(float(ttl))
    return {"keeper_ttl": state.keeper_ttl}


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
    # (in order on the reading thread, as a staged write's pieces must be)
    "append": write.op_append,
    "fs_write": sysfiles.op_fs_write,
    "fs_append": sysfiles.op_fs_append,
    "fs_stat": fsops.op_fs_stat,
    "fs_mkdir": fsops.op_fs_mkdir,
    "keeper": op_keeper,
}
SLOW_OPS = {
    "direct": op_direct,
    "list": listing.op_list,
    "remove_tree": tree.op_remove_tree,
    "scan": scan.op_scan,
    "search": search.op_search,
    "fs_read": sysfiles.op_fs_read,
    "fs_list": fsops.op_fs_list,
    "fs_move": fsops.op_fs_move,
    "fs_remove": fsops.op_fs_remove,
    "watch_start": fswatch.op_watch_start,  # (a recursive watch walks its tree)
    "exec": command.op_exec,
    "spawn": spawn.op_spawn,
    "stdin": spawn.op_stdin,
    "kill": spawn.op_kill,
    "proc_start": processes.op_proc_start,
    "proc_output": processes.op_proc_output,
    "proc_input": processes.op_proc_input,
    "proc_kill": processes.op_proc_kill,
    "proc_list": processes.op_proc_list,
    "proc_release": processes.op_proc_release,
    "proc_signal": processes.op_proc_signal,
    "proc_resize": processes.op_proc_resize,
    "tunnel_open": tunnel.op_tunnel_open,
    "tunnel_fds": handover.op_tunnel_fds,
}
#: Notifications: requests without an id, never answered (a failure is dropped; what they
#: act on reports through its own events). They are cheap and run on the reading thread,
#: in order.
NOTIFY_OPS = {
    "tunnel_send": tunnel.op_tunnel_send,
    "tunnel_ack": tunnel.op_tunnel_ack,
    "tunnel_close": tunnel.op_tunnel_close,
    "exec_signal": command.op_exec_signal,
    "watch_stop": fswatch.op_watch_stop,
}


def _handle(req):
    rid = req.get("id")
    op = req.get("op")
    fn = FAST_OPS.get(op) or SLOW_OPS.get(op)
    after = None
    raw = None
    try:
        if fn is None:
            raise Refused("invalid", "Unknown op %r" % (op,))
        result = fn(req)
        if isinstance(result, dict):
            after = result.pop("_after_send", None)
            raw = result.pop("_raw", None)  # bytes sent as they are, after the answer's line
        resp = {"id": rid, "ok": True, "result": result}
    except Exception as e:  # never let one request kill the agent
        resp = error_answer(rid, e)
    if raw is not None:
        channel.send_raw(resp, raw)
    else:
        channel.send(resp)
    if after is not None:
        after()


class _Reading:
    """One channel's reading role, passed between threads (leader/follower): the thread
    that holds ``lock`` reads and runs fast requests inline; on a slow one it hands the
    role to a waiting thread (starting one when none waits) and runs the request itself.
    The request so starts on the thread that read it, with no wake-up of another thread
    in its path (~0.07 ms of an ``exec`` under runc, more under gVisor, where a futex
    wake goes through the sentry); the thread woken takes over reading meanwhile."""

    def __init__(self, reader):
        self.reader = reader
        self.lock = threading.Lock()
        self.ended = threading.Event()
        self.waiting = 0  # threads blocked on ``lock``, or about to be
        self.count = threading.Lock()  # guards ``waiting``


def _serve(reader):
    """Serve one channel until it ends (EOF, or a read error): fast ops inline on the
    reading thread, slow ones on the thread that read them while another reads on.
    Returns on the calling thread once the channel has ended, whichever thread saw it
    (a slow request may still be running then: the caller's cleanup stops it)."""
    rd = _Reading(reader)
    if not _start_follower(rd):
        with rd.count:
            rd.waiting += 1
        _follow(rd)  # (no thread to be had: this one serves, and returns at the end)
    rd.ended.wait()


def _start_follower(rd):
    """One more thread for ``rd``'s pool; False when none can be started (the sandbox's
    process limit, reached by a command's processes)."""
    with rd.count:
        rd.waiting += 1
    try:
        # (not threading.Thread.start, which waits until the thread runs: that wait is
        # the very wake-up this design keeps out of a request's path)
        _thread.start_new_thread(_follow, (rd,))
    except RuntimeError:
        with rd.count:
            rd.waiting -= 1
        return False
    return True


def _follow(rd):
    """A thread of one channel's pool: wait for the reading role, read until a slow
    request, hand the role on, run the request; again, until the channel ends. With no
    thread to hand the role to (none waits, none can be started), the slow request runs
    here, holding the role: requests then take turns instead of the agent failing."""
    while True:
        rd.lock.acquire()
        with rd.count:
            rd.waiting -= 1
        try:
            while True:
                req = None if rd.ended.is_set() else _read_until_slow(rd)
                if req is None:
                    rd.ended.set()  # (every thread waiting for the role then leaves too)
                    return
                with rd.count:
                    idle = rd.waiting > 0
                if idle or _start_follower(rd):
                    break
                _handle(req)
        except BaseException:
            rd.ended.set()  # nobody could read on after this: the channel is over
            raise
        finally:
            rd.lock.release()
        _handle(req)
        with rd.count:
            rd.waiting += 1


def _read_until_slow(rd):
    """Read requests, running notifications and fast ones inline, until a slow one
    (returned) or the end of the channel (None)."""
    reader = rd.reader
    while True:
        try:
            line = reader.readline()
        except (OSError, ValueError):
            return None  # the channel broke or was closed under us: it has ended
        if not line:
            return None
        activity.touch()
        try:
            req = jsonline.loads(line)
            if not isinstance(req, dict):
                raise ValueError("request is not an object")
            if not channel.read_raw(reader, req):
                return None
        except ValueError as e:
            channel.send({"id": None, "ok": False, "code": "invalid", "error": "Malformed request: %s" % e})
            continue
        op = req.get("op")
        if op in NOTIFY_OPS and "id" not in req:
            try:
                NOTIFY_OPS[op](req)
            except Exception:
                pass
        elif op in SLOW_OPS:
            return req
        else:
            _handle(req)


def become(run_as):
    """Drop from root to the workspace owner (``[uid, gid]``), first thing, in a sandbox
    whose container starts as root (``allow_root``): no supplementary groups, then the
    group, then the user; the kernel clears every capability of a process that leaves
    uid 0 this way. Raises OSError (the agent then never serves)."""
    uid, gid = int(run_as[0]), int(run_as[1])
    # gVisor (20240729) refuses every later thread (EAGAIN) to a container's first process
    # that leaves root before it ever had a second thread; one started first avoids it.
    t = threading.Thread(target=int)
    t.start()
    t.join()
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def main(config):
    if config.get("run_as") and os.getuid() == 0:
        become(config["run_as"])
    state.configure(config)
    channel.open_stdout(sys.stdout.buffer)
    state.subreaper = _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of commands come back to us
    _prctl(4, 0)  # PR_SET_DUMPABLE=0: commands (same uid) cannot open /proc/<agent>/fd to forge replies
    _own_dirs(config.get("own_dirs"))
    state.engine_seccomp = _seccomp_mode()
    state.modeguard = modeguard.install() or "on"  # no setuid/setgid bits, no devices
    os.umask(0o022)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # Commands start with SIGINT and SIGQUIT at their defaults, whoever started us: a
    # disposition of "ignored" is inherited through exec, and a shell cannot trap a signal
    # ignored on entry (POSIX), so a Ctrl-C would never reach it. (An agent started from a
    # background job of a shell without job control gets both ignored.)
    for sig in (signal.SIGINT, signal.SIGQUIT):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
    stdin = sys.stdin.buffer
    if state.keeper_ttl:
        _start_keeper(float(state.keeper_ttl))
        egress = config.get("egress")
        if isinstance(egress, dict) and egress.get("socket"):
            # One relay per container: the keeper lives as long as the container does.
            relay.start(egress)
    channel.send({"id": 0, "ok": True, "result": op_hello({})})
    _serve(stdin)
    _host_gone()
    if state.keeper_ttl:
        # The container's main process: stay as its keeper until the idle TTL ends it.
        threading.Event().wait()


def _host_gone():
    """The host went away (either channel ended): leave nothing running behind us, and no
    staged temporary."""
    with _gone_lock:
        write.drop_staged()
        sysfiles.drop_all()
        fswatch.stop_all()
        tidy.drain(5.0)
        tunnel.close_all()
        spawn.kill_all()
        proctree.kill_tree(0)


def run(argv=None):
    """Run the agent: the config from ``argv`` (``[root]``, when run by hand as
    ``python3 -m sandbox.agent ROOT``) or else from the first line on stdin."""
    if argv:
        cfg = {"root": argv[0]}
    else:
        cfg = jsonline.loads(sys.stdin.buffer.readline() or b"{}")
    try:
        main(cfg)
    except KeyboardInterrupt:
        pass
