"""``search``: a regex over the files below a path, with ripgrep (the agent runtime's
own, else the image's) or, without one, in Python. Matches come back sorted by path and
line, the same on every run."""

import os
import re
import stat
import subprocess
import sys
import time

from . import cgroup, environ, listing, paths, proctree, state
from .errors import Refused

_cpu_seen = [0.0, None]  # type: list  # (monotonic time, container CPU seconds) at the last search


def _match_order(m):
    return (m[0], m[1])


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
    quota = cgroup.cpu_quota()
    if quota is None or cores == 1:
        return cores
    now = time.monotonic()
    used = cgroup.cpu_used()
    last_t, last_used = _cpu_seen
    _cpu_seen[0], _cpu_seen[1] = now, used
    if used is None or last_used is None or now - last_t > 0.25:
        return cores
    rate = (used - last_used) / max(now - last_t, 1e-3)  # CPUs in use since the last search
    if rate > quota / 2.0:
        return max(1, min(cores, int(quota)))
    return cores


def rg_command():
    """How to run ripgrep: the agent runtime's own copy (through the runtime's loader, so
    it runs in any image), else the image's ``rg`` on its PATH, else None (the search
    falls back to Python)."""
    lib = os.path.join(sys.prefix, "lib")
    loader, rg = os.path.join(lib, "loader"), os.path.join(sys.prefix, "bin", "rg")
    if os.access(loader, os.X_OK) and os.access(rg, os.X_OK):
        return [loader, "--library-path", lib, rg]
    import shutil  # (imported here, not at the top: ~3 ms of every agent's boot)

    found = shutil.which("rg", path=state.image_env.get("PATH") or environ.BASE_ENV["PATH"])
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
        env=dict(environ.BASE_ENV),
        close_fds=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proctree.spare(proc.pid)
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
        proctree.unspare(proc.pid)
        proc.stdout.close()
        proc.stderr.close()
    if code == 2 and not matches and ("regex" in err.lower() or "parse error" in err.lower()):
        msg = err.strip().splitlines()
        raise Refused("invalid_pattern", "Invalid regex %r: %s" % (pattern, " ".join(m.strip() for m in msg[-4:])))
    return matches, truncated


def _search_py(pattern, dfd, prefix, glob, exclude, max_matches, ignore_case):
    # (imported here: the Python fallback's alone, kept out of the agent's boot)
    import fnmatch

    try:
        rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise Refused("invalid_pattern", "Invalid regex %r: %s" % (pattern, e))
    matches = []  # type: list
    outcome = {"truncated": False}
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
                        outcome["truncated"] = True
                        return matches, True
                    text = raw.rstrip(b"\r\n")[:2000].decode("utf-8", "replace")[:500]
                    matches.append([prefix + rel, n, text])
    return matches, outcome["truncated"]


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
    rg = rg_command() if not req.get("force_python") else None
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
