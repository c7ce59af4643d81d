"""The Docker backend: one hardened container per workspace, its lifecycle, and the
sandbox objects the registry gets.

One container per workspace directory, named after the hash of its real path, so every
worker process (a CLI call, a server) finds and reuses the same one; a creation race
between two processes ends in a 409 for one of them, which then adopts the winner's
container. Each process talks to its own agent (:mod:`.channel`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .. import protocol
from ..base import Sandbox, SandboxBackend
from ..connection import AgentConnection
from ..errors import (
    ImageNotFoundError,
    ImageUnusableError,
    RuntimeUnavailableError,
    SandboxLostError,
    SandboxUnavailableError,
)
from ..hostscan import HostScanner
from ..identity import fork_volume_of
from ..logs import get_logger
from ..pulls import PullEvent
from ..spec import SandboxSpec
from . import gvisor, hostmounts, housekeeping, losses, memcg, seccomp, slots
from .box import DockerSandbox
from .channel import AgentChannels, prepare_channel_dir
from .checks import RuntimeCheck, seccomp_kept, verify_gvisor
from .config import (
    LABEL_MASKED,
    LABEL_RUNTIME,
    LABEL_SECCOMP,
    LABEL_SPEC,
    LABEL_WS,
    channel_dir,
    container_config,
    container_name,
    create_args,
    masked_digest,
    owner,
)
from .engine import Engine
from .images import ImagePuller
from .overlays import OverlayVolumes
from .pool import Claim, PoolConfig, PoolHooks, WarmPool
from .runtime_volume import RuntimeVolume

log = get_logger("sandbox.docker")


#: Sandboxes started (or connected to) at once by default (see ``max_parallel_starts``).
DEFAULT_PARALLEL_STARTS = 16


class DockerBackend(SandboxBackend):
    """Per-workspace hardened containers on a Docker engine.

    ``max_parallel_starts`` bounds how many sandboxes the engine is asked to start at once,
    and, separately, how many agents are being started in them (booted, checked, moved to
    their direct channel) at once: beyond either, first calls wait their turn. Each start
    holds no lock that another start needs, so many workspaces opened at once start side
    by side, and a container's agent boots while the engine starts the next containers
    (a pipeline: the engine is never idle waiting for an agent's hello); the bounds keep
    the engine (and a 2-core machine) from thrashing, and the engine's threads and
    connections are sized to them.
    """

    def __init__(
        self,
        spec: SandboxSpec | None = None,
        *,
        worker_id: str | None = None,
        base_url: str | None = None,
        client_factory: Callable[[], Any] | None = None,
        max_parallel_starts: int = DEFAULT_PARALLEL_STARTS,
        pool: PoolConfig | None = None,
    ) -> None:
        self.spec = spec or SandboxSpec()
        #: Per-workspace specs (:meth:`configure`); the others get :attr:`spec`.
        self._specs: dict[Path, SandboxSpec] = {}
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.max_parallel_starts = max(1, max_parallel_starts)
        # Made at first use: a semaphore belongs to the loop it is first used on.
        self._start_slots: asyncio.Semaphore | None = None
        self._agent_slots: asyncio.Semaphore | None = None
        self.engine = Engine(base_url=base_url, client_factory=client_factory, threads=self.max_parallel_starts + 4)
        self._runtime_check = RuntimeCheck(self.engine)
        self.channels = AgentChannels(self.engine, self._runtime_check)
        self._runtime_volume = RuntimeVolume(self.engine, self.spec.agent_runtime_image)
        #: Forks on overlay volumes the engine mounts (the ``overlay`` snapshot strategy).
        self.overlays = OverlayVolumes(self.engine)
        self._status = housekeeping.Status(self.engine)
        #: Pulls images as :attr:`SandboxSpec.pull` says (:mod:`.images`).
        self.images = ImagePuller(self.engine)
        self._boxes: dict[Path, DockerSandbox] = {}
        self._started: set[str] = set()
        self._fresh: set[str] = set()  # started by us, main agent not attached yet
        #: Claimed warm sandboxes, until their connection is taken (:meth:`_connect`).
        self._preloaded: dict[str, Claim] = {}
        self.restarts = 0
        #: Warm sandboxes (:mod:`.pool`), None when off; started at the first workspace.
        self.pool: WarmPool | None = None
        self._pool_root = pool.root if pool is not None else None
        if pool is not None and pool.mode != "off":
            self.pool = WarmPool(
                PoolHooks(
                    engine=self.engine,
                    prepare=self.prepare,
                    config_for=lambda d, spec: container_config(
                        d, spec, self._runtime_volume.name, self._runtime_check.engine_runtime(spec)
                    ),
                    create=lambda c: self.engine.call("create sandbox", lambda: self._create(self.engine.client(), c)),
                    start_slot=self._slots,
                    boot=self._boot_warm,
                ),
                pool,
            )

    # -- container lifecycle -----------------------------------------------------------

    def container_config(self, ws: Path) -> dict[str, Any]:
        """The ``containers.create`` arguments for workspace ``ws`` (real path)."""
        spec = self.spec_of(ws)
        return container_config(
            ws,
            spec,
            self._runtime_volume.name,
            self._runtime_check.engine_runtime(spec),
            self.overlays.volume_for(ws),
        )

    async def _check_runtime(self, spec: SandboxSpec) -> None:
        await self._runtime_check.check(spec)

    def _slots(self) -> asyncio.Semaphore:
        if self._start_slots is None:
            self._start_slots = asyncio.Semaphore(self.max_parallel_starts)
        return self._start_slots

    async def start_pool(self) -> None:
        """Start the warm pool (no-op when off or started): its class of the backend's
        spec is filled from now on. Also done by the first workspace."""
        if self.pool is not None:
            await self.pool.start(self.spec)

    def pool_status(self) -> dict[str, Any] | None:
        """The warm pool's state (:meth:`.pool.WarmPool.status`), None when it is off."""
        return self.pool.status() if self.pool is not None else None

    @staticmethod
    async def check_pool_host(root: Path) -> str | None:
        """Whether this host lets a warm pool live at ``root`` (its shared mount made):
        None, else why not. Blocking mounts run in a thread."""
        return await asyncio.to_thread(hostmounts.make_shared, root)

    async def _remove(self, container: Any) -> None:
        """Remove a sandbox, and the slot of a warm one (its workspace's bind undone); a
        boot of its main agent under way ends (another call of this process may be in it)."""
        await self.engine.remove(container)
        self.channels.abort_boots(container.id)
        if slots.LABEL_SLOT in (container.labels or {}):
            await asyncio.to_thread(slots.release_container, container)

    async def ensure_container(self, ws: Path, *, warm: bool = True) -> Any:
        """Find this workspace's running container or start one, in one of the engine's
        start slots (``max_parallel_starts``), claimed from the warm pool where one waits
        and ``warm`` (False: a retry after a connection failed). Returns the container;
        ``name in self._fresh`` when this call started it (its main agent awaits us).

        Raises ImageNotFoundError (ImagePullError: the image could not be pulled),
        RuntimeUnavailableError, DaemonUnavailableError.
        """
        async with self._slots():
            return await self._ensure_container(ws, warm)

    async def _ensure_container(self, ws: Path, warm: bool = True) -> Any:
        """:meth:`ensure_container` in its slot."""
        spec = self.spec_of(ws)
        await self.prepare(spec)
        name = container_name(ws)
        client = await self.engine.connect()
        # A first start goes straight to the create or claim (one engine call less): the name
        # taken is its Conflict; not where none must be known to be there first (.pool.unseen).
        pool = self.pool is not None and not (warm and self.pool.unseen(name, spec) and name not in self._started)
        look_first = pool or spec.allow_root or spec.pull == "always" or bool(fork_volume_of(ws))
        for attempt in range(5):
            container: Any = await self.engine.find(name) if look_first or attempt else None
            if container is not None:
                labels = container.labels or {}
                same = (
                    labels.get(LABEL_SPEC) == spec.fingerprint()
                    and (labels.get(LABEL_WS) or slots.workspace_of(labels)) == str(ws)
                    and labels.get(LABEL_RUNTIME, "") == self._runtime_volume.name
                    and labels.get(LABEL_SECCOMP) == seccomp.digest(spec.runtime)
                    and labels.get(LABEL_MASKED) == masked_digest()
                    and seccomp_kept(container, spec.runtime)
                )
                if container.status == "running" and same:
                    self._started.add(name)
                    return container
                if container.status == "created" and same and await self.engine.started_by_peer(name):
                    continue  # another process created it and has just started it: adopt it
                # Exited (idle TTL, OOM, killed), made with other settings, or created by a
                # process that died before starting it: replace it.
                await self._remove(container)
                continue
            if spec.allow_root and owner(ws, spec)[0] == 0:
                # Its main agent would stay root with root's capabilities, and so would
                # every command of the owner: allow_root is root's alone.
                raise SandboxUnavailableError(
                    f"allow_root needs a workspace owned by another user than root (or LOOM_UID): {ws} is root's"
                )
            if ws.stat().st_uid == 0 and spec.uid is None and spec.runtime == "runc":
                log.warning(
                    "sandbox.root_workspace",
                    workspace=str(ws),
                    detail="workspace is owned by root: the sandbox runs as uid 0 with every capability "
                    "dropped; use gVisor (LOOM_RUNTIME=runsc) or userns-remap for more margin",
                )
            # A fork's tree is an overlay volume mounted at start, never a warm sandbox's bind.
            if warm and self.pool is not None and spec.pull != "always" and fork_volume_of(ws) is None:
                await self.pool.start(self.spec)
                claimed = await self.pool.claim(ws, spec, name)
                if claimed is not None:
                    self._preloaded[name] = claimed
                    self._started.add(name)
                    return claimed.container
            if spec.pull == "always":
                await self.images.ensure(spec.image, policy="always", registries=spec.registries)
            channel = channel_dir(ws, spec)
            if channel is not None:
                await asyncio.to_thread(prepare_channel_dir, channel)  # mounted: it must exist
            await self.overlays.verify(ws)  # a fork's overlay volume, never its bare mountpoint
            cfg = self.container_config(ws)
            # The create runs on in its thread when this start is cancelled (a caller closing
            # it, shutdown): what it makes is removed, never left unstarted under the name.
            create = asyncio.ensure_future(self.engine.call("create sandbox", self._create, client, cfg))
            try:
                container = await asyncio.shield(create)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await self._remove(await create)
                raise
            except ImageNotFoundError:
                # The engine does not have the image (its create answers that without asking
                # a registry): pull it as the policy says, then create again, as `docker run`
                # does. No extra engine call when the image is there, the usual case.
                if not await self.images.ensure(spec.image, policy=spec.pull, registries=spec.registries):
                    raise  # it is there, yet the engine cannot create from it: say what it said
                continue
            except SandboxUnavailableError as e:
                if "Conflict" in str(e) or "already in use" in str(e):
                    await asyncio.sleep(0.05 if attempt or look_first else 0)
                    continue  # it exists (another process created it first): adopt theirs
                raise
            if not seccomp_kept(container, spec.runtime):
                # The engine took the container but not our profile: never run in it.
                await self._remove(container)
                raise RuntimeUnavailableError(
                    "the Docker engine did not keep the sandbox's seccomp profile (HostConfig.SecurityOpt of the "
                    "created container); refusing to run"
                )
            try:
                await self.engine.call("start sandbox", container.start)
            except SandboxUnavailableError as e:
                if "marked for removal" in str(e) or "No such container" in str(e):
                    # A peer took our fresh container for a stale one: start over.
                    await asyncio.sleep(0.05)
                    continue
                await self._remove(container)
                raise
            self._started.add(name)
            self._fresh.add(name)
            log.info("sandbox.started", workspace=str(ws), container=name, runtime=spec.runtime, image=spec.image)
            return container
        raise SandboxUnavailableError(f"Could not start a sandbox for {ws}: it kept disappearing")

    @staticmethod
    def _create(client: Any, cfg: dict[str, Any]) -> Any:
        """``containers.create`` with the host settings docker-py does not name (blocking)."""
        resp = client.api.create_container(**create_args(cfg, client.api._version))
        return client.containers.get(resp["Id"])

    async def prepare(self, spec: SandboxSpec | None = None) -> None:
        """What every container needs before :meth:`container_config` can describe it:
        the runtime checked (gVisor in effect when asked for) and the agent runtime's
        volume in place. Idempotent and cheap after the first call.

        Raises RuntimeUnavailableError, ImageNotFoundError, DaemonUnavailableError.
        """
        protocol.prebuild_bundle()  # in a thread, while the engine starts the first container
        await self._check_runtime(spec or self.spec)
        await self._runtime_volume.ensure()

    async def _connect(self, ws: Path, *, after_loss: bool = False) -> AgentConnection:
        """A connection to ``ws``'s agent: its container found or started, an agent
        attached or started in it, checked, and moved to the direct channel where it
        can. Raises SandboxUnavailableError (and its kinds), SandboxLostError."""
        if after_loss:
            self.restarts += 1
            await losses.settle(self.engine, container_name(ws))
        last: Exception | None = None
        for attempt in range(2):
            container = await self.ensure_container(ws, warm=last is None)
            spec = self.spec_of(ws)
            claim = self._preloaded.pop(container.name, None)
            conn = claim.conn if claim is not None else None  # booted in the pool
            if conn is None:
                # The container's start slot is free again: its agent boots in a slot of its
                # own while the engine starts the next containers.
                if self._agent_slots is None:
                    self._agent_slots = asyncio.Semaphore(self.max_parallel_starts)
                async with self._agent_slots:
                    try:
                        if claim is not None:
                            conn = await self.channels.attach_agent(container, spec, claim.transport)
                        elif container.name in self._fresh:
                            self._fresh.discard(container.name)
                            conn = await self.channels.attach_agent(container, spec)
                        else:
                            conn = await self.channels.exec_agent(container, spec)
                    except (ImageUnusableError, RuntimeUnavailableError):
                        await self._drop(container, claim)
                        raise
                    except (SandboxLostError, SandboxUnavailableError) as e:
                        # The container died between inspect and exec (OOM, killed, TTL): replace it once.
                        last = e
                        log.warning("sandbox.agent_start_failed", workspace=str(ws), attempt=attempt, error=str(e))
                        await self._drop(container, claim)
                        self.restarts += 1
                        continue
                    if spec.runtime == "runsc":
                        await verify_gvisor(self.engine, conn, container, self._runtime_check, spec)
                        self._watch_oom(ws, container)
                    conn = await self._direct(conn, container, spec, ws)
            if claim is None:
                return conn
            try:
                return await self._claimed(ws, container, claim, conn, spec)
            except (SandboxLostError, SandboxUnavailableError) as e:
                last = e  # a peer's container won the name (adopted next), or the agent is gone
        assert last is not None
        raise last

    async def _claimed(
        self, ws: Path, container: Any, claim: Claim, conn: AgentConnection, spec: SandboxSpec
    ) -> AgentConnection:
        """``conn`` to a claimed warm sandbox, settled (:meth:`.pool.Claim.settle`). Raises
        SandboxUnavailableError when a peer made this workspace's container first,
        SandboxLostError when its agent is gone or refused its root."""
        if claim.conn is not None and spec.runtime == "runsc":
            self._watch_oom(ws, container)
        try:
            await claim.settle(conn, spec.idle_ttl, spec.agent_start_timeout)
        except (SandboxLostError, SandboxUnavailableError):
            await conn.close()
            await self._drop(container)
            raise
        return conn

    def _watch_oom(self, ws: Path, container: Any) -> None:
        """Under gVisor: the OOM kills the agent cannot see in there (:mod:`.memcg`)."""
        if (box := self._boxes.get(ws)) is not None:
            box.oom_counter = memcg.oom_counter((container.attrs.get("State") or {}).get("Pid"))

    async def _boot_warm(self, container: Any, spec: SandboxSpec, transport: Any, slot_ws: Path) -> AgentConnection:
        """A pooled sandbox's agent booted as :meth:`_connect` would at its claim
        (:attr:`.pool.PoolHooks.boot`). Raises what that raises."""
        conn = await self.channels.attach_agent(container, spec, transport, keeper=False)
        if spec.runtime == "runsc":
            await verify_gvisor(self.engine, conn, container, self._runtime_check, spec)
        return await self._direct(conn, container, spec, slot_ws)

    async def _drop(self, container: Any, claim: Claim | None = None) -> None:
        """Remove a container its connection failed in; a claimed one once its rename has
        settled (no rename may land after the removal). Best effort."""
        if claim is not None:
            await claim.named
        with contextlib.suppress(SandboxUnavailableError):
            await self._remove(container)

    async def _direct(
        self, conn: AgentConnection, container: Any, spec: SandboxSpec, ws: Path, user: tuple[int, int] | None = None
    ) -> AgentConnection:
        """``conn`` moved to the direct channel where this container has one (gVisor: the
        agent dials the worker; runc: the worker reaches the agent's socket), else as is."""
        if not spec.direct or container.name in self.channels.failed:
            return conn
        if spec.runtime == "runsc":
            if spec.channel_dir:
                return await self.channels.dial_direct(conn, container, spec, ws, user)
            return conn
        if self.channels.unreachable:
            return conn
        return await self.channels.go_direct(conn, container, spec, user)

    async def _connect_user(self, ws: Path, user: tuple[int, int]) -> AgentConnection:
        """An agent of ``ws``'s sandbox running as ``user`` (uid, gid), on the direct
        channel as the owner's agents are. Raises what :meth:`_connect` raises."""
        container = await self.ensure_container(ws)
        box = self._boxes.get(ws)
        if container.name in self._fresh:
            # Its main agent waits for this process: the box's own connection takes it (under
            # the box's lock: a connection being made now is waited for, never made twice).
            await (box.connection() if box is not None else self._connect(ws))
        spec = self.spec_of(ws)
        conn = await self.channels.exec_agent(container, spec, user)
        return await self._direct(conn, container, spec, ws, user)

    # -- SandboxBackend ------------------------------------------------------------------

    def spec_of(self, workspace: Path) -> SandboxSpec:
        """The spec ``workspace``'s sandbox is made with: its own (:meth:`configure`) or
        the backend's."""
        return self._specs.get(workspace, self.spec)

    async def configure(self, workspace: Path, spec: SandboxSpec | None) -> bool:
        """Make ``workspace``'s sandbox with ``spec`` from now on (None: the backend's
        default). A running container made with other settings is replaced at the next
        call (the workspace's files are kept). Returns True when the spec changed."""
        ws = Path(workspace).resolve()
        old = self.spec_of(ws)
        if spec is None or spec == self.spec:
            self._specs.pop(ws, None)
        else:
            self._specs[ws] = spec
        if self.spec_of(ws) == old:
            return False
        box = self._boxes.pop(ws, None)
        if box is not None:
            await box.close()  # the next get() connects to (and so replaces) the container
        return True

    async def get(self, workspace: Path) -> Sandbox:
        ws = Path(workspace).resolve()
        if not ws.is_dir():
            raise SandboxUnavailableError(f"Workspace {ws} is not a directory")
        box = self._boxes.get(ws)
        if box is None:
            spec = self.spec_of(ws)
            box = DockerSandbox(
                ws,
                lambda after_loss: self._connect(ws, after_loss=after_loss),
                io_timeout=spec.io_timeout,
                on_exec_lost=lambda: losses.reset_after_lost_exec(self.engine, self._remove, container_name(ws), ws),
            )
            box.container_name = container_name(ws)
            box.owner = owner(ws, spec)
            box.allow_root = spec.allow_root

            def user_connect(user: tuple[int, int], ws: Path = ws) -> Awaitable[AgentConnection]:
                return self._connect_user(ws, user)

            box.user_connect = user_connect
            if spec.runtime == "runsc":
                # a fork's overlay is scanned only while the engine has it mounted
                box.host_scanner = HostScanner(ws, mounted=fork_volume_of(ws) is not None)
            self._boxes[ws] = box
        return box

    async def stop(self, workspace: Path) -> bool:
        ws = Path(workspace).resolve()
        box = self._boxes.pop(ws, None)
        if box is not None:
            await box.close()
        container = await self.engine.find(container_name(ws))
        if container is None:
            return False
        await self._remove(container)
        log.info("sandbox.stopped", workspace=str(ws))
        return True

    async def freeze(self, workspace: Path, frozen: bool) -> bool:
        """Pause (the cgroup freezer, ``docker pause``) or unpause the workspace's running
        container, so a copy of its files is consistent; False when none runs.
        Raises DaemonUnavailableError."""
        container = await self.engine.find(container_name(Path(workspace).resolve()))
        if container is None or container.status not in ("running", "paused"):
            return False
        if frozen != (container.status == "paused"):
            await self.engine.call("pause sandbox", container.pause if frozen else container.unpause)
        return True

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.close()  # no warm sandbox outlives its pool
        for box in list(self._boxes.values()):
            await box.close()
        self._boxes.clear()
        await self.engine.aclose()

    # -- housekeeping (:mod:`.housekeeping`) ----------------------------------------------

    async def list_sandboxes(self) -> list[dict[str, Any]]:
        """Every container carrying our labels, running or not."""
        return await housekeeping.list_sandboxes(self.engine)

    async def gc(self, *, all_running: bool = False) -> list[str]:
        """Remove this backend's owner's (``spec.owner``) exited sandboxes, sandboxes of
        vanished workspaces or other worker versions (and every running one with
        ``all_running``); another owner's are left alone. Returns the names removed.
        Raises DaemonUnavailableError."""
        removed = await housekeeping.gc(self.engine, self.spec.owner, all_running=all_running)
        if all_running:
            await self._release_pool_root()
        return [item["name"] for item in removed]

    async def _release_pool_root(self) -> None:
        """After ``gc --all``: the pool directory's own mounts go too (see
        :func:`.housekeeping.release_pool_root`), unless this backend's pool refills."""
        if self._pool_root is not None and (self.pool is None or self.pool.size() == 0):
            await housekeeping.release_pool_root(self.engine, self._pool_root)

    async def gc_engine_wide(self, *, all_running: bool = False) -> list[dict[str, Any]]:
        """Like :meth:`gc`, for every loom sandbox on the engine, whoever made it. Returns
        the removed ones (name, status, workspace, version, owner). Raises
        DaemonUnavailableError."""
        return await housekeeping.gc(self.engine, self.spec.owner, all_running=all_running, engine_wide=True)

    async def remove_all_started(self) -> None:
        """Remove every container this backend started or adopted (tests' cleanup), after
        closing its sandboxes (a start still under way ends first)."""
        for box in list(self._boxes.values()):
            await box.close()
        self._boxes.clear()
        for name in list(self._started):
            container = await self.engine.find(name)
            if container is not None:
                await self._remove(container)
        self._started.clear()

    async def daemon_info(self) -> dict[str, Any]:
        """``docker info`` (raises DaemonUnavailableError)."""
        return await self.engine.info()

    async def runtimes(self) -> set[str]:
        """The OCI runtimes the engine has (``runc``, ``runsc``...; ``runsc`` also when
        gVisor is registered only per platform, as ``runsc-systrap``...). Raises
        DaemonUnavailableError."""
        return gvisor.runtime_names(await self.engine.info())

    async def cpu_count(self) -> int:
        """The CPUs of the engine's host (``NCPU``): the engine refuses a larger CPU
        limit. Raises DaemonUnavailableError."""
        info = await self.engine.info()
        return int(info.get("NCPU") or os.cpu_count() or 1)

    async def gvisor_runtime(self, platform: str | None = None) -> str:
        """The engine runtime gVisor runs with on ``platform`` (default: the backend's
        spec's). Raises RuntimeUnavailableError (none for it: the message says what is
        registered and how to fix it), DaemonUnavailableError."""
        info = await self.engine.info()
        return gvisor.engine_runtime(dict(info.get("Runtimes") or {}), platform or self.spec.gvisor_platform)

    async def image_exists(self) -> bool:
        """Whether the default spec's image is on the engine (raises DaemonUnavailableError)."""
        return await self.has_image(self.spec.image)

    async def has_image(self, image: str) -> bool:
        """Whether ``image`` is on the engine (nothing is pulled). Raises
        DaemonUnavailableError."""
        return await self.images.has(image)

    async def ensure_image(self, image: str) -> bool:
        """Make ``image`` be on the engine as the backend's pull policy and registries say
        (what a workspace naming it needs); True when it was pulled. Progress goes to the
        pull listeners and the calling context's :data:`~sandbox.pulls.PULL_SINK`.

        Raises ImagePullError, ImageNotFoundError (missing, and the policy is ``never``),
        DaemonUnavailableError."""
        return await self.images.ensure(image, policy=self.spec.pull, registries=self.spec.registries)

    def add_pull_listener(self, fn: Callable[[PullEvent], None]) -> Callable[[], None]:
        """Give ``fn`` the :class:`~sandbox.pulls.PullEvent` of every pull this backend
        makes (on its event loop); returns what removes it."""
        return self.images.add_listener(fn)

    async def inspect(self, workspace: Path) -> dict[str, Any] | None:
        """The raw ``docker inspect`` of a workspace's container, or None."""
        container = await self.engine.find(container_name(Path(workspace).resolve()))
        return None if container is None else dict(container.attrs)

    async def status(self, workspace: Path, *, usage: bool = True) -> dict[str, Any] | None:
        """A workspace's container as it is now, without starting one (None when it has
        none): :meth:`.housekeeping.Status.of` (``usage``: its CPU and memory in use, the
        slow part: Docker 20.10's stats answer after a second even for one sample).
        Raises DaemonUnavailableError."""
        return await self._status.of(await self.engine.find(container_name(Path(workspace).resolve())), usage=usage)
