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
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

from ..logs import get_logger
from ..spec import LABEL_PREFIX
from . import hostmounts
from .config import LABEL_WS

log = get_logger("sandbox.docker")

LABEL_POOL = f"{LABEL_PREFIX}.pool"  # the class key of a pooled container
LABEL_SLOT = f"{LABEL_PREFIX}.pool-slot"  # its slot directory on the host
#: A pooled container's name before its claim renames it to the workspace's.
POOL_PREFIX = "loom-pool-"
CLAIM_FILE = "workspace"
SLOT_MARK = ".loom-pool-slot"
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
        ws = (slot / CLAIM_FILE).read_text().strip()
        bound, real = os.stat(slot / "ws"), os.stat(ws)
    except (OSError, ValueError):
        return None
    if (bound.st_dev, bound.st_ino) != (real.st_dev, real.st_ino):
        return None  # not (or no longer) that workspace's bind
    return ws


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
    for name in (CLAIM_FILE, SLOT_MARK):
        with contextlib.suppress(OSError):
            (slot / name).unlink()
    with contextlib.suppress(OSError):
        slot.rmdir()


def labels_of(container: Any) -> dict[str, str]:
    """A container's labels (empty when the SDK object has none)."""
    return dict(getattr(container, "labels", None) or {})
