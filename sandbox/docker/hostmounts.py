"""Mounts the worker makes on the engine's host for the warm pool (:mod:`.pool`): the
pool's directory made a shared mount, a workspace bound onto a pooled sandbox's slot, and
those binds undone.

Why mounts: a pooled container is started before its workspace is known. Its /workspace
is a bind of the slot's empty ``ws`` directory with ``rslave`` propagation, and the pool
directory is a shared mount of itself, so a bind the host later makes *on* ``ws``
propagates into the running container and appears at /workspace (measured under runc).
That takes ``CAP_SYS_ADMIN`` in the host's mount namespace (a worker running as root on
the engine's host, in dockerd's mount namespace); without it the pool is off and every
workspace starts cold (:func:`make_shared` says why).

Every function here is blocking (a few system calls): callers run them in a thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
from pathlib import Path

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_MOVE = 8192
MS_PRIVATE = 1 << 18
MS_SHARED = 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def _mount(source: str | None, target: str, flags: int) -> None:
    """mount(2) without a file system type or data. Raises OSError."""
    src = source.encode() if source is not None else None
    if _libc.mount(src, target.encode(), None, flags, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


def mount_propagation(path: Path | str) -> str | None:
    """The propagation of the mount on top at exactly ``path`` (``shared``, ``slave``,
    ``private``), None when ``path`` is not a mount point."""
    target = os.path.realpath(path)
    found: str | None = None
    with open("/proc/self/mountinfo") as f:
        for line in f:  # the last entry for a path is the mount on top
            fields = line.split()
            if len(fields) > 6 and _unescape(fields[4]) == target:
                optional = fields[6 : fields.index("-")]
                found = "private"
                if any(t.startswith("shared:") for t in optional):
                    found = "shared"
                elif any(t.startswith("master:") for t in optional):
                    found = "slave"
    return found


def _unescape(field: str) -> str:
    """A mountinfo path (spaces and the like written as octal escapes)."""
    return field.encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")


def is_mount_point(path: Path) -> bool:
    """Whether something is mounted exactly at ``path``."""
    return mount_propagation(path) is not None


def make_shared(root: Path) -> str | None:
    """Make ``root`` (created if missing) a shared mount of itself, so binds made below it
    propagate into the containers that mount its directories with ``rslave``. Idempotent.
    Returns None when it is, else why it cannot be (no privilege: the pool stays off)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o711)
    target = os.path.realpath(root)
    try:
        if mount_propagation(target) is None:
            _mount(target, target, MS_BIND)
        if mount_propagation(target) != "shared":
            _mount(None, target, MS_SHARED | MS_REC)
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EACCES):
            return (
                f"making {target} a shared mount needs CAP_SYS_ADMIN in the engine host's mount namespace "
                "(a worker running as root on the engine's host): the warm pool is off"
            )
        return f"making {target} a shared mount failed: {e}"
    return None


def pool_mounts(root: Path, moved_root: Path) -> str | None:
    """The warm pool's mounts (idempotent): ``root`` a shared mount (:func:`make_shared`),
    its gVisor directory ``moved_root`` made, its staging directory ``root/.stage`` a
    private mount (:func:`make_private`). None when they are in place, else why not."""
    reason = make_shared(root)
    if reason is not None:
        return reason
    try:
        moved_root.mkdir(mode=0o711, exist_ok=True)
    except OSError as e:
        return f"the pool's gVisor directory could not be made: {e}"
    try:
        make_private(root / ".stage")
    except OSError as e:
        return f"the pool's staging mount failed: {e}"
    return None


def make_private(path: Path) -> None:
    """Make ``path`` (created if missing) a private mount of itself: binds staged there
    propagate nowhere until they are moved (see :func:`bind`). Idempotent. Raises OSError."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = os.path.realpath(path)
    if mount_propagation(target) is None:
        _mount(target, target, MS_BIND)
    if mount_propagation(target) != "private":
        _mount(None, target, MS_PRIVATE)


def bind(source: Path, target: Path, *, read_only: bool = False, stage: Path | None = None) -> None:
    """Bind ``source`` onto ``target`` (not recursively: what is mounted below the source
    stays out of the sandbox, as with the engine's own binds). ``read_only`` needs
    ``stage``, a directory on a private mount (:func:`make_private`): the bind is
    made there, made read-only, then moved onto ``target``. A bind remounted read-only
    where it stands would have propagated to the sandbox read-write already (measured:
    the remount's flag does not propagate; a moved mount keeps its flags). Raises OSError."""
    if not read_only:
        _mount(str(source), str(target), MS_BIND)
        return
    if stage is None:
        raise ValueError("a read-only bind needs a private staging directory")
    # A mount point of the source's kind (a file is bound onto a file), private to this bind.
    point = stage / secrets.token_hex(8)
    if os.path.isdir(source):
        point.mkdir(mode=0o700)
    else:
        point.touch(mode=0o600)
    try:
        _mount(str(source), str(point), MS_BIND)
        try:
            _mount(None, str(point), MS_REMOUNT | MS_BIND | MS_RDONLY)
            _mount(str(point), str(target), MS_MOVE)
        except OSError:
            unbind(point)
            raise
    finally:
        with contextlib.suppress(OSError):
            point.rmdir() if point.is_dir() else point.unlink()


def unbind(target: Path) -> bool:
    """Detach whatever is mounted on ``target`` (and below it). True when something was.
    Raises OSError other than "not a mount point" / "no such file"."""
    if _libc.umount2(str(target).encode(), MNT_DETACH) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.EINVAL, errno.ENOENT):
        return False
    raise OSError(e, os.strerror(e), str(target))


def release_root(root: Path) -> bool:
    """Undo :func:`make_shared` and the pool's private staging mount (``.stage``) below
    ``root``, once no sandbox uses a slot there: left behind, a shared mount is copied into
    the mount namespace of every container started after it, and a data directory holding
    it cannot be removed (EBUSY). True when something was unmounted. Raises OSError other
    than "not a mount point"."""
    target = Path(os.path.realpath(root))
    staged = unbind(target / ".stage")
    return unbind(target) or staged
