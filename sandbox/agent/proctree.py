"""Finding and killing what a command started.

With the child-subreaper bit (runc) every orphan of a command is re-parented to the agent,
so the command's processes are exactly the agent's subtree; without it (gVisor) they are
also hunted by session, process group, a per-call environment marker and new orphans of
PID 1 (see :func:`command_pids`). Helper processes the agent runs itself (ripgrep, the
long-lived ``spawn`` processes) are registered with :func:`spare` so no tree-kill takes them."""

import os
import signal
import threading
import time

from . import state

_foreign_pids = set()  # type: set[int]  # the agent's own helpers, see spare()
_foreign_lock = threading.Lock()


def spare(pid):
    """Keep process ``pid`` (one the agent runs itself: ripgrep, a spawned process) out of
    every command's tree-kill, until :func:`unspare`."""
    with _foreign_lock:
        _foreign_pids.add(pid)


def unspare(pid):
    with _foreign_lock:
        _foreign_pids.discard(pid)


def proc_table():
    """{pid: (ppid, session, pgrp, starttime)} for every visible process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        try:
            rest = data[data.rindex(b")") + 2 :].split()
            table[int(name)] = (int(rest[1]), int(rest[3]), int(rest[2]), int(rest[19]))
        except (ValueError, IndexError):
            continue
    return table


def start_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _call_marker(pid):
    """The LOOM_CALL value in a process's environment, '' if none, None if unreadable."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            env = fh.read()
    except OSError:
        return None
    for item in env.split(b"\x00"):
        if item.startswith(b"LOOM_CALL="):
            return item[10:].decode("ascii", "replace")
    return ""


def command_pids(ctx):
    """Every process the current command started.

    With the child-subreaper bit (runc) that is exactly this agent's process subtree:
    orphans come back to us. Where the kernel lacks it (gVisor), orphans go to PID 1, so
    we also take, among processes started after the command: those still in its session
    or process group, those carrying its LOOM_CALL marker, and orphans of PID 1 that carry
    no other call's marker (``setsid`` + ``env -i`` + double fork ends up there).
    """
    me = os.getpid()
    table = proc_table()
    children = {}  # type: dict
    for pid, info in table.items():
        children.setdefault(info[0], []).append(pid)
    with _foreign_lock:
        spare = set(_foreign_pids)
    spare.add(me)
    spare.add(1)
    found = set()
    todo = [c for c in children.get(me, []) if c not in spare]
    if ctx is not None and not state.subreaper:
        sid, start, marker = ctx
        for pid, (ppid, session, pgrp, ticks) in table.items():
            if pid in spare or ppid == 0 or ticks < start:
                continue
            if session == sid or pgrp == sid:
                todo.append(pid)
                continue
            mark = _call_marker(pid)
            if mark == marker or (ppid == 1 and mark in ("", None)):
                todo.append(pid)
    while todo:
        pid = todo.pop()
        if pid in found or pid in spare:
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return sorted(found)


def reap(pids):
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _no_children():
    """True when this agent has no child process at all (any thread's, zombies included):
    one ``waitid`` instead of reading every thread's children file."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    except (AttributeError, OSError):
        pass
    return False


def own_children():
    """Direct children of this agent (all threads), or None when the kernel cannot say."""
    if _no_children():
        return set()
    kids = set()  # type: set[int]
    try:
        for tid in os.listdir("/proc/self/task"):
            with open("/proc/self/task/%s/children" % tid) as fh:
                kids.update(int(p) for p in fh.read().split())
    except (OSError, ValueError):
        return None
    with _foreign_lock:
        return kids - _foreign_pids


def kill_tree(grace, ctx=None):
    """Kill every process the command started (TERM, ``grace`` seconds, then KILL).
    Returns True when nothing was left to kill (as subreaper: no child at all), so there
    is nothing to reap either: no process of the command was there to start another."""
    if state.subreaper and own_children() == set():
        return True  # fast path: as subreaper, no child means nothing of the command is left
    pids = command_pids(ctx)
    if not pids:
        return True  # (under gVisor a look at every process costs ~0.1 ms a process: once)
    if grace > 0:
        signal_all(pids, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end:
            reap(pids)
            pids = command_pids(ctx)
            if not pids:
                return False
            time.sleep(0.02)
    for _ in range(500):
        pids = command_pids(ctx)
        if not pids:
            return False
        signal_all(pids, signal.SIGSTOP)  # freeze first so a fork bomb cannot outrun us
        signal_all(pids, signal.SIGKILL)
        reap(pids)
        time.sleep(0.002)


def kill_subtree(root, grace):
    """TERM then KILL a process and everything below it."""

    def tree():
        table = proc_table()
        kids = {}  # type: dict
        for pid, info in table.items():
            kids.setdefault(info[0], []).append(pid)
        out, todo = [], [root] if root in table else []
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(kids.get(pid, []))
        return out

    pids = tree()
    signal_all(pids, signal.SIGTERM)
    end = time.monotonic() + grace
    while pids and time.monotonic() < end:
        time.sleep(0.02)
        pids = [p for p in tree() if proc_table().get(p, (0, 0, 0, 0))[0] != 0 or p == root]
        if all(_is_zombie(p) for p in pids):
            break
    for _ in range(100):
        pids = [p for p in tree() if not _is_zombie(p)]
        if not pids:
            return
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.005)


def _is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2 : data.rindex(b")") + 3] == b"Z"
    except (OSError, ValueError):
        return True
