"""Starting a command: what ``command`` needs around ``Popen``.

A command too long for one argument goes to the shell in a private file
(:func:`script_file`); one that cannot start is answered as the shell would answer it
(:func:`failure`); its standard input, when the host sends one, is fed by a thread of its
own (:func:`feed`)."""

import errno
import os
import signal

from . import channel

#: A command longer than this (UTF-8 bytes) does not go through ``sh -c``'s argument (one
#: argument holds at most 128 KiB, MAX_ARG_STRLEN: beyond, runc says "Argument list too
#: long" and gVisor "File name too long"): it is written to a private file the shell
#: reads with ``.`` (``sh -c ". FILE"``), to the same effect, ``$0`` included.
ARGV_COMMAND_MAX = 64 << 10


def script_file(command):
    """``command`` in a new private file (mode 0600 in a 0700 directory of /tmp), or None
    when /tmp cannot take it (the command then goes to ``sh -c`` as ever)."""
    try:
        d = channel.private_dir(".loom-cmd-")
    except OSError:
        return None
    path = os.path.join(d, "command")
    try:
        with open(path, "wb") as f:
            f.write(command.encode("utf-8", "surrogateescape"))
    except OSError:
        remove_script(path)
        return None
    return path


def remove_script(path):
    for fn, arg in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
        try:
            fn(arg)
        except OSError:
            pass


def failure(e, cwd, argv):
    """A command that could not start, reported as the shell reports it: 127 for a
    program not found, 126 for one that cannot run (or a working directory that cannot
    be entered); ``launch_error`` tells the host it never ran."""
    program = argv[0] if argv else "/bin/sh"
    if getattr(e, "filename", None) == cwd:  # (subprocess names the directory it could not enter)
        kind, code, what = "cwd", 126, cwd
    elif e.errno == errno.ENOENT:
        kind, code, what = "not_found", 127, program
    elif e.errno in (errno.EACCES, errno.EPERM):
        kind, code, what = "permission", 126, program
    else:
        kind, code, what = "exec", 126, program
    text = "%s: %s\n" % (what, e.strerror or e)
    if e.errno == errno.EAGAIN:
        # (no process could start: the sandbox's pids limit, taken by its own processes)
        text = "%s: %s: the sandbox's process limit is reached; end some of its processes\n" % (what, e.strerror)
    return {
        "exit_code": code,
        "stdout": "",
        "stderr": channel.b64(text.encode("utf-8", "replace")),
        "outcome": "exit",
        "duration_ms": 0.0,
        "truncated": False,
        "signal": None,
        "stdout_bytes": 0,
        "stderr_bytes": 0,
        "launch_error": kind,
    }


def feed(fd, data):
    """Write ``data`` to the command's stdin and close it, on a thread of its own (the
    command may read it slowly, or never). SIGPIPE, whose default the agent keeps so its
    commands inherit it, is blocked on this thread alone: a command that stops reading
    makes the write fail with EPIPE, and the thread ends, taking the pending signal
    with it."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[: 1 << 20]) :]
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
