"""The agent's configuration and the process-wide facts every module reads.

:func:`configure` sets them once from the host's config line, before the first request;
the unit tests set them to root an agent at a temporary directory. Every module reads
them as attributes of this module at call time (``state.ROOT_FD``), never as copies made
at import (``from .state import ROOT_FD`` would keep the value from before ``configure``).

State that belongs to one concern (staged writes, scan snapshots, spawned processes,
where answers go) lives in that concern's module and is changed only there.
"""

import os

#: The workspace as the agent sees it, and an O_PATH descriptor of it: every path is
#: resolved from that descriptor (see ``paths``).
ROOT = "/workspace"
ROOT_FD = -1
#: Touched on requests; its mtime is the container's idle clock (see ``activity``).
ACTIVITY_FILE = "/tmp/.loom-activity"
#: The private directory of the background processes' supervisors (see ``processes``).
PROCS_DIR = "/tmp/.loom-procs"
MAX_READ = 16 << 20
#: The most content one request carries, and the most one file written in pieces
#: (``append``) may hold.
MAX_WRITE = 64 << 20
MAX_FILE = 4 << 30
#: Disk a single command may consume on the workspace's filesystem, and the free space no
#: command or write may push it below (bytes; None/0: no check). See ``disk.DiskWatch``.
DISK_LIMIT = None  # type: int | None
DISK_RESERVE = 0
#: Files (inodes) a single command may create on the workspace's filesystem.
INODE_LIMIT = None  # type: int | None
#: This connection's secret: every message the agent sends carries it (see ``channel``).
nonce = None  # type: str | None
#: Whether the kernel made the agent the child subreaper of what it starts: runc yes,
#: gVisor no (then orphans are hunted by heuristics, and scans do not use inotify).
subreaper = False
#: The seccomp mode the engine gave the agent (before its own filter), and whether that
#: filter (modeguard) is on: "on" or why not.
engine_seccomp = None  # type: int | None
modeguard = None  # type: str | None
#: An agent started as another user than the workspace owner's (``exec`` with ``user``):
#: its commands get that user's HOME and name.
as_user = False
#: The container's main agent stays on as its keeper, for this idle TTL (seconds; None:
#: not the keeper, the agent exits when the host goes).
keeper_ttl = None  # type: float | None
#: The container's environment as the agent found it at start: the image's ENV (its
#: PATH, its tool settings) plus what the worker set (HOME, USER, LANG, per-workspace
#: variables). Commands start from it, so an image behaves as its author meant.
image_env = {}  # type: dict
#: Directories that come before the image's PATH for every command (the agents store's
#: ``bin`` directories of the agent CLIs the workspace asks for).
path_prepend = []  # type: list
#: Bumped by every :func:`configure`: what is derived from the config (a command's base
#: environment) is kept until it changes.
generation = 0


def configure(config):
    """Take the host's config line (a dict). Raises OSError when the workspace root
    cannot be opened, ValueError for a limit that is not a number."""
    global ROOT, ROOT_FD, ACTIVITY_FILE, PROCS_DIR, MAX_READ, MAX_WRITE, MAX_FILE, DISK_LIMIT, DISK_RESERVE, INODE_LIMIT
    global nonce, keeper_ttl, as_user, generation
    generation += 1
    ROOT = config.get("root", ROOT).rstrip("/") or "/"
    nonce = config.get("nonce")
    image_env.update(os.environ)
    path_prepend[:] = [p for p in (config.get("path_prepend") or []) if isinstance(p, str) and ":" not in p]
    ACTIVITY_FILE = config.get("activity_file", ACTIVITY_FILE)
    PROCS_DIR = config.get("procs_dir", PROCS_DIR)
    MAX_READ = int(config.get("max_read", MAX_READ))
    MAX_WRITE = int(config.get("max_write", MAX_WRITE))
    MAX_FILE = int(config.get("max_file", MAX_FILE))
    DISK_LIMIT = int(config.get("disk_limit") or 0) or None
    INODE_LIMIT = int(config.get("inode_limit") or 0) or None
    DISK_RESERVE = int(config.get("disk_reserve") or 0)
    ROOT_FD = os.open(ROOT, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    keeper_ttl = config.get("keeper_ttl")
    as_user = bool(config.get("as_user"))


def reopen_root(identity):
    """Open the root again, which must now be the directory ``identity`` names (``[st_dev,
    st_ino]`` as the host sees it): a warm runc sandbox's agent is configured in the pool,
    when /workspace is still the slot's empty directory, and its claim binds the workspace
    over it (``sandbox.docker.pool``); the descriptor opened at configure is the slot's.
    Returns False (the old descriptor kept) when the directory at the root is another one.
    Raises OSError when it cannot be opened. (Swapped without a lock: the claim's request
    comes before any other, so nothing resolves a path meanwhile.)"""
    global ROOT_FD
    fd = os.open(ROOT, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    st = os.fstat(fd)
    if [st.st_dev, st.st_ino] != list(identity):
        os.close(fd)
        return False
    old, ROOT_FD = ROOT_FD, fd
    if old >= 0:
        os.close(old)
    return True
