"""The workspace pool: one :class:`~worker.workspace.Workspace` (sandbox + change recorder +
background processes) per host directory, made on first use and kept, remade when the
workspace's settings change, with the egress gateway of the workspaces allowed out.

What a backend can do beyond the sandbox contract (a spec per workspace, its runtimes, its
images) is asked through the capability protocols of :mod:`sandbox.base`.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sandbox.base import ConfigurableBackend, CpuInventory, ImageInventory, RuntimeInventory, SandboxBackend
from sandbox.errors import ImageNotFoundError, SandboxUnavailableError
from sandbox.logs import get_logger

from ..background import Background, BackgroundIndex, BackgroundLimits
from ..changelog.api import Changelog
from ..changelog.recorder import workspace_dir
from ..changelog.store import WorkspaceLock
from ..guard import WorkspaceGuard
from ..pem import trusted_copy
from ..tool import ToolError
from ..workspace import ChangeRecorder, Workspace
from ..workspace_settings import Configs, Configured, SettingsError, WorkspaceSettings, check, parse

if TYPE_CHECKING:  # the gateway's imports are paid only when a workspace may reach out
    from sandbox.spec import SandboxSpec

    from ..egress.gateway import EgressGateway
    from ..egress.log import EgressRecord

log = get_logger("worker.registry")

RecorderFactory = Callable[[Path], ChangeRecorder]


@runtime_checkable
class Closes(Protocol):
    """A recorder to close when its workspace is forgotten (the changelog; closing is not
    part of the recorder protocol: the null recorder holds nothing)."""

    async def aclose(self) -> None: ...


class WorkspacePool:
    """The workspaces calls run in, by real path (see the module docstring).

    ``backend`` gives each directory its sandbox; without one, :meth:`workspace` raises
    SandboxUnavailableError. ``recorder_factory(root)`` makes each workspace's change
    recorder (none: nothing is recorded); with ``own_recorders`` the recorders it made are
    closed by :meth:`aclose` (a caller's factory may share one changelog between pools,
    so by default they are left open). ``configs`` are the per-workspace settings (each
    sandbox is made with its own spec, re-read when its settings file changes).
    ``egress_factory`` makes the egress gateway the first time a workspace that may reach
    the network is opened.
    """

    def __init__(
        self,
        backend: SandboxBackend | None = None,
        *,
        recorder_factory: RecorderFactory | None = None,
        own_recorders: bool = False,
        configs: Configs | None = None,
        background: BackgroundLimits | None = None,
        egress_factory: Callable[[], EgressGateway] | None = None,
    ) -> None:
        self.backend = backend
        self.configs = configs
        #: Limits of background processes (``shell_execute`` with ``background``/``yield_ms``).
        self.background_limits = background or BackgroundLimits()
        self.egress_factory = egress_factory
        #: The egress gateway, once a workspace allowed out was opened.
        self.egress: EgressGateway | None = None
        #: Told of every egress attempt (the service's metrics), once the gateway exists.
        self.egress_observers: list[Callable[[EgressRecord], None]] = []
        self._recorder_factory = recorder_factory
        self._own_recorders = own_recorders
        self._workspaces: dict[Path, Workspace] = {}  # by real path: the source of truth
        # The same workspaces by the caller's own spelling of an absolute path, so a call
        # does not resolve it again (expanduser + realpath: a few lstat calls each time).
        self._by_arg: dict[str, Workspace] = {}
        # One lock per workspace: opening or reconfiguring one never waits for another's
        # (a hundred workspaces opened at once start side by side: the backend bounds that).
        self._locks: dict[Path, asyncio.Lock] = {}
        self._egress_roots: set[Path] = set()

    # -- the workspaces -------------------------------------------------------------------

    async def workspace(self, path: Path | str, *, warm: bool = False) -> Workspace:
        """The cached :class:`Workspace` of directory ``path`` (by real path). With
        ``warm`` (a tool call is coming), a workspace opened now has its sandbox started
        while its changelog and guard open (:meth:`~sandbox.base.Sandbox.warm`).

        An absolute ``path`` is remembered as given, so the next call with the same
        spelling skips resolving it; a relative one (or ``~``) is resolved on every call,
        since its meaning follows the working directory (or HOME). A symlink retargeted
        later keeps its first workspace until :meth:`stop` or :meth:`aclose`.

        Raises ToolError when the directory does not exist, SandboxUnavailableError when
        no backend is configured or the sandbox cannot start.
        """
        key = path if isinstance(path, str) else str(path)
        ws = self._by_arg.get(key)
        if ws is not None:
            if self.configs is not None and self.configs.store.changed(ws.root):
                return await self._reconfigure(ws.root)
            if ws.root in self._egress_roots:
                await self._serve_egress(ws.root)
            return ws
        root = Path(key).expanduser().resolve()
        ws = self._workspaces.get(root)
        if ws is not None and self.configs is not None and self.configs.store.changed(root):
            ws = await self._reconfigure(root)
        if ws is None:
            if self.backend is None:
                raise SandboxUnavailableError("No sandbox backend is configured for this registry")
            if not root.is_dir():
                raise ToolError(f"Workspace directory not found: {root}")
            async with self._lock(root):
                ws = self._workspaces.get(root)
                if ws is None:
                    await self._apply_settings(root)
                    sandbox = await self.backend.get(root)
                    if warm:
                        sandbox.warm()
                    recorder = await self._open_recorder(root)
                    ws = Workspace(
                        root,
                        sandbox,
                        recorder,
                        self._background(root),
                        guard=self._guard(root),
                        mutation_lock=_mutation_lock(recorder),
                    )
                    self._workspaces[root] = ws
        if key.startswith("/") and self._workspaces.get(root) is ws:  # (not stopped meanwhile)
            self._by_arg[key] = ws
        if root in self._egress_roots:
            await self._serve_egress(root)
        return ws

    async def _open_recorder(self, root: Path) -> Any:
        """The workspace's recorder (None without a factory), made in a thread: opening a
        changelog creates its database (~6 ms of SQLite schema and WAL setup here), which
        on the event loop held every other call of the process and the sandbox's start
        just begun (``warm``), which now overlaps it. A caller that gives up meanwhile
        leaves the open to finish, and a recorder this pool would own is then closed."""
        factory = self._recorder_factory
        if factory is None:
            return None
        opening = asyncio.ensure_future(asyncio.to_thread(factory, root))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            if self._own_recorders:
                opening.add_done_callback(_close_unused)
            raise

    def _lock(self, root: Path) -> asyncio.Lock:
        lock = self._locks.get(root)
        if lock is None:
            lock = self._locks[root] = asyncio.Lock()
        return lock

    def cached(self, path: Path | str) -> Workspace | None:
        """The workspace already opened under this spelling of an absolute path, if any
        (nothing is resolved, nothing is opened)."""
        return self._by_arg.get(path if isinstance(path, str) else str(path))

    def opened(self) -> dict[Path, Workspace]:
        """The workspaces open now, by real path (a copy)."""
        return dict(self._workspaces)

    def _guard(self, root: Path) -> WorkspaceGuard:
        """The workspace's host-side guard, its trusted baseline kept next to its changelog
        (in memory only for a pool without a data directory)."""
        state = workspace_dir(self.configs.store.data_dir, root) if self.configs is not None else None
        return WorkspaceGuard(root, state)

    def _background(self, root: Path) -> Background:
        """The workspace's background processes, recorded on the host next to its
        changelog (in memory only for a pool without a data directory)."""
        if self.configs is not None:
            state = workspace_dir(self.configs.store.data_dir, root)
        else:
            state = Path(tempfile.gettempdir()) / "loom-worker-background" / workspace_dir(Path("/"), root).name
        return Background(BackgroundIndex(state), self.background_limits)

    async def stop(self, path: Path | str) -> bool:
        """Forget the workspace and stop its sandbox. Returns False if none was running."""
        root = Path(path).expanduser().resolve()
        ws = self._workspaces.pop(root, None)
        for key in [k for k, v in self._by_arg.items() if v is ws or v.root == root]:
            del self._by_arg[key]
        if ws is not None:
            await ws.aclose()
            await asyncio.to_thread(ws.guard.close)  # (its inotify watch: waits for a check running)
        self._egress_roots.discard(root)
        if self.egress is not None:
            await self.egress.release(root)
        if ws is not None and self._own_recorders and isinstance(ws.recorder, Closes):
            # (a pool that makes a workspace per sample, as the inspect provider does,
            # must not keep every changelog it opened: its next call opens it again)
            await ws.recorder.aclose()
        return await self.backend.stop(root) if self.backend is not None else False

    async def aclose(self) -> None:
        """Close the egress gateway, the recorders this pool owns and the backend's streams."""
        workspaces = list(self._workspaces.values())
        self._workspaces.clear()
        self._by_arg.clear()
        if self.egress is not None:
            await self.egress.aclose()
        for ws in workspaces:
            await ws.aclose()
            await asyncio.to_thread(ws.guard.close)
            if self._own_recorders and isinstance(ws.recorder, Closes):
                await ws.recorder.aclose()
        if self.backend is not None:
            await self.backend.aclose()

    # -- egress ---------------------------------------------------------------------------

    def _egress_gateway(self) -> EgressGateway | None:
        if self.egress is None and self.egress_factory is not None:
            self.egress = self.egress_factory()
            self.egress.observers.extend(self.egress_observers)
        return self.egress

    async def _serve_egress(self, root: Path) -> None:
        """Make sure the egress gateway of a workspace allowed out is served (by this
        process unless another one does). A gateway that cannot serve is logged, not
        raised: the tools work without it, the sandbox's connections fail."""
        gateway = self._egress_gateway()
        if gateway is None:
            return
        try:
            await gateway.serve(root)
        except OSError as e:
            log.warning("egress.serve_failed", workspace=str(root), error=repr(e))

    def turn_dir(self, root: Path) -> Path | None:
        """The host directory already mounted into the sandbox of workspace ``root`` (a
        real path, ``Workspace.root``) where an agent's turn socket can be served
        (:mod:`worker.agents.turns`): the egress gateway's; None when it has none (no egress)."""
        gateway = self._egress_gateway() if root in self._egress_roots else None
        return None if gateway is None else gateway.socket_dir(root)

    def egress_status(self, path: Path | str, *, limit: int = 100, verdict: str | None = None) -> dict[str, Any]:
        """A workspace's egress: its allowlist now, whether this process serves its
        gateway, and its newest log records (newest first). Raises ToolError (no such
        directory), SettingsError (its settings file is not valid), ValueError (no
        per-workspace settings here)."""
        from ..egress.log import EgressLog

        root, configs = self._settings_root(path)
        policy = configs.policy(root)
        records = EgressLog(configs.store.data_dir).read(root, limit=limit, verdict=verdict)
        return {
            "policy": list(policy.entries),
            "enabled": bool(policy),
            "serving": bool(self.egress is not None and self.egress.serving(root)),
            "entries": records[::-1],
        }

    # -- settings -------------------------------------------------------------------------

    async def _apply_settings(self, root: Path) -> bool:
        """Give the backend ``root``'s spec (its settings over the defaults). True when it
        changed. Raises SandboxUnavailableError for a settings file that is not valid."""
        if self.configs is None or not isinstance(self.backend, ConfigurableBackend):
            return False
        try:
            spec = self.configs.spec(root)
            if spec.ca_bundle:
                # Its certificates, copied now: never the named file itself (see trusted_copy).
                trust = self.configs.trust_dir(root)
                spec = spec.model_copy(
                    update={"ca_bundle": await asyncio.to_thread(trusted_copy, spec.ca_bundle, trust)}
                )
        except (SettingsError, OSError) as e:
            raise SandboxUnavailableError(f"The workspace's settings cannot be used: {e}") from e
        if spec.egress_dir:
            self._egress_roots.add(root)
            gateway = self._egress_gateway()
            if gateway is not None:
                # The directory must exist before a container can mount it.
                await asyncio.to_thread(gateway.prepare, root)
        else:
            self._egress_roots.discard(root)
        return bool(await self.backend.configure(root, spec))

    async def _reconfigure(self, root: Path) -> Workspace:
        """The workspace's settings file changed (here or in another process): from now
        on its sandbox is made with the new spec; the changelog stays."""
        async with self._lock(root):
            old = self._workspaces.get(root)
            if not await self._apply_settings(root) and old is not None:
                return old
            assert self.backend is not None
            sandbox = await self.backend.get(root)
            recorder: ChangeRecorder | None
            if old is not None:
                recorder = old.recorder
            else:
                recorder = self._recorder_factory(root) if self._recorder_factory else None
            ws = Workspace(
                root,
                sandbox,
                recorder,
                old.background if old is not None else self._background(root),
                guard=old.guard if old is not None else self._guard(root),
                mutation_lock=_mutation_lock(recorder),
            )
            self._workspaces[root] = ws
            for key in [k for k, v in self._by_arg.items() if v is old]:
                self._by_arg[key] = ws
            if old is not None:
                await old.aclose()  # (the new one watches, from its first change on)
            return ws

    async def workspace_settings(self, path: Path | str) -> tuple[WorkspaceSettings, dict[str, Any]]:
        """A workspace's own settings and the effective ones its sandbox is made with.
        Raises ToolError (no such directory), SettingsError (the file is not valid),
        ValueError when this pool has no per-workspace settings."""
        root, configs = self._settings_root(path)
        return configs.store.load(root), configs.effective(root)

    async def configure_workspace(self, path: Path | str, changes: dict[str, Any]) -> Configured:
        """Change a workspace's settings (a value of None removes that override) after
        checking every value; the sandbox is recreated with them at its next call (the
        workspace's files are kept).

        Raises SettingsError naming the refused field (nothing is stored then; ``allow_root``
        on a workspace whose sandbox would run as root), ToolError
        (no such directory), ValueError when this pool has no per-workspace settings,
        DaemonUnavailableError when the engine must be asked about a runtime and does not
        answer, OSError when the settings cannot be written.
        """
        root, configs = self._settings_root(path)
        before = configs.store.load(root)
        new = parse(changes, before)
        await self.check_settings(new, before)
        try:
            old_spec: SandboxSpec | None = configs.spec(root, before)
        except SettingsError:
            old_spec = None  # (an agent it names was removed since: the new settings may fix it)
        spec = configs.spec(root, new)
        if spec.allow_root and not (old_spec is not None and old_spec.allow_root):
            _check_allow_root(root, spec.uid)
        egress_changed = configs.policy(root, before) != configs.policy(root, new)
        if new != before:
            configs.store.save(root, new)
        if root in self._workspaces:
            await self._reconfigure(root)
        return Configured(new, configs.effective(root, new), spec != old_spec, egress_changed)

    async def check_settings(self, new: WorkspaceSettings, before: WorkspaceSettings | None = None) -> None:
        """Every check of ``new`` (a workspace's settings, replacing ``before``): the
        operator's caps, the CA file, and what only the engine knows: a runtime it has, no
        more CPUs than it has (it would refuse every start), an
        image it holds or pulls now as LOOM_PULL says (one that cannot be had would fail
        every later call of the workspace, so it is refused here, naming it and the
        registry's answer). Values unchanged from ``before`` are not asked about again.

        Raises SettingsError naming the field, DaemonUnavailableError when the engine must
        be asked and does not answer, ValueError when this pool has no settings.
        """
        if self.configs is None:
            raise ValueError("this registry has no per-workspace settings (use default_registry)")
        runtimes = None
        if new.runtime is not None and isinstance(self.backend, RuntimeInventory):
            runtimes = await self.backend.runtimes()
        check(new, self.configs.caps, runtimes)
        changed_cpus = new.cpus is not None and (before is None or new.cpus != before.cpus)
        if changed_cpus and isinstance(self.backend, CpuInventory):
            have = await self.backend.cpu_count()
            if new.cpus is not None and new.cpus > have:
                raise SettingsError("cpus", f"{new.cpus} is more than the engine's {have} CPUs")
        changed_image = new.image is not None and (before is None or new.image != before.image)
        if changed_image and isinstance(self.backend, ImageInventory):
            assert new.image is not None
            try:
                await self.backend.ensure_image(new.image)
            except ImageNotFoundError as e:  # ImagePullError too: the image, the registry and its answer
                raise SettingsError("image", str(e)) from None

    def _settings_root(self, path: Path | str) -> tuple[Path, Configs]:
        if self.configs is None:
            raise ValueError("this registry has no per-workspace settings (use default_registry)")
        root = Path(path).expanduser().resolve()
        if not root.is_dir():
            raise ToolError(f"Workspace directory not found: {root}")
        return root, self.configs


def _check_allow_root(root: Path, uid: int | None) -> None:
    """Refuse ``allow_root`` for a workspace whose sandbox runs as root (LOOM_UID unset and
    a root-owned directory): its main agent would keep root's capabilities, and so would
    every command of the owner. Refused here, naming the field, rather than at every later
    start. Raises SettingsError."""
    owner = uid if uid is not None else root.stat().st_uid
    if owner == 0:
        raise SettingsError(
            "allow_root",
            f"needs a workspace owned by another user than root (or LOOM_UID): {root} is root's, and "
            "its owner's commands would keep root's capabilities",
        )


def _mutation_lock(recorder: ChangeRecorder | None) -> WorkspaceLock | None:
    """The recorder's lock across processes, when it has one (the changelog's): a
    workspace's mutations then take turns with those of every other process."""
    return recorder.mutations if isinstance(recorder, Changelog) else None


def _close_unused(opening: asyncio.Future[Any]) -> None:
    """Close a recorder opened for a caller that gave up (see ``_open_recorder``)."""
    if opening.cancelled() or opening.exception() is not None:
        return
    recorder = opening.result()
    if isinstance(recorder, Closes):
        task = asyncio.ensure_future(recorder.aclose())
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)


#: Closes under way of recorders nobody took (kept so they are not collected midway).
_CLOSING: set[asyncio.Future[Any]] = set()
