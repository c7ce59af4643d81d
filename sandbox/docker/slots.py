"""A pooled sandbox's slot on the host: the directory its /workspace is a bind of, and the
record of which workspace it was claimed for.

A pooled container is created before its workspace is known, and a container's labels
cannot change after creation: so its ``dev.loom.workspace`` label is empty, and its
``dev.loom.pool-slot`` label names its slot ``<pool>/<id>/``. At claim the worker writes
the workspace's path to ``<slot>/workspace`` (root's, outside what the container mounts)
and binds the workspace onto ``<slot>/ws``. Every process that meets the container (the
backend reusing it, ``gc``, the agent channel) asks :func:`workspace_of`, which believes
the record only while the bind is really that workspace (same device and inode), so a
stale record never lets a container serve the wrong directory.

Under gVisor a later mount is never seen: the gofer opens each bind's source when the
sandbox starts and serves that open directory (measured: a bind made on the slot leaves
the sandbox showing the empty slot). What it serves is the directory itself, wherever it
moves. So a gVisor sandbox's slot directory is made outside the shared pool directory
(the pool's ``moved_root``), and its claim *moves* it into place: an atomic rename
over the workspace's directory, which must be empty (a new workspace: HTTP's ``POST
/workspaces``, a fresh project) and on the same mount as the pool. Any other workspace
(files in it, another filesystem, a mount point) starts cold, and the warm sandbox stays
in the pool for the next one (counted as declined). The claim record then names the
directory by device and inode (:func:`workspace_of`); the agent's root is that
directory already (:func:`move_into_place`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from pathlib import Path
from typing import Any

from ..identity import workspace_key
from ..logs import get_logger
from ..spec import CHANNEL_MOUNT, LABEL_PREFIX
from . import hostmounts
from .config import LABEL_WS

log = get_logger("sandbox.docker")

LABEL_SLOT = f"{LABEL_PREFIX}.pool-slot"  # its slot directory on the host
#: A pooled container's name before its claim renames it to the workspace's.
POOL_PREFIX = "loom-pool-"
CLAIM_FILE = "workspace"
SLOT_MARK = ".loom-pool-slot"
#: Locked by the worker whose pool made the slot, for as long as it lives (:func:`hold`).
OWNER_LOCK = ".owner"
_SLOT_NAME = re.compile(r"[0-9a-f]{16}")


def slot_of(labels: dict[str, str] | None) -> Path | None:
    """The slot directory a container's labels name, when it looks like one of ours (its
    name, and the mark the pool leaves in it): a label is not trusted with a path."""
    raw = (labels or {}).get(LABEL_SLOT)
    if not raw or not raw.startswith("/"):
        return None
    slot = Path(raw)
    if not _SLOT_NAME.fullmatch(slot.name) or not (slot / SLOT_MARK).is_file():
        return None
    return slot


def workspace_of(labels: dict[str, str] | None) -> str | None:
    """The workspace a container serves: its label, or for a claimed pooled container its
    claim record while the bind is in place. None when it serves none (unclaimed)."""
    labels = labels or {}
    if labels.get(LABEL_WS):
        return labels[LABEL_WS]
    slot = slot_of(labels)
    if slot is None:
        return None
    try:
        ws, _, moved = (slot / CLAIM_FILE).read_text().partition("\n")
        real = os.stat(ws)
        if moved.strip():  # a gVisor slot moved into place (move_into_place)
            dev, ino = (int(n) for n in moved.strip().split(":"))
            return ws if (real.st_dev, real.st_ino) == (dev, ino) else None
        bound = os.stat(slot / "ws")
    except (OSError, ValueError):
        return None
    if (bound.st_dev, bound.st_ino) != (real.st_dev, real.st_ino):
        return None  # not (or no longer) that workspace's bind
    return ws


def make(slot: Path, uid: int, gid: int) -> int:
    """A new slot's directories: ``ws`` owned as the workspace will be (the agent checks
    its root before the claim binds over it) and the pool's mark; held by this process
    (the descriptor returned: :func:`hold`). Raises OSError."""
    slot.mkdir(mode=0o700)
    (slot / "ws").mkdir(mode=0o755)
    os.chown(slot / "ws", uid, gid)
    (slot / SLOT_MARK).write_text("")
    return hold(slot)


def hold(slot: Path) -> int:
    """Lock ``slot`` as this process's pooled sandbox until the returned descriptor is
    closed (this process's end closes it): :func:`orphaned` tells another process the
    slot's worker is gone, where the sandbox itself cannot tell (a frozen one:
    :mod:`.freezer`). Raises OSError."""
    fd = os.open(slot / OWNER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def orphaned(slot: Path) -> bool:
    """Whether ``slot``'s pooled sandbox outlived the worker whose pool made it (nobody
    holds its lock: :func:`hold`). False when that cannot be told (no lock file: a pool
    of an earlier version, whose sandboxes end with their worker on their own)."""
    try:
        fd = os.open(slot / OWNER_LOCK, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: its worker lives
    finally:
        os.close(fd)
    return True


class Declined(Exception):
    """The workspace cannot take a gVisor slot (:func:`move_into_place`): it starts cold."""


def is_empty_dir(ws: Path) -> bool:
    """Whether ``ws`` is a directory with nothing in it (blocking)."""
    try:
        with os.scandir(ws) as it:
            return next(it, None) is None
    except OSError:
        return False


def move_into_place(slot: Path, ws: Path) -> None:
    """Claim a gVisor sandbox's slot for workspace ``ws`` (real path): its ``ws``
    directory, the one the sandbox's gofer serves, takes ``ws``'s owner and mode and is
    renamed over it, atomically; the claim record names it by device and inode, written
    first (a crash before the rename leaves a record that matches nothing).

    Two processes claiming one new workspace at once: each would find it empty, and the
    second's rename would put its own directory in the place of the first's, whose
    sandbox would then serve a directory no longer in the workspace. So claims in one
    pool directory take turns (an flock of ``<dir>/.claims``), and a workspace that
    already is another slot's directory (its record names its inode) is declined.

    Raises Declined when ``ws`` cannot be replaced (not an empty directory, another
    mount or filesystem, a mount point, another slot's already; the slot is then as it
    was), OSError otherwise. Blocking: call it in a thread."""
    fd = os.open(slot.parent / ".claims", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _move_into_place(slot, ws)
    finally:
        os.close(fd)  # (the lock goes with it)


def _move_into_place(slot: Path, ws: Path) -> None:
    target = slot / "ws"
    try:
        st = os.stat(ws, follow_symlinks=False)
    except OSError as e:
        raise Declined(f"the workspace cannot be looked at: {e}") from e
    if not stat.S_ISDIR(st.st_mode):
        raise Declined("the workspace is not a directory")
    if _moved_here(slot.parent, st):
        raise Declined("the workspace is already another warm sandbox's directory (a peer claimed it)")
    before = os.stat(target)
    os.chown(target, st.st_uid, st.st_gid)
    os.chmod(target, stat.S_IMODE(st.st_mode))
    record = slot / CLAIM_FILE
    record.write_text(f"{ws}\n{before.st_dev}:{before.st_ino}\n")
    try:
        os.rename(target, ws)
    except OSError as e:
        record.unlink(missing_ok=True)
        os.chown(target, before.st_uid, before.st_gid)
        os.chmod(target, stat.S_IMODE(before.st_mode))
        if e.errno in _DECLINED:
            raise Declined(f"{ws} cannot be replaced by the sandbox's directory: {os.strerror(e.errno)}") from e
        raise


def _moved_here(root: Path, st: os.stat_result) -> bool:
    """Whether a slot in ``root`` records the directory ``st`` as the one it moved."""
    want = f"{st.st_dev}:{st.st_ino}"
    for record in root.glob(f"*/{CLAIM_FILE}"):
        with contextlib.suppress(OSError):
            if record.read_text().partition("\n")[2].strip() == want:
                return True
    return False


#: rename(2)'s answers for a workspace that cannot take a slot's place.
_DECLINED = {errno.ENOTEMPTY, errno.EEXIST, errno.EXDEV, errno.EBUSY, errno.ENOTDIR, errno.EISDIR, errno.EINVAL}


def release(labels: dict[str, str] | None) -> None:
    """Undo a pooled container's slot once the container is gone: the workspace's bind
    (and the .git protections below it) detached, the slot removed. Never removes what
    is in a workspace: only empty directories are removed, after the detach. Best effort
    (logged): blocking, call it in a thread."""
    slot = slot_of(labels)
    if slot is None:
        return
    try:
        hostmounts.unbind(slot / "ws")
    except OSError as e:
        log.warning("sandbox.pool_unbind_failed", slot=str(slot), error=repr(e))
        return
    if hostmounts.is_mount_point(slot / "ws"):
        return  # something is still mounted there: leave the slot for the next gc
    with contextlib.suppress(OSError):
        (slot / "ws").rmdir()  # empty once unbound; a non-empty one is left alone
    for name in (CLAIM_FILE, SLOT_MARK, OWNER_LOCK):
        with contextlib.suppress(OSError):
            (slot / name).unlink()
    with contextlib.suppress(OSError):
        slot.rmdir()


def abandon(slot: Path, owner: int, channel: Path | None) -> None:
    """A slot whose container was never made: released, its lock ``owner`` closed, and the
    gVisor channel directory made for it removed (when empty). Blocking; best effort."""
    release({LABEL_SLOT: str(slot)})
    with contextlib.suppress(OSError):
        os.close(owner)
    if channel is not None:
        with contextlib.suppress(OSError):
            channel.rmdir()


def release_container(container: Any) -> None:
    """:func:`release` of a removed pooled ``container``'s slot, and the gVisor channel
    directory the pool made for that slot (mounted at CHANNEL_MOUNT, named by the slot's
    key: never a workspace's own, which its next start uses again). Only an empty one is
    removed. Best effort; blocking, call it in a thread."""
    labels = labels_of(container)
    slot = slot_of(labels)
    own = workspace_key(slot / "ws") if slot is not None else None
    release(labels)
    for m in (getattr(container, "attrs", None) or {}).get("Mounts") or []:
        source = m.get("Source") if isinstance(m, dict) else None
        if own is not None and m.get("Destination") == CHANNEL_MOUNT and source and Path(source).name == own:
            with contextlib.suppress(OSError):
                Path(source).rmdir()


def labels_of(container: Any) -> dict[str, str]:
    """A container's labels (empty when the SDK object has none)."""
    return dict(getattr(container, "labels", None) or {})
