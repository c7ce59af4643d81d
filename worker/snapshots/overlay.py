"""The ``overlay`` fork strategy: a fork in O(1) on ext4 (and any filesystem Docker's
overlay2 runs on), as an overlayfs the ENGINE mounts (``sandbox.docker.overlays``).

A fork of snapshot S is a Docker local volume ``loom-fork-<hex>`` whose lower layer is S's
tree (``snapshots/<S>/tree``, never written to) and whose upper and work directories are
``$LOOM_DATA_DIR/fork-layers/<volume>/`` (0700, out of every sandbox's reach). Making one
is two ``mkdir`` and one engine call, whatever the tree's size; an untouched fork costs
two empty directories.

**The fork's host path** is the volume's mountpoint (``<DockerRootDir>/volumes/<volume>/
_data``): its real path is the workspace's identity everywhere (registry, changelog,
snapshot index, container name, the dashboard's fork tree); the directory the fork was
asked for (``--into``/names) is a symbolic link to it, which every surface resolves. The
engine mounts the overlay there while a container using the volume runs, that is while the
fork's sandbox runs; host-side readers of the tree (a snapshot's ``cp -a`` and size,
gVisor's host scans) run while it does, and :func:`ensure_mounted` starts it first where
nothing else has. The sandbox mounts the volume, never the bare mountpoint.

A snapshot of a fork copies its merged tree (``cp -a``, the ``copy`` strategy): its
forks are then overlays over that copy, so snapshots and forks nest to any depth, each
snapshot's tree complete for ``restore``. A snapshot is not removed from under its
overlay forks: deleting it with live overlay forks (``--force``) keeps its tree until the
last of them is removed (:meth:`worker.snapshots.api.Snapshots.remove_fork`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any

from sandbox.capabilities import OverlayForks
from sandbox.identity import FORK_VOLUME_PREFIX, fork_volume_of

from .errors import SnapshotDiskFullError, SnapshotError

#: Where forks' upper and work directories live, under the data dir.
LAYERS_DIR = "fork-layers"
#: The file in a fork's layer directory naming the link it was asked for (:func:`shown`).
LINK_FILE = "link"
_LABEL_SNAPSHOT = "dev.loom.fork-snapshot"
_LABEL_LINK = "dev.loom.fork-link"
# Filesystems an overlay's upper layer cannot be on (the kernel refuses it).
_NO_UPPER = {"overlayfs", "fuseblk", "nfs", "cifs", "smb2"}


def is_overlay_fork(path: Path | str) -> bool:
    """Whether ``path`` (a real path) is an overlay fork's workspace."""
    return fork_volume_of(path) is not None


async def available(backend: Any, data_dir: Path) -> bool:
    """Whether forks can be overlay volumes here: a Docker backend whose engine is the
    local one (its volumes directory is reachable from this process, so the engine and
    this worker see the same paths) and a data dir an overlay's upper layer may be on,
    whose path an overlay's options can say (no comma or colon)."""
    if not isinstance(backend, OverlayForks):
        return False
    real = await asyncio.to_thread(os.path.realpath, data_dir)
    if "," in real or ":" in real:
        return False  # overlay's options are comma- and colon-separated: its layers cannot be named
    try:
        if await backend.overlays.volumes_dir() is None:
            return False
    except Exception:  # the engine is not there: no overlay, the next strategy
        return False
    proc = await asyncio.create_subprocess_exec(
        "stat", "-f", "-c", "%T", str(data_dir), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await proc.communicate()
    return proc.returncode == 0 and out.decode().strip() not in _NO_UPPER


def _layers(tree: Path, layer: Path, link: Path) -> None:
    layer.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    layer.mkdir(mode=0o700)
    (layer / "upper").mkdir()
    (layer / "work").mkdir()
    (layer / LINK_FILE).write_text(str(link) + "\n")
    _like(tree, layer / "upper")


def link_of(data_dir: Path, workspace: Path | str) -> Path | None:
    """The directory overlay fork ``workspace`` (its mountpoint) was asked for: the link
    that still points to it, else None (not an overlay fork, its link moved or removed).
    Blocking (two small reads)."""
    name = fork_volume_of(workspace)
    if name is None:
        return None
    try:
        link = Path((data_dir / LAYERS_DIR / name / LINK_FILE).read_text().strip())
        return link if os.readlink(link) == str(workspace) else None
    except (OSError, ValueError):
        return None


def shown(data_dir: Path, path: str) -> str:
    """``path`` as users name it: an overlay fork's link (the directory they asked for),
    never the engine's mountpoint it resolves to, while that link stands. Blocking."""
    link = link_of(data_dir, path)
    return str(link) if link is not None else path


def _like(tree: Path, d: Path) -> None:
    """Give ``d`` the owner and mode of ``tree``'s root: the merged root shows the upper
    layer's, and the bare mountpoint's owner is who the sandbox runs as."""
    st = os.lstat(tree)
    if os.geteuid() == 0:
        os.chown(d, st.st_uid, st.st_gid)
    os.chmod(d, stat.S_IMODE(st.st_mode))


async def make(backend: OverlayForks, tree: Path, data_dir: Path, snapshot: str, link: Path) -> Path:
    """A new fork of snapshot tree ``tree``: its volume made, ``link`` (absent) a symbolic
    link to its mountpoint. Returns the mountpoint (the fork's workspace path). Nothing is
    left on a failure. Raises SnapshotDiskFullError (no room for its layers), SnapshotError,
    DaemonUnavailableError."""
    name = FORK_VOLUME_PREFIX + secrets.token_hex(8)
    # a real path: the engine's mount options name it (and gc tells ours by it)
    layer = await asyncio.to_thread(lambda: data_dir.resolve() / LAYERS_DIR / name)
    try:
        await asyncio.to_thread(_layers, tree, layer, link)
        mountpoint = await backend.overlays.create(
            name, [tree], layer / "upper", layer / "work", {_LABEL_SNAPSHOT: snapshot, _LABEL_LINK: str(link)}
        )
        await asyncio.to_thread(_like, tree, mountpoint)
        await asyncio.to_thread(os.symlink, mountpoint, link)
    except BaseException as e:
        with contextlib.suppress(Exception):
            await backend.overlays.remove(name)
        await asyncio.to_thread(shutil.rmtree, layer, True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise SnapshotDiskFullError(f"overlay fork {link}: the disk of {layer.parent} is full ({e})") from e
        if isinstance(e, OSError):
            raise SnapshotError(f"overlay fork {link}: {e}") from e
        raise
    return mountpoint


async def remove(backend: Any, data_dir: Path, workspace: Path, link: Path | None = None) -> None:
    """Remove overlay fork ``workspace`` (its mountpoint): its volume (its sandbox must be
    stopped: the engine refuses a volume in use), its layers, and ``link`` when it still
    points there. Raises SnapshotError (the engine refused), DaemonUnavailableError."""
    name = fork_volume_of(workspace)
    if name is None:
        raise SnapshotError(f"{workspace} is not an overlay fork")
    if not isinstance(backend, OverlayForks):
        raise SnapshotError(f"{workspace} is an overlay fork, and this worker has no Docker engine to remove it with")
    try:
        await backend.overlays.remove(name)
    except Exception as e:
        raise SnapshotError(f"the engine did not remove fork volume {name}: {e}") from e
    await asyncio.to_thread(shutil.rmtree, data_dir / LAYERS_DIR / name, True)
    if link is not None and os.path.islink(link) and os.readlink(link) == str(workspace):
        with contextlib.suppress(OSError):
            os.unlink(link)


async def ensure_mounted(workspace: Path, start: Any) -> None:
    """Make sure overlay fork ``workspace``'s tree is mounted (its sandbox runs) before the
    host reads it: ``await start()`` (a call that starts the sandbox) when it is not.
    Raises SnapshotError when it still is not (the host would read an empty directory)."""
    if not is_overlay_fork(workspace) or await asyncio.to_thread(os.path.ismount, workspace):
        return
    await start()
    if not await asyncio.to_thread(os.path.ismount, workspace):
        raise SnapshotError(f"the overlay of fork {workspace} is not mounted, though its sandbox started")


#: Seconds a fork volume with layers but no fork record is left alone by ``gc``: a
#: ``fork`` in another process makes the volume before it records the fork.
UNRECORDED_GRACE = 600.0


async def gc(backend: Any, data_dir: Path, recorded: Any, *, engine_wide: bool = False) -> list[str]:
    """Remove the fork volumes that no fork is: of this data directory's, those whose
    layers are gone and those no fork record names (``await recorded(mountpoint)`` is
    False) for :data:`UNRECORDED_GRACE`; with ``engine_wide`` also any data directory's
    whose layers are gone (that volume can never be mounted again). A live fork is a
    workspace, never garbage: it goes with ``remove_fork``. The sandboxes using a removed
    volume are removed first. Returns the volumes removed. Raises DaemonUnavailableError,
    SnapshotError (the engine refused)."""
    if not isinstance(backend, OverlayForks):
        return []
    mine = (data_dir / LAYERS_DIR).resolve()
    removed = []
    for vol in await backend.overlays.list():
        upper = Path(vol["upper"]) if vol.get("upper") else None
        layer = upper.parent if upper is not None else None
        ours = layer is not None and layer.parent == mine
        gone = layer is None or not await asyncio.to_thread(os.path.isdir, layer)
        if ours and not gone:
            if await recorded(vol["mountpoint"]) or _age(vol.get("created")) < UNRECORDED_GRACE:
                continue
        elif not (gone and (ours or engine_wide)):
            continue
        try:
            await backend.overlays.remove(vol["name"], with_containers=True)
        except Exception as e:
            raise SnapshotError(f"the engine did not remove fork volume {vol['name']}: {e}") from e
        if ours and layer is not None:
            await asyncio.to_thread(shutil.rmtree, layer, True)
        removed.append(vol["name"])
    return removed


def _age(created: str | None) -> float:
    """Seconds since the engine's ISO time ``created`` (unreadable: 0, never old)."""
    import datetime

    try:
        when = datetime.datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return (datetime.datetime.now(datetime.UTC) - when).total_seconds()
