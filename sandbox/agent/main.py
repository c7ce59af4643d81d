"""The agent's main loop and, for now, all of its operations (see the package's docstring)."""

import base64
import collections
import ctypes
import fnmatch
import json
import os
import queue
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

from . import activity, channel, disk, files, listing, paths, scan, state, tidy, tree, write
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
_foreign_pids = set()  # type: set[int]  # helper processes (ripgrep) that the exec tree-kill must spare
_foreign_lock = threading.Lock()

BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "CI": "1",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "TERM": "dumb",
    "DEBIAN_FRONTEND": "noninteractive",
    "GIT_TERMINAL_PROMPT": "0",
    "PIP_NO_INPUT": "1",
    "NO_COLOR": "1",
    # no __pycache__ in the workspace: stale bytecode and changelog noise
    "PYTHONDONTWRITEBYTECODE": "1",
}


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
        "ripgrep": _rg_command() is not None,
        # Commands run with the image's own /bin/sh: an image without one cannot serve.
        "shell": os.access("/bin/sh", os.X_OK),
        "cpu_quota": _cpu_quota(),
    }


# --------------------------------------------------------------------------- search


def _match_order(m):
    return (m[0], m[1])


_cpu_seen = [0.0, None]  # type: list  # (monotonic time, container CPU seconds) at the last search


def _read_first(paths):
    for path in paths:
        try:
            with open(path) as fh:
                return fh.read()
        except OSError:
            continue
    return None


def _cpu_quota():
    """How many CPUs the container's CFS quota allows (cgroup v1 or v2), None if unlimited."""
    quota = _read_first(("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"))
    period = _read_first(("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"))
    try:
        if quota is not None and period is not None:
            q = int(quota)
            return q / float(int(period)) if q > 0 else None
        v2 = _read_first(("/sys/fs/cgroup/cpu.max",))
        if v2 is not None:
            q2, p2 = v2.split()[:2]
            return None if q2 == "max" else int(q2) / float(int(p2))
    except ValueError:
        pass
    return None


def _cpu_used():
    """CPU seconds the container has used so far (cgroup v1 or v2), or None."""
    v1 = _read_first(("/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage"))
    try:
        if v1 is not None:
            return int(v1) / 1e9
        v2 = _read_first(("/sys/fs/cgroup/cpu.stat",))
        if v2 is not None:
            for line in v2.splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
    except ValueError:
        pass
    return None


def _search_threads():
    """ripgrep's thread count: every core the container may run on (at most 4), unless
    the container has been using its CPU quota lately (the previous search a moment ago:
    searches back to back), when more threads would only run into the quota and be
    throttled; then as many as the quota allows."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    cores = max(1, min(cores, 4))
    quota = _cpu_quota()
    if quota is None or cores == 1:
        return cores
    now = time.monotonic()
    used = _cpu_used()
    last_t, last_used = _cpu_seen
    _cpu_seen[0], _cpu_seen[1] = now, used
    if used is None or last_used is None or now - last_t > 0.25:
        return cores
    rate = (used - last_used) / max(now - last_t, 1e-3)  # CPUs in use since the last search
    if rate > quota / 2.0:
        return max(1, min(cores, int(quota)))
    return cores


def _rg_command():
    """How to run ripgrep: the agent runtime's own copy (through the runtime's loader, so
    it runs in any image), else the image's ``rg`` on its PATH, else None (the search
    falls back to Python)."""
    lib = os.path.join(sys.prefix, "lib")
    loader, rg = os.path.join(lib, "loader"), os.path.join(sys.prefix, "bin", "rg")
    if os.access(loader, os.X_OK) and os.access(rg, os.X_OK):
        return [loader, "--library-path", lib, rg]
    found = shutil.which("rg", path=state.image_env.get("PATH") or BASE_ENV["PATH"])
    return [found] if found else None


def _search_rg(rg, pattern, target, glob, exclude, max_matches, ignore_case):
    argv = list(rg) + [
        "--no-config",
        "--line-number",
        "--with-filename",
        "--no-heading",
        "--null",
        "--color",
        "never",
        "--no-ignore",
        "--hidden",
        "--no-messages",
        "--max-columns",
        "500",
        "--max-columns-preview",
        # No --max-filesize: it costs ripgrep an extra stat per file, ~20% of a search of
        # many small files; a huge file is bounded by the search's timeout instead.
    ]
    # Threads: ripgrep sizes its pool by the CPU *quota* (one thread under the default
    # 1-CPU limit), but a quota caps CPU time per 100 ms period, not parallelism: a search
    # is a burst well inside one period, so it may use every core the container can run
    # on and still stay within its quota (5,000 files: ~47 ms on one thread, ~30 on two),
    # unless the quota is being used up already (see _search_threads).
    argv += ["--threads", str(_search_threads())]
    if ignore_case:
        argv.append("--ignore-case")
    if glob:
        argv += ["--glob", glob]
    # One alternation glob: ripgrep matches every path against every glob, and nine
    # separate "!name" globs cost more than the search itself on a 5,000-file tree.
    plain = sorted(ex for ex in exclude if not any(c in ex for c in ",{}[]*?\\!"))
    if plain:
        argv += ["--glob", "!{%s}" % ",".join(plain)]
    for ex in sorted(set(exclude) - set(plain)):
        argv += ["--glob", "!" + ex]
    # --regexp makes a pattern that starts with "-" a pattern, never an option; "--" ends options.
    argv += ["--regexp", pattern, "--", target]
    proc = subprocess.Popen(
        argv,
        cwd=state.ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(BASE_ENV),
        close_fds=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    with _foreign_lock:
        _foreign_pids.add(proc.pid)
    matches = []  # type: list
    truncated = False
    carry = b""  # a file name holding newlines arrives over several lines, before its NUL
    try:
        for raw in proc.stdout:
            if len(matches) >= max_matches:
                truncated = True
                break
            fname, sep, rest = raw.partition(b"\x00")
            if not sep:
                carry += raw
                continue
            fname, carry = carry + fname, b""
            lineno, _, text = rest.partition(b":")
            try:
                n = int(lineno)
            except ValueError:
                continue
            name = fname.decode("utf-8", "surrogateescape")  # exact: the host quotes odd names
            if name.startswith("./"):
                name = name[2:]
            matches.append([name, n, text.rstrip(b"\r\n").decode("utf-8", "replace")])
        if truncated:
            proc.kill()
        err = proc.stderr.read(65536).decode("utf-8", "replace")
        code = proc.wait()
    finally:
        with _foreign_lock:
            _foreign_pids.discard(proc.pid)
        proc.stdout.close()
        proc.stderr.close()
    if code == 2 and not matches and ("regex" in err.lower() or "parse error" in err.lower()):
        msg = err.strip().splitlines()
        raise Refused("invalid_pattern", "Invalid regex %r: %s" % (pattern, " ".join(m.strip() for m in msg[-4:])))
    return matches, truncated


def _search_py(pattern, dfd, prefix, glob, exclude, max_matches, ignore_case):
    try:
        rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise Refused("invalid_pattern", "Invalid regex %r: %s" % (pattern, e))
    matches = []  # type: list
    state = {"truncated": False}
    files = []
    counter = [0, False]

    def visit(e, rel, d, is_dir):
        if is_dir:
            return
        if glob and not (fnmatch.fnmatch(e.name, glob) or fnmatch.fnmatch(rel, glob)):
            return
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            return
        if stat.S_ISREG(st.st_mode) and st.st_size <= 50 << 20:
            files.append(rel)

    listing.walk(dfd, "", 1, None, exclude, visit, counter, 1 << 30)
    for rel in files:
        try:
            f = os.open(rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            continue
        with os.fdopen(f, "rb") as fh:
            head = fh.read(8192)
            if b"\x00" in head:
                continue
            fh.seek(0)
            for n, raw in enumerate(fh, 1):
                # str matching, so "." is one character, not one byte of UTF-8
                line = raw.decode("utf-8", "surrogateescape")
                if rx.search(line):
                    if len(matches) >= max_matches:
                        state["truncated"] = True
                        return matches, True
                    text = raw.rstrip(b"\r\n")[:2000].decode("utf-8", "replace")[:500]
                    matches.append([prefix + rel, n, text])
    return matches, state["truncated"]


def op_search(req):
    pattern = req.get("pattern")
    if not isinstance(pattern, str) or pattern == "":
        raise Refused("invalid_pattern", "Invalid regex: the pattern is empty")
    path = req.get("path", ".")
    glob = req.get("glob") or None
    exclude = set(req.get("exclude") or ())
    max_matches = max(1, min(int(req.get("max_matches", 200)), 10000))
    ignore_case = bool(req.get("ignore_case"))
    fd, name, parts, st = paths.resolve(path)
    try:
        if st is None:
            raise Refused("not_found", "Not found: %s" % path)
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise Refused("not_a_file", "Cannot search %s: it is %s" % (path, paths.kind_name(st.st_mode)))
    finally:
        os.close(fd)
    # Matches come back sorted by path and line. ripgrep's threads finish files in no
    # fixed order, so more than asked for is collected and the first ``max_matches`` in
    # that order are kept: the answer is the same on every run unless there are over ten
    # times as many matches as asked for (then it is some ``max_matches`` of them).
    collect = min(max_matches * 10, 20000)
    rg = _rg_command() if not req.get("force_python") else None
    if rg:
        target = "./" + paths.rel(parts) if parts else "."
        matches, truncated = _search_rg(rg, pattern, target, glob, exclude, collect, ignore_case)
        engine = "ripgrep"
    else:
        if stat.S_ISREG(st.st_mode):
            dfd, _ = paths.open_dir(paths.rel(parts[:-1]))
            prefix = paths.rel(parts[:-1]) + "/" if len(parts) > 1 else ""
            glob = parts[-1]
        else:
            dfd, _ = paths.open_dir(path)
            prefix = paths.rel(parts) + "/" if parts else ""
        try:
            matches, truncated = _search_py(pattern, dfd, prefix, glob, exclude, collect, ignore_case)
        finally:
            os.close(dfd)
        engine = "python"
    matches.sort(key=_match_order)
    if len(matches) > max_matches:
        del matches[max_matches:]
        truncated = True
    return {"matches": matches, "truncated": truncated, "engine": engine}


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


def _proc_table():
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


def _start_ticks(pid):
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


def _command_pids(ctx):
    """Every process the current command started.

    With the child-subreaper bit (runc) that is exactly this agent's process subtree:
    orphans come back to us. Where the kernel lacks it (gVisor), orphans go to PID 1, so
    we also take, among processes started after the command: those still in its session
    or process group, those carrying its LOOM_CALL marker, and orphans of PID 1 that carry
    no other call's marker (``setsid`` + ``env -i`` + double fork ends up there).
    """
    me = os.getpid()
    table = _proc_table()
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


def _reap(pids):
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass


def _signal_all(pids, sig):
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


def _own_children():
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


def _kill_tree(grace, ctx=None):
    """Kill every process the command started (TERM, ``grace`` seconds, then KILL).
    Returns True when nothing was left to kill (as subreaper: no child at all)."""
    if state.subreaper and _own_children() == set():
        return True  # fast path: as subreaper, no child means nothing of the command is left
    pids = _command_pids(ctx)
    if not pids:
        return False
    if grace > 0:
        _signal_all(pids, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end:
            _reap(pids)
            pids = _command_pids(ctx)
            if not pids:
                return False
            time.sleep(0.02)
    for _ in range(500):
        pids = _command_pids(ctx)
        if not pids:
            return False
        _signal_all(pids, signal.SIGSTOP)  # freeze first so a fork bomb cannot outrun us
        _signal_all(pids, signal.SIGKILL)
        _reap(pids)
        time.sleep(0.002)


def _oom_kills():
    for path in ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"):
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return None


def _command_env_cwd(req):
    """The environment (the image's, then the non-interactive base, then the caller's
    valid strings) and the real working directory (resolved inside the workspace) for a
    process the host asks for."""
    env = dict(state.image_env)
    env.update(BASE_ENV)
    if state.image_env.get("PATH"):
        env["PATH"] = state.image_env["PATH"]  # the image's own PATH (/usr/local/go/bin, ...)
    env["HOME"] = os.environ.get("HOME", "/tmp")
    env["USER"] = env["LOGNAME"] = os.environ.get("USER", "sandbox")
    for k, v in (req.get("env") or {}).items():
        if isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v:
            env[k] = v
    cwd_fd, parts = paths.open_dir(req.get("cwd", "."))
    os.close(cwd_fd)
    return env, state.ROOT + ("/" + "/".join(parts) if parts else "")


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
    env, cwd = _command_env_cwd(req)
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
        oom_before = _oom_kills()
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
        ctx = (proc.pid, 0 if state.subreaper else (_start_ticks(proc.pid) or 0), marker)
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
        clean = _kill_tree(KILL_GRACE if outcome == "timeout" else 0, ctx)
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
        if not clean and not (state.subreaper and _own_children() == set()):
            _reap(_command_pids(ctx))
        duration = (time.monotonic() - started) * 1000.0
        sig = None
        exit_code = code  # type: int | None
        if code < 0:
            sig = -code
            exit_code = None
        if outcome is None:
            # The OOM killer sends SIGKILL, to the command or to a child (sh then exits 137).
            killed = sig == signal.SIGKILL or (exit_code is not None and exit_code > 128)
            oom_after = _oom_kills() if killed else None
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
    with _foreign_lock:
        _foreign_pids.discard(pid)
    tail, _ = err.value()
    channel.send({"event": "exit", "proc": pid, "code": code, "stderr": channel.b64(tail)})


def op_spawn(req):
    argv = req.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise Refused("invalid", "argv must be a non-empty list of strings")
    with _procs_lock:
        if len(_procs) >= MAX_PROCS:
            raise Refused("too_large", "Too many long-lived processes (max %d)" % MAX_PROCS)
    env, cwd = _command_env_cwd(req)
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
    with _foreign_lock:
        _foreign_pids.add(proc.pid)
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


def _kill_subtree(root, grace):
    """TERM then KILL a process and everything below it."""

    def tree():
        table = _proc_table()
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
    _signal_all(pids, signal.SIGTERM)
    end = time.monotonic() + grace
    while pids and time.monotonic() < end:
        time.sleep(0.02)
        pids = [p for p in tree() if _proc_table().get(p, (0, 0, 0, 0))[0] != 0 or p == root]
        if all(_is_zombie(p) for p in pids):
            break
    for _ in range(100):
        pids = [p for p in tree() if not _is_zombie(p)]
        if not pids:
            return
        _signal_all(pids, signal.SIGKILL)
        time.sleep(0.005)


def _is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2 : data.rindex(b")") + 3] == b"Z"
    except (OSError, ValueError):
        return True


def op_kill(req):
    proc = _get_proc(req)
    _kill_subtree(proc.pid, float(req.get("grace", 0.5)))
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
    "search": op_search,
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
            _kill_subtree(pid, 0.2)
        _kill_tree(0)


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
