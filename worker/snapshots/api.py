"""``Snapshots``: take, list, show, delete snapshots of workspaces; fork and restore.

Used by every surface (Python, CLI, HTTP, MCP) over one :class:`~worker.registry.
ToolRegistry`: a workspace's sandbox, changelog and settings are the registry's, so a
snapshot records where *that* changelog stood and the settings its sandbox is made with.

Consistency while commands run: under the workspace's mutation lock (no call of this
process runs meanwhile) the changelog is brought up to date, then the sandbox is paused
(the cgroup freezer, ``docker pause``: background processes stop mid-write, and a file is
copied either before or after each of their writes, never torn) for the copy only, then
resumed. A workspace that is a btrfs subvolume (every fork on btrfs) is snapshotted
atomically instead, with no pause.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sandbox.base import Freezer
from sandbox.logs import get_logger

from ..changelog import Changelog
from ..changelog.restore import Plan, walk
from . import overlay, scratch, strategy
from .errors import SnapshotError, SnapshotInUseError, SnapshotLimitError, SnapshotNotFoundError
from .index import Fork, Index, Snapshot

if TYPE_CHECKING:
    from ..registry.contract import LocalRegistry

T = TypeVar("T")
log = get_logger("worker.snapshots")
#: Forks one request may make.
MAX_FORKS = 64


@dataclass(frozen=True)
class Limits:
    """``LOOM_MAX_SNAPSHOTS`` (per workspace) and ``LOOM_MAX_SNAPSHOT_BYTES`` (the store)."""

    max_snapshots: int = 32
    max_bytes: int = 64 << 30


@dataclass
class Restored:
    """What a restore did (or, in a dry run, would do)."""

    snapshot: str
    call_id: str | None
    dry_run: bool
    plan: Plan = field(default_factory=Plan)

    def as_dict(self) -> dict[str, Any]:
        return {
            "snapshot": self.snapshot,
            "call_id": self.call_id,
            "dry_run": self.dry_run,
            **self.plan.as_dict(),
            "diff": self.plan.diff,
        }


class Snapshots:
    """The snapshot store under ``data_dir/snapshots`` for the workspaces of ``registry``."""

    def __init__(
        self, registry: LocalRegistry, data_dir: Path, limits: Limits | None = None, *, prefer: str | None = None
    ) -> None:
        self.registry = registry
        self.data_dir = Path(data_dir)
        self.limits = limits or Limits()
        #: A strategy to start with (btrfs, reflink, overlay, copy); None: the best the host allows.
        self.prefer: Any = prefer
        self.index = Index(self.data_dir / "snapshots")
        self._lock = asyncio.Lock()

    @classmethod
    def from_settings(cls, registry: LocalRegistry, settings: Any) -> Snapshots:
        from sandbox.spec import parse_size

        limits = Limits(max_snapshots=settings.max_snapshots, max_bytes=parse_size(settings.max_snapshot_bytes))
        prefer = None if settings.snapshot_strategy == "auto" else settings.snapshot_strategy
        return cls(registry, settings.data_dir, limits, prefer=prefer)

    def close(self) -> None:
        self.index.close()

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:  # one SQLite connection: one thread at a time
            return await asyncio.to_thread(fn, *args)

    # -- reading ----------------------------------------------------------------------

    async def get(self, ref: str, workspace: Path | str | None = None) -> Snapshot:
        """A snapshot by id or name. Raises SnapshotNotFoundError."""
        ws = None if workspace is None else str(_root(workspace))
        return await self._db(self.index.get, ref, ws)

    async def list(self, workspace: Path | str | None = None, *, deleted: bool = False) -> list[Snapshot]:
        """Snapshots, oldest first (of ``workspace`` when given)."""
        ws = None if workspace is None else str(_root(workspace))
        return await self._db(lambda: self.index.list(ws, deleted=deleted))

    async def shown(self, snap: Snapshot) -> Snapshot:
        """``snap`` as users see it (the CLI, HTTP, the dashboard, a cluster): overlay forks
        (its workspace, its forks) named by the directories asked for, not by the engine's
        mountpoints that are their identity here (:func:`.overlay.shown`)."""
        if not any(overlay.is_overlay_fork(p) for p in (snap.workspace, *snap.forks)):
            return snap

        def convert() -> Snapshot:
            def f(p: str) -> str:
                return overlay.shown(self.data_dir, p)

            return snap.model_copy(
                update={
                    "workspace": f(snap.workspace),
                    "forks": [f(p) for p in snap.forks],
                    "live_forks": [f(p) for p in snap.live_forks],
                }
            )

        return await asyncio.to_thread(convert)

    async def shown_path(self, path: Path | str) -> str:
        """A workspace path as users see it (an overlay fork's link, :meth:`shown`)."""
        if not overlay.is_overlay_fork(path):
            return str(path)
        return await asyncio.to_thread(overlay.shown, self.data_dir, str(path))

    async def origin(self, workspace: Path | str) -> Fork | None:
        """The fork record of ``workspace`` (None when it is not a fork)."""
        return await self._db(self.index.origin, str(_root(workspace)))

    # -- taking -----------------------------------------------------------------------

    async def create(self, workspace: Path | str, name: str | None = None, *, with_scratch: bool = False) -> Snapshot:
        """Snapshot ``workspace``: its whole tree, its own settings, where its changelog
        stands, and with ``with_scratch`` its sandbox's ``/tmp`` and ``$HOME``.

        Raises SnapshotLimitError (nothing made), SnapshotDiskFullError (the partial copy
        removed, the workspace untouched), SnapshotError, NotADirectoryError, sandbox and
        changelog errors.
        """
        root = _root(workspace)
        if await self._db(self.index.count, str(root)) >= self.limits.max_snapshots:
            raise SnapshotLimitError(
                f"{root} already has {self.limits.max_snapshots} snapshots (LOOM_MAX_SNAPSHOTS): delete one first"
            )
        ws = await self.registry.workspace(root)
        snap_id = "snap-" + secrets.token_hex(6)
        directory = self.index.directory(snap_id)
        async with ws._mutation_lock:
            await overlay.ensure_mounted(root, ws.sandbox.info)  # an overlay fork's tree, not its bare mountpoint
            cl = ws.recorder if isinstance(ws.recorder, Changelog) else None
            entry = 0
            if cl is not None:
                await cl.before_shell(ws.sandbox)  # the changelog describes the tree as it is
                entry = await cl.last_entry()
            archive = await scratch.capture(ws.sandbox) if with_scratch else None
            files, size = await asyncio.to_thread(_measure, root)
            used = await self._db(self.index.total_bytes)
            if used + size > self.limits.max_bytes:
                raise SnapshotLimitError(
                    f"the snapshot store holds {used} bytes and this workspace {size}: over the "
                    f"{self.limits.max_bytes} byte limit (LOOM_MAX_SNAPSHOT_BYTES); delete snapshots first"
                )
            await asyncio.to_thread(directory.mkdir, mode=0o700, parents=True)
            try:
                # The changelog's lock is held across processes: another worker's snapshot
                # of this workspace cannot resume the sandbox in the middle of this copy.
                async with cl.lock if cl is not None else contextlib.nullcontext():
                    made = await self._frozen(
                        root, lambda: asyncio.to_thread(strategy.capture, root, directory / "tree", prefer=self.prefer)
                    )
                if archive is not None:
                    await asyncio.to_thread((directory / "scratch.tar").write_bytes, archive)
            except BaseException:
                await asyncio.to_thread(strategy.remove, directory / "tree")  # (a read-only subvolume too)
                await asyncio.to_thread(_rmtree, directory)
                raise
        origin = await self._db(self.index.origin, str(root))
        settings = self.registry.configs.store.load(root).set_fields() if self.registry.configs else {}
        snap = Snapshot(
            id=snap_id,
            name=name,
            workspace=str(root),
            created=time.time(),
            strategy=made.strategy,
            files=files,
            bytes=size,
            changelog_entry=entry,
            settings=settings,
            parent=origin.snapshot if origin else None,
            with_scratch=archive is not None,
        )
        await self._db(self.index.add, snap)
        return snap

    async def _frozen(self, root: Path, copy: Callable[[], Awaitable[T]]) -> T:
        """``copy()`` with the workspace's sandbox paused (not needed for a subvolume)."""
        backend = self.registry.backend
        if not isinstance(backend, Freezer) or await asyncio.to_thread(strategy.is_subvolume, root):
            return await copy()
        paused = await backend.freeze(root, True)
        try:
            return await copy()
        finally:
            if paused:
                await backend.freeze(root, False)

    # -- forking ----------------------------------------------------------------------

    async def fork(
        self,
        ref: str,
        count: int = 1,
        *,
        into: Path | str | None = None,
        names: builtins.list[str] | None = None,
        workspace: Path | str | None = None,
    ) -> builtins.list[Path]:
        """Make ``count`` new workspaces from snapshot ``ref`` (id, or a name of
        ``workspace``'s), each in its own directory under ``into`` (default: beside the
        snapshot's workspace) named ``names[i]`` or ``<workspace>-fork-<hex>``, with the
        snapshot's settings, a changelog that starts at the snapshot, and its scratch.
        ``into`` is made when missing.

        All or nothing: on a failure every fork made by this call is removed. Raises
        ValueError (count, names), SnapshotNotFoundError, SnapshotDiskFullError,
        SnapshotError, NotADirectoryError (``into`` is a file), FileExistsError (a fork's
        name is taken), sandbox errors (scratch).
        """
        if not 1 <= count <= MAX_FORKS:
            raise ValueError(f"count must be 1 to {MAX_FORKS}")
        if names is not None and len(names) != count:
            raise ValueError("give one name per fork")
        snap = await self.get(ref, workspace)
        if snap.deleted is not None:
            raise SnapshotNotFoundError(f"snapshot {snap.id} was deleted")
        # An overlay fork's snapshot names the engine's mountpoint (".../volumes/<v>/_data"):
        # its forks go beside, and are named after, the directory it was asked for.
        shown = Path(await self.shown_path(snap.workspace))
        parent = Path(into) if into is not None else shown.parent
        parent = parent.expanduser().resolve()
        if into is not None and not os.path.lexists(parent):
            await asyncio.to_thread(parent.mkdir, 0o755, True)  # (parents=True) `--into ./attempts`, made
        if not parent.is_dir():
            raise NotADirectoryError(f"{parent} is not a directory")
        base = shown.name[:40]
        dests = [parent / (names[i] if names else f"{base}-fork-{secrets.token_hex(3)}") for i in range(count)]
        for d in dests:
            if os.path.lexists(d):
                raise FileExistsError(f"{d} already exists")
        tree = self.index.directory(snap.id) / "tree"
        made: builtins.list[strategy.Made] = []
        links: dict[Path, Path] = {}  # an overlay fork's mountpoint -> the link asked for
        on_overlay = await self._overlay(tree, parent)
        # cp is one process per fork (two cores here); btrfs snapshots serialize on its
        # transaction (measured: 8 in parallel 0.32 s, one after another 0.21 s); an
        # overlay fork is an engine call.
        subvolume = await asyncio.to_thread(strategy.is_subvolume, tree)
        sem = asyncio.Semaphore(8 if on_overlay else 1 if subvolume else 2)

        async def one(dest: Path) -> None:
            async with sem:
                if on_overlay:
                    backend: Any = self.registry.backend
                    mountpoint = await overlay.make(backend, tree, self.data_dir, snap.id, dest)
                    links[mountpoint] = dest
                    made.append(strategy.Made(mountpoint, "overlay"))
                else:
                    made.append(await asyncio.to_thread(strategy.clone, tree, dest, prefer=self.prefer))

        try:
            results = await asyncio.gather(*(one(d) for d in dests), return_exceptions=True)
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            if failed is not None:
                raise failed
            forks = await asyncio.gather(*(asyncio.to_thread(self._adopt, snap, m) for m in made))
            await self._db(self.index.add_forks, forks)
            if snap.with_scratch:
                archive = await asyncio.to_thread((self.index.directory(snap.id) / "scratch.tar").read_bytes)
                for d in dests:
                    ws = await self.registry.workspace(d)
                    await scratch.unpack(ws.sandbox, archive)
        except BaseException:
            for m in made:
                with contextlib.suppress(Exception):
                    await self._forget(m.path, links.get(m.path))
            raise
        return dests

    async def mount(self, workspace: Path | str) -> None:
        """Make an overlay fork's tree show at its path on the host (its sandbox started);
        nothing for any other workspace. Raises SnapshotError, sandbox errors."""
        root = _root(workspace)
        if overlay.is_overlay_fork(root):
            ws = await self.registry.workspace(root)
            await overlay.ensure_mounted(root, ws.sandbox.info)

    async def mount_all(self, forks: builtins.list[Path]) -> None:
        """:meth:`mount` each of new ``forks`` (for the service's routes, whose answer names
        directories a client may read at once), in parallel. Never raises: a sandbox that
        does not start is logged, and its fork's first call reports why."""
        results = await asyncio.gather(*(self.mount(f) for f in forks), return_exceptions=True)
        for f, r in zip(forks, results, strict=True):
            if isinstance(r, BaseException):
                log.warning("snapshots.fork_not_mounted", fork=str(f), error=repr(r))

    async def _overlay(self, tree: Path, parent: Path) -> bool:
        """Whether forks of ``tree`` into ``parent`` are overlay volumes: asked for
        (``overlay``), or ``auto`` where neither a btrfs snapshot nor a reflink copy is
        possible; and the engine can make them (else the next strategy, a copy)."""
        if self.prefer not in (None, "overlay"):
            return False
        if self.prefer is None and (
            await asyncio.to_thread(strategy.is_subvolume, tree)
            or await asyncio.to_thread(strategy.reflinks, tree, parent)
        ):
            return False
        return await overlay.available(self.registry.backend, self.data_dir)

    def _adopt(self, snap: Snapshot, made: strategy.Made) -> Fork:
        """A new fork's settings and changelog (blocking: one thread per fork)."""
        dest = made.path
        if snap.settings and self.registry.configs is not None:
            from ..workspace_settings import parse

            self.registry.configs.store.save(dest, parse(snap.settings))
        origin = {
            "snapshot": snap.id,
            "workspace": snap.workspace,
            "entry": snap.changelog_entry,
            "created": snap.created,
        }
        Changelog.start_at(self.data_dir, dest, origin)
        if made.strategy == "overlay" and self.registry.configs is not None:
            # The guard's trust, taken now from the snapshot's tree (the fork's lower layer):
            # its first look at the fork's own path comes once a sandbox has mounted it.
            from ..changelog.recorder import workspace_dir
            from ..guard import WorkspaceGuard

            state = workspace_dir(self.registry.configs.store.data_dir, dest)
            WorkspaceGuard(dest, state).adopt_trust(self.index.directory(snap.id) / "tree")
        return Fork(workspace=str(dest), snapshot=snap.id, created=time.time(), strategy=made.strategy)

    async def _forget(self, dest: Path, link: Path | None = None) -> None:
        """Undo :meth:`_adopt` and remove the fork's tree (a failed fork request, or
        :meth:`remove_fork`); ``link``: an overlay fork's link to ``dest``."""
        with contextlib.suppress(Exception):
            await self.registry.stop(dest)
        if overlay.is_overlay_fork(dest):
            backend: Any = self.registry.backend
            # another process's sandbox of it holds the volume: the engine would refuse
            await backend.stop(dest)
            await overlay.remove(backend, self.data_dir, dest, link)
        else:
            await asyncio.to_thread(strategy.remove, dest)
        await self._db(self.index.drop_fork, str(dest))
        from ..changelog.recorder import workspace_dir

        await asyncio.to_thread(_rmtree, workspace_dir(self.data_dir, dest))

    # -- restoring --------------------------------------------------------------------

    async def restore(self, workspace: Path | str, ref: str, *, dry_run: bool = False) -> Restored:
        """Put ``workspace`` back to snapshot ``ref`` byte for byte (paths, bytes, kinds,
        permission bits), through its sandbox, every change recorded in its changelog as
        one call (``call_id``) that ``undo`` reverts. ``dry_run``: the plan and its diff.

        Raises SnapshotNotFoundError, SnapshotError (the workspace records no changelog),
        sandbox and changelog errors.
        """
        root = _root(workspace)
        snap = await self.get(ref, root)
        if snap.deleted is not None:
            raise SnapshotNotFoundError(f"snapshot {snap.id} was deleted")
        ws = await self.registry.workspace(root)
        if not isinstance(ws.recorder, Changelog):
            raise SnapshotError("this workspace records no changelog: a restore could not be undone")
        call_id = None if dry_run else "restore_" + secrets.token_hex(8)
        async with ws.mutating():
            plan = await ws.recorder.restore(
                ws.sandbox,
                self.index.directory(snap.id) / "tree",
                call_id=call_id or "dry-run",
                note=f"restore of snapshot {snap.id}" + (f" ({snap.name})" if snap.name else ""),
                dry_run=dry_run,
            )
            ws.forget(None)
        return Restored(snap.id, call_id, dry_run, plan)

    # -- deleting ---------------------------------------------------------------------

    async def delete(self, ref: str, *, force: bool = False, workspace: Path | str | None = None) -> builtins.list[str]:
        """Delete a snapshot's files (its row stays, marked, for lineage). Returns the live
        forks it leaves (each an independent workspace). Raises SnapshotNotFoundError,
        SnapshotInUseError (live forks, without ``force``), SnapshotError. Forks are
        named as users name them (:meth:`shown`)."""
        snap = await self.get(ref, workspace)
        if snap.deleted is not None:
            raise SnapshotNotFoundError(f"snapshot {snap.id} was already deleted")
        left = (await self.shown(snap)).live_forks  # as users name them
        if snap.live_forks and not force:
            raise SnapshotInUseError(
                f"snapshot {snap.id} has {len(left)} live fork(s); delete them, or use --force "
                "(they stay, independent, and name a deleted snapshot as their origin): " + ", ".join(left),
                left,
            )
        directory = self.index.directory(snap.id)
        # An overlay fork reads this tree as its lower layer: kept until the last is removed.
        if not any(overlay.is_overlay_fork(f) for f in snap.live_forks):
            await asyncio.to_thread(strategy.remove, directory / "tree")
            await asyncio.to_thread(_rmtree, directory)
        await self._db(self.index.mark_deleted, snap.id)
        return left

    async def remove_fork(self, workspace: Path | str) -> None:
        """Delete fork ``workspace`` (a directory ``fork`` made, or the link to an overlay
        fork): its sandbox stopped, its tree (an overlay fork's volume and layers), its
        changelog and its record; a deleted snapshot's tree kept for it goes too once no
        overlay fork needs it. Raises SnapshotNotFoundError (not a fork), SnapshotError,
        NotADirectoryError, DaemonUnavailableError."""
        given = Path(workspace).expanduser().absolute()
        root = _root(workspace)
        fork = await self.origin(root)
        if fork is None:
            raise SnapshotNotFoundError(f"{root} is not a fork (no snapshot's fork record names it)")
        await self._forget(root, given if given != root else None)
        snap = await self.get(fork.snapshot)
        if snap.deleted is not None and not any(overlay.is_overlay_fork(f) for f in snap.live_forks):
            directory = self.index.directory(snap.id)
            await asyncio.to_thread(strategy.remove, directory / "tree")
            await asyncio.to_thread(_rmtree, directory)


def _root(workspace: Path | str) -> Path:
    root = Path(workspace).expanduser().resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"workspace directory not found: {root}")
    return root


def _measure(root: Path) -> tuple[int, int]:
    """Files (every non-directory) and bytes (regular files' apparent sizes) under ``root``."""
    files = size = 0
    for node in walk(root).values():
        if node.type != "dir":
            files += 1
            size += node.size if node.type == "file" else 0
    return files, size


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
