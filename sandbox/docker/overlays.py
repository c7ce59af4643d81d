"""Overlay volumes: a fork's tree as an overlayfs the ENGINE mounts (the ``overlay`` fork
strategy, ``worker.snapshots.overlay``). The worker needs no privilege for it.

A fork is a Docker *local* volume ``loom-fork-<hex>`` created with overlay options
(``type=overlay, device=overlay, o=lowerdir=<snapshot tree>,upperdir=…,workdir=…,
redirect_dir=on``). The engine mounts it at the volume's mountpoint
(``<DockerRootDir>/volumes/loom-fork-<hex>/_data``) whenever a container using it starts,
and unmounts it when the last one stops. That mountpoint is the fork's workspace: its real
path names the workspace everywhere (registry, changelog, snapshots, container name).

Why each objection to overlayfs in ``worker.snapshots.strategy`` no longer holds:

- *privilege*: the engine makes the mount, as it does for its own layers;
- *a reboot leaves an empty directory*: the sandbox of such a workspace never binds that
  directory; it mounts the volume (:meth:`OverlayVolumes.verify` checks the volume is
  ours and is that path, and refuses otherwise), and the engine mounts the overlay before
  the container starts or fails the start, so a sandbox never writes into a bare mountpoint;
- *a running sandbox pins the mount*: removing a fork stops its sandbox first (the engine
  refuses to remove a volume in use, so nothing is removed under a running sandbox);
- *renaming a lower directory*: ``redirect_dir=on`` makes ``rename(2)`` of a directory of
  the lower tree work (without it the kernel answers EXDEV), under runc and gVisor alike.
"""

from __future__ import annotations

import asyncio
import builtins
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import docker.errors

from ..errors import SandboxUnavailableError
from ..identity import FORK_VOLUME_PREFIX, fork_volume_of
from .config import LABEL_WORKER
from .engine import Engine

#: The label holding the snapshot a fork volume was made from.
LABEL_SNAPSHOT = "dev.loom.fork-snapshot"
#: The label holding the path the fork was asked for (a link to the mountpoint).
LABEL_LINK = "dev.loom.fork-link"
VOLUME_PREFIX = FORK_VOLUME_PREFIX
volume_of = fork_volume_of


class OverlayVolumes:
    """The engine's overlay volumes for forks."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._verified: dict[str, str] = {}  # workspace path -> volume, checked with the engine
        self._volumes_dir: Path | None = None

    async def volumes_dir(self) -> Path | None:
        """``<DockerRootDir>/volumes`` when this process can reach it (the engine is the
        local one and this user may enter its directory), else None. Asks the engine once.
        Raises DaemonUnavailableError."""
        if self._volumes_dir is None:
            info = await self._engine.info()
            root = info.get("DockerRootDir")
            if not isinstance(root, str) or not root:
                return None
            self._volumes_dir = Path(root) / "volumes"
        d = self._volumes_dir
        return d if await asyncio.to_thread(os.access, d, os.X_OK) else None

    async def create(self, name: str, lowers: Sequence[Path], upper: Path, work: Path, labels: dict[str, str]) -> Path:
        """Create volume ``name`` (``loom-fork-…``): ``upper`` over ``lowers`` (the first on
        top), ``work`` its workdir (on ``upper``'s filesystem). Returns its mountpoint.
        Raises SandboxUnavailableError (the engine refused), DaemonUnavailableError."""
        if not name.startswith(VOLUME_PREFIX):
            raise ValueError(f"a fork volume's name starts with {VOLUME_PREFIX}")
        for p in (*lowers, upper, work):
            # the options are comma- and colon-separated: such a path cannot be said there
            if any(c in str(p) for c in ",:") or not p.is_absolute():
                raise SandboxUnavailableError(f"an overlay cannot name {p} (a comma or colon in it)")
        opts = f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={work},redirect_dir=on"
        client = await self._engine.connect()

        def make() -> str:
            vol = client.volumes.create(
                name,
                driver="local",
                driver_opts={"type": "overlay", "device": "overlay", "o": opts},
                labels={LABEL_WORKER: "1", **labels},
            )
            return str(vol.attrs["Mountpoint"])

        mountpoint = Path(await self._engine.call("create fork volume", make))
        self._verified[str(mountpoint)] = name
        return mountpoint

    async def verify(self, ws: Path) -> str | None:
        """The volume a sandbox of workspace ``ws`` mounts instead of binding ``ws``: None
        for a plain directory; the fork volume whose mountpoint ``ws`` is. Raises
        SandboxUnavailableError when ``ws`` has a fork volume's shape and the engine has no
        such volume of ours there (the fork was deleted, or the path is not the engine's):
        its bare mountpoint is never mounted in its place. DaemonUnavailableError."""
        name = volume_of(ws)
        if name is None:
            return None
        if self._verified.get(str(ws)) == name:
            return name
        client = await self._engine.connect()

        def get() -> dict[str, Any] | None:
            try:
                return dict(client.volumes.get(name).attrs)
            except docker.errors.NotFound:
                return None

        attrs = await self._engine.call("inspect fork volume", get)
        if (
            attrs is None
            or (attrs.get("Labels") or {}).get(LABEL_WORKER) != "1"
            or attrs.get("Mountpoint") != str(ws)
            or (attrs.get("Options") or {}).get("type") != "overlay"
        ):
            raise SandboxUnavailableError(
                f"{ws} is the mountpoint of fork volume {name}, and the engine has no such fork volume: "
                "the fork was deleted (its layers are gone); make a new fork"
            )
        self._verified[str(ws)] = name
        return name

    def volume_for(self, ws: Path) -> str | None:
        """The verified fork volume of ``ws`` (:meth:`verify` ran), else None."""
        return self._verified.get(str(ws))

    async def list(self) -> builtins.list[dict[str, Any]]:
        """The engine's fork volumes of ours (any data directory's): each one's ``name``,
        ``mountpoint``, ``upper`` (its upper layer's path; None when unreadable),
        ``created`` (the engine's ISO time) and ``labels``. Raises DaemonUnavailableError."""
        client = await self._engine.connect()

        def ls() -> list[dict[str, Any]]:
            out = []
            for vol in client.volumes.list(filters={"name": VOLUME_PREFIX, "label": f"{LABEL_WORKER}=1"}):
                attrs = vol.attrs or {}
                if not vol.name.startswith(VOLUME_PREFIX):
                    continue  # (the engine's name filter matches anywhere in the name)
                opts = dict(o.split("=", 1) for o in (attrs.get("Options") or {}).get("o", "").split(",") if "=" in o)
                out.append(
                    {
                        "name": vol.name,
                        "mountpoint": attrs.get("Mountpoint"),
                        "upper": opts.get("upperdir"),
                        "created": attrs.get("CreatedAt"),
                        "labels": dict(attrs.get("Labels") or {}),
                    }
                )
            return out

        return await self._engine.call("list fork volumes", ls)

    async def remove(self, name: str, *, with_containers: bool = False) -> None:
        """Remove fork volume ``name`` (absent is fine). The engine refuses while a
        container uses it: stop the fork's sandbox first, or (``with_containers``, for
        ``gc``) remove the loom sandboxes using it. Raises SandboxUnavailableError,
        DaemonUnavailableError."""
        client = await self._engine.connect()
        if with_containers:
            users = await self._engine.listed("list fork volume users", {"volume": name, "label": f"{LABEL_WORKER}=1"})
            for c in users:
                await self._engine.remove(c)

        def rm() -> None:
            try:
                client.volumes.get(name).remove()
            except docker.errors.NotFound:
                pass

        await self._engine.call("remove fork volume", rm)
        for k in [k for k, v in self._verified.items() if v == name]:
            del self._verified[k]
