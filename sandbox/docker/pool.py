"""Warm sandboxes: containers started before a workspace asks for one, claimed by a new
workspace and refilled in the background.

A pooled sandbox is a container made exactly as a workspace's would be (the same
:func:`~.config.container_config`, hardening, limits, user), for a *class*: the spec's
fingerprint, image, runtime, owner and the uid/gid it runs as. Its /workspace is a bind of
its slot's empty directory with ``rslave`` propagation (:mod:`.slots`,
:mod:`.hostmounts`). Its main agent is booted in the pool all the way
(:attr:`PoolHooks.boot`): the class's config (the same every claimant of the class would
send), the checks of its hello, the direct channel; what a claim would spend there (~15 ms
under runc, ~40 ms under gVisor) is spent before it. No command has run, and it has no
process, no file in /tmp or $HOME, no environment of anyone before its claimant. It is
not its container's keeper: booted without one, the agent (and its container) ends with
the worker that pooled it; its claimant makes it the keeper (the agent's ``keeper``
request), so from then on it outlives its worker for the idle TTL as every sandbox does.

A claim: the workspace bound onto the slot (and its ``.git`` protections, as the
engine's own mounts would make them), the claim recorded, the container renamed to the
workspace's name (``docker rename``: from then on every process finds it as the
workspace's own), and the agent handed to the backend, whose ``keeper`` request also
tells a runc agent to open its root again (the descriptor it opened at its config is the
slot's directory, now under the workspace's bind) and to check, by device and inode, that
it is the claimed workspace. Anything failing on the way gives the sandbox back to nobody:
it is removed and the workspace starts cold.

Under gVisor a later bind is never seen, so a claim moves the slot's directory into the
workspace's place instead (:mod:`.slots` says why and when); a gVisor sandbox waits primed
(one ``true`` run) and, with :attr:`PoolConfig.freeze`, frozen (:mod:`.freezer`) until
its claim; its worker's hold on its slot (:func:`.slots.hold`) tells a later worker
whether a frozen one outlived it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .. import protocol
from ..connection import AgentConnection
from ..errors import DaemonUnavailableError, SandboxError, SandboxUnavailableError
from ..logs import get_logger
from ..spec import SandboxSpec
from . import freezer, hostmounts, slots
from .channel import DockerExecTransport, prepare_channel_dir
from .checks import seccomp_kept
from .claim import Claim
from .config import LABEL_POOL, LABEL_WORKER, LABEL_WS, LABEL_WS_HASH, NAME_PREFIX, _git_mounts, channel_dir, owner
from .demand import Demand
from .engine import Engine

log = get_logger("sandbox.docker")

PoolMode = Literal["off", "fixed", "demand"]
#: Pooled sandboxes started at once by the refill (each also takes a start slot).
FILL_PARALLEL = 2
#: The refill waits this long after a claim (seconds): a start costs the engine and CPUs ~150 ms
#: (more under gVisor), which a claimant's first call would share (gVisor: 0.2 s took a fifth off).
CLAIM_QUIET = {"runc": 0.05, "runsc": 0.2}


@dataclass(frozen=True)
class PoolConfig:
    """``mode``: off, a fixed ``size`` per class, or sized by demand (up to ``size`` per
    class: :mod:`.demand`). ``max_total``: pooled sandboxes
    of every class together. ``root``: the pool's directory on the engine's host.
    ``freeze``: gVisor's wait frozen (:mod:`.freezer`; off: a frozen one holds the engine up)."""

    mode: PoolMode = "off"
    size: int = 4
    max_total: int = 32
    root: Path = Path("/var/lib/loom-worker/pool")
    freeze: bool = False

    @property
    def moved_root(self) -> Path:
        """Where gVisor sandboxes' slots are made: beside :attr:`root`, not below it, so
        on the mount the workspaces are on (a rename cannot leave a mount)."""
        return self.root.with_name(self.root.name + "-runsc")


def unpoolable(spec: SandboxSpec) -> str | None:
    """Why sandboxes of ``spec`` are never pooled, or None. Per-workspace paths (the
    egress gateway's socket directory, a CA bundle, the workspace's secrets) are mounts a
    pooled container would need to know at start. (A gVisor sandbox is pooled, but takes
    only an empty workspace: :func:`.slots.move_into_place`.)"""
    if spec.egress_dir or spec.ca_bundle:
        return "a workspace with egress or a CA bundle has mounts of its own"
    if spec.allow_root:
        return "allow_root sandboxes start as root"
    return None


def class_key(spec: SandboxSpec, uid: int, gid: int) -> str:
    """The class a sandbox of ``spec`` running as ``uid:gid`` belongs to. (``direct``
    too: a gVisor sandbox's agent takes its direct channel in the pool.)"""
    body = f"{spec.fingerprint()}|{spec.image}|{spec.runtime}|{spec.owner or ''}|{uid}:{gid}|{spec.direct}"
    return hashlib.sha256(body.encode()).hexdigest()[:16]


@dataclass
class _Warm:
    container: Any
    transport: DockerExecTransport
    slot: Path
    #: Its agent, booted in the pool (:attr:`PoolHooks.boot`).
    conn: AgentConnection | None = None
    #: The lock on its slot this process holds while the sandbox is the pool's (:func:`.slots.hold`).
    owner: int | None = None
    #: Its cgroup's freezer file while it waits frozen (gVisor: :mod:`.freezer`).
    frozen: Path | None = None

    @property
    def lost(self) -> bool:
        """Its agent ended (the engine killed it, ``gc``): it serves nobody."""
        return self.transport.lost is not None or (self.conn is not None and self.conn.closed)


@dataclass
class _Class:
    spec: SandboxSpec
    uid: int
    gid: int
    ready: deque[_Warm] = field(default_factory=deque)
    filling: int = 0
    demand: Demand = field(default_factory=Demand)  # its claims (demand mode)
    claims: int = 0
    misses: int = 0
    #: gVisor claims turned down by the workspace (not empty, another mount): cold starts
    #: that left the warm sandbox in the pool.
    declined: int = 0


@dataclass
class PoolHooks:
    """What the pool uses of its backend: the engine, the checks every container needs
    (:meth:`~.backend.DockerBackend.prepare`), the container's create arguments for a
    directory, the create itself, and the start slots shared with cold starts."""

    engine: Engine
    prepare: Callable[[SandboxSpec], Awaitable[None]]
    config_for: Callable[[Path, SandboxSpec], dict[str, Any]]
    create: Callable[[dict[str, Any]], Awaitable[Any]]
    start_slot: Callable[[], Any]
    #: Boot a pooled sandbox's agent (container, its spec, its attach stream, the slot's
    #: directory) as the claimant would (config, checks, direct channel), but not as the
    #: container's keeper. Raises what a connection raises; None: agents are booted by
    #: the claimant.
    boot: Callable[[Any, SandboxSpec, DockerExecTransport, Path], Awaitable[AgentConnection]] | None = None


class WarmPool:
    """The warm sandboxes of one backend. :meth:`start` once (it decides whether the host
    allows the pool at all), :meth:`claim` per new workspace, :meth:`close` at shutdown."""

    def __init__(self, hooks: PoolHooks, config: PoolConfig) -> None:
        self._hooks = hooks
        self.config = config
        self._classes: dict[str, _Class] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._fills: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None
        #: Why the pool is off on this host (None: on).
        self.disabled: str | None = None if config.mode != "off" else "off"
        self._stage = config.root / ".stage"
        self._roots = (config.root, config.moved_root)
        self.failures = 0
        self._failing = 0  # fills failed in a row (the refill's back-off)
        #: Why gVisor warm sandboxes wait unfrozen (:meth:`_freeze`), or None.
        self.freezing: str | None = None
        self._started = False
        self._quiet_until = 0.0  # (the refill waits until then: CLAIM_QUIET)
        #: The workspaces' container names on the engine when the pool started (None: not
        #: listed yet, or the listing failed), and those claimed since (:meth:`unseen`).
        self._names: set[str] | None = None

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, spec: SandboxSpec | None = None) -> None:
        """Set the pool's directory up (a shared mount) and start refilling; with
        ``spec``, its class (as the backend's own owner) is wanted from the start in fixed
        mode. Idempotent; the pool turns itself off (:attr:`disabled`) when the host
        does not allow its mounts."""
        if self._started or self.disabled:
            return
        self._started = True
        reason = await asyncio.to_thread(hostmounts.pool_mounts, *self._roots)
        if reason is not None:
            self.disabled = reason
            log.warning("sandbox.pool_off", reason=reason)
            return
        if spec is not None and self.config.mode == "fixed" and unpoolable(spec) is None:
            uid = spec.uid if spec.uid is not None else os.geteuid()
            gid = spec.gid if spec.gid is not None else (os.getegid() if spec.uid is None else uid)
            self._class(spec, uid, gid)
        self._task = asyncio.create_task(self._refill(), name="loom-warm-pool")
        self._reaper = asyncio.create_task(self._reap_dead(), name="loom-warm-pool-reap")

    def unseen(self, name: str, spec: SandboxSpec) -> bool:
        """Whether a new workspace's claim may skip looking for a container of that
        ``name`` first (one engine call less on its path): under runc, when no container had
        the name when the pool started, nor was claimed by it since. One made by another
        process meanwhile is then found by the claim's rename, which the engine refuses
        (the claimed sandbox is removed, its binds undone, and the other one adopted: as
        when a peer wins the race). Never under gVisor, whose claim moves a directory over
        the workspace's that another container may already serve."""
        return spec.runtime == "runc" and self._names is not None and name not in self._names

    async def _list_names(self) -> None:
        """:attr:`_names` from the engine (once, at start). Failing, it stays None."""
        engine = self._hooks.engine
        client = await engine.connect()
        listed = await engine.call("list sandboxes", client.api.containers, all=True, filters={"name": NAME_PREFIX})
        self._names = {n.lstrip("/") for c in listed for n in c.get("Names") or ()}

    async def _reap_dead(self) -> None:
        """Remove the warm sandboxes of this pool's directory that outlived their worker
        unclaimed, and release their slots, so that a restarted worker does not pile them
        up until ``gc``: ended ones (a worker killed with its pool: their agents end with
        it, the containers stay, exited) and running ones nobody holds (frozen gVisor
        ones cannot see their worker end: :func:`.slots.orphaned`). One being created or
        started, or waiting in a live worker's pool, is left. Never raises (logged): the
        pool goes on."""
        roots = tuple(os.path.realpath(r) + os.sep for r in (self.config.root, self.config.moved_root))

        def ours(container: Any) -> bool:  # (stats the slot: in a thread)
            slot = slots.slot_of(slots.labels_of(container))
            return (
                slot is not None
                and (os.path.realpath(slot) + os.sep).startswith(roots)
                and not slots.workspace_of(slots.labels_of(container))  # (a claimed one is its workspace's)
                and (container.status in ("exited", "dead") or slots.orphaned(slot))
            )

        try:
            engine = self._hooks.engine
            # (filtered by the engine: only warm sandboxes are listed, whatever else runs on it)
            pooled = await engine.listed("list warm sandboxes", {"label": [f"{LABEL_WORKER}=1", LABEL_POOL]})
            dead = await asyncio.to_thread(lambda: [c for c in pooled if ours(c)])
            for container in dead:  # (another data directory's pool is left to its own worker)
                try:
                    await engine.remove(container)
                except DaemonUnavailableError as e:  # (one the engine is stuck on: the others go on)
                    log.warning("sandbox.pool_reap_failed", container=container.name, error=str(e))
                    continue
                await asyncio.to_thread(slots.release_container, container)
            if dead:
                log.info("sandbox.pool_reaped", containers=len(dead))
            await self._list_names()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # (as a fill: the pool never takes the process down)
            log.warning("sandbox.pool_reap_failed", error=repr(e))

    def _class(self, spec: SandboxSpec, uid: int, gid: int) -> _Class:
        key = class_key(spec, uid, gid)
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = _Class(spec, uid, gid)
            self._wake.set()
        return cls

    def target(self, cls: _Class) -> int:
        """How many ready sandboxes ``cls`` should have now."""
        if self.config.mode == "fixed":
            return self.config.size
        return cls.demand.target(time.monotonic(), self.config.size)

    def size(self) -> int:
        """Pooled sandboxes ready or being started now, every class together."""
        return sum(len(c.ready) + c.filling for c in self._classes.values())

    async def close(self) -> None:
        """Stop refilling and remove every pooled sandbox nobody claimed."""
        task, self._task = self._task, None
        reaper, self._reaper = self._reaper, None
        tasks = [*(t for t in (task, reaper) if t is not None), *self._fills]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for cls in self._classes.values():
            while cls.ready:
                await self._discard(cls.ready.popleft())

    # -- claim -----------------------------------------------------------------------

    async def claim(self, ws: Path, spec: SandboxSpec, name: str) -> Claim | None:
        """A warm sandbox for workspace ``ws`` (real path) made with ``spec``, serving ``ws``
        at /workspace, with its agent booted (:attr:`Claim.conn`; where the pool does not
        boot agents, waiting for its config on the claim's attach stream), being renamed ``name``
        (:attr:`Claim.named`: False when a peer took the name first; the caller then
        removes it and adopts the peer's). None when there
        is none (the caller starts one cold). Never raises for the pool's own failures:
        they are logged and the sandbox removed."""
        if self.disabled or unpoolable(spec) is not None:
            return None
        uid, gid = owner(ws, spec)
        cls = self._class(spec, uid, gid)
        moved = spec.runtime != "runc"
        if moved and not await asyncio.to_thread(slots.is_empty_dir, ws):
            cls.declined += 1  # no demand either: a warm one would not have served it
            return None
        cls.demand.ask(time.monotonic())
        self._wake.set()
        while cls.ready:
            warm = cls.ready.popleft()
            quiet = time.monotonic() + CLAIM_QUIET.get(spec.runtime, CLAIM_QUIET["runsc"])
            self._quiet_until = max(self._quiet_until, quiet)
            self._wake.set()
            if warm.lost:
                await self._discard(warm)  # its agent ended (the engine killed it, gc)
                continue
            put = asyncio.ensure_future(
                asyncio.to_thread(self._move_and_thaw if moved else self._bind_workspace, warm, ws)
            )
            try:
                root = await asyncio.shield(put)
            except asyncio.CancelledError:
                # The claimant gave up (its start cancelled): this one is nobody's. Its mounts
                # are undone once the thread has made them, never before.
                with contextlib.suppress(Exception):
                    await put
                await self._discard(warm)
                raise
            except slots.Declined as e:
                # Untouched and still nobody's: it waits for the next workspace.
                cls.ready.appendleft(warm)
                cls.declined += 1
                log.info("sandbox.pool_declined", workspace=str(ws), reason=str(e))
                return None
            except OSError as e:
                # The host would not mount: this one serves nobody.
                log.info("sandbox.pool_claim_failed", workspace=str(ws), error=repr(e))
                self.failures += 1
                await self._discard(warm)
                cls.misses += 1
                return None
            # The rename (~10 ms in the engine) runs while the caller readies the agent: its
            # outcome is awaited (Claim.named) before the sandbox serves anyone.
            pool_name = warm.container.attrs.get("Name")
            named = asyncio.create_task(self._rename(warm.container, name, ws, pool_name), name="loom-warm-claim")
            if self._names is not None:
                self._names.add(name)
            warm.container.attrs["Name"] = "/" + name
            cls.claims += 1
            _let_go(warm)  # its workspace's now (the claim record): no longer the pool's
            log.info("sandbox.pool_claimed", workspace=str(ws), container=name)
            return Claim(warm.container, warm.transport, named, warm.conn, None if moved else root)
        cls.misses += 1
        return None

    async def _rename(self, container: Any, name: str, ws: Path, pool_name: str | None) -> bool:
        """Rename a claimed sandbox to its workspace's name; False when the engine refused
        (a peer made that container first), a failure: named ``pool_name`` again (its
        removal waits for its name to be free, which the peer's holds). Raises CancelledError."""
        try:
            await self._hooks.engine.call("claim sandbox", container.rename, name)
        except SandboxError as e:
            log.info("sandbox.pool_claim_failed", workspace=str(ws), error=repr(e))
            self.failures += 1
            if pool_name is not None:
                container.attrs["Name"] = pool_name
            return False
        return True

    @staticmethod
    def _move_and_thaw(warm: _Warm, ws: Path) -> None:
        """gVisor's claim: the slot's directory moved into ``ws``'s place (Declined leaves
        it waiting, frozen), then the sandbox thawed. Raises Declined, OSError."""
        slots.move_into_place(warm.slot, ws)
        if warm.frozen is not None:
            freezer.thaw(warm.frozen)
            warm.frozen = None

    def _bind_workspace(self, warm: _Warm, ws: Path) -> tuple[int, int]:
        """Record the claim and bind ``ws`` onto the slot, with the protections of its
        ``.git`` the engine's mounts would give it (:func:`~.config._git_mounts`), the
        read-only ones made read-only before they propagate. Returns the bound
        directory's ``(st_dev, st_ino)``. Raises OSError (undone)."""
        slot = warm.slot
        (slot / slots.CLAIM_FILE).write_text(str(ws))
        target = slot / "ws"
        hostmounts.bind(ws, target)
        try:
            for m in _git_mounts(ws, str(target)):
                hostmounts.bind(Path(m["Source"]), Path(m["Target"]), read_only=bool(m["ReadOnly"]), stage=self._stage)
            st = os.stat(target)
        except OSError:
            hostmounts.unbind(target)
            raise
        return st.st_dev, st.st_ino

    # -- refill ------------------------------------------------------------------------

    async def _refill(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            if now < self._quiet_until:
                await asyncio.sleep(self._quiet_until - now)
                continue
            for key, cls in list(self._classes.items()):
                dead, cls.ready = [w for w in cls.ready if w.lost], deque(w for w in cls.ready if not w.lost)
                await asyncio.gather(*map(self._discard, dead))  # (agents ended waiting, by gc: made again now)
                idle = self.config.mode == "demand" and cls.demand.idle(now)
                want = 0 if idle else self.target(cls)
                while len(cls.ready) > want and not cls.filling:
                    await self._discard(cls.ready.pop())  # demand fell: give the engine back
                while (
                    len(cls.ready) + cls.filling < want
                    and self.size() < self.config.max_total
                    and len(self._fills) < FILL_PARALLEL
                ):
                    cls.filling += 1
                    t = asyncio.create_task(self._fill(key, cls), name="loom-warm-fill")
                    self._fills.add(t)
                    t.add_done_callback(self._fills.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 1.0)

    async def _fill(self, key: str, cls: _Class) -> None:
        try:
            async with self._hooks.start_slot():
                began = time.monotonic()
                warm = await self._make(key, cls)
            cls.demand.made(time.monotonic() - began, CLAIM_QUIET.get(cls.spec.runtime, CLAIM_QUIET["runsc"]))
            cls.ready.append(warm)
            self._failing = 0
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the pool never takes the process down; cold starts go on
            self.failures, self._failing = self.failures + 1, self._failing + 1
            log.warning("sandbox.pool_fill_failed", error=repr(e))
            await asyncio.sleep(min(30.0, 0.5 * self._failing))  # (fills failing in a row: do not hammer)
        finally:
            cls.filling -= 1
            self._wake.set()

    async def _make(self, key: str, cls: _Class) -> _Warm:
        """Start one pooled sandbox of ``cls`` and boot its agent up to its config.
        Raises SandboxError, OSError."""
        spec = cls.spec
        await self._hooks.prepare(spec)
        # The started pool's mounts, made again when gone (``gc --all`` undoes them once no slot is used).
        if self._started and (undone := await asyncio.to_thread(hostmounts.pool_mounts, *self._roots)) is not None:
            raise SandboxUnavailableError(undone)
        moved = spec.runtime != "runc"
        slot = (self.config.moved_root if moved else self.config.root) / secrets.token_hex(8)
        owner = await asyncio.to_thread(slots.make, slot, cls.uid, cls.gid)
        channel: Path | None = None
        made: Any = None
        try:
            cfg = self._hooks.config_for(slot / "ws", spec)
            # gVisor's direct channel directory (mounted, so made first): the slot's own, which
            # the claimant's channel finds in the container's mounts (channel._mounted_channel).
            channel = channel_dir(slot / "ws", spec)
            if channel is not None:
                await asyncio.to_thread(prepare_channel_dir, channel)
            cfg["name"] = slots.POOL_PREFIX + slot.name
            cfg["labels"] = {
                **cfg["labels"],
                LABEL_WS: "",
                LABEL_WS_HASH: "",
                LABEL_POOL: key,
                slots.LABEL_SLOT: str(slot),
            }
            for m in cfg["mounts"]:
                if not moved and m.get("Type") == "bind" and m.get("Source") == str(slot / "ws"):
                    # Binds made on the slot later (the claim) show in the container.
                    m["BindOptions"] = {"Propagation": "rslave"}
            # The engine call runs on in its thread when this task is cancelled (the pool
            # closing): the container it makes then must not outlive the pool.
            create = asyncio.ensure_future(self._hooks.create(cfg))
            try:
                container = await asyncio.shield(create)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    made = await create
                raise
        except BaseException:
            if made is not None:  # (made as the pool closed: removed with its slot)
                with contextlib.suppress(Exception):
                    await self._discard(_Warm(made, None, slot, owner=owner))  # type: ignore[arg-type]
            else:
                await asyncio.to_thread(slots.abandon, slot, owner, channel)
            raise
        engine = self._hooks.engine
        warm = _Warm(container, None, slot, owner=owner)  # type: ignore[arg-type]
        try:
            if not seccomp_kept(container, spec.runtime):
                raise SandboxError("the engine did not keep the sandbox's seccomp profile")
            # (attached before the start: nothing the agent writes is missed)
            warm.transport = await DockerExecTransport.open(*await engine.attach(container.id, "attach pooled sandbox"))
            await engine.call("start pooled sandbox", container.start)
            # Its pid now, so the claim's direct channel need not ask the engine for it.
            await engine.call("inspect pooled sandbox", container.reload)
            # The agent's code now, and then (where the backend boots it) its config, checks
            # and direct channel: at claim only its keeper request is left to send.
            if not protocol.bundle_built():
                await asyncio.to_thread(protocol.agent_bundle)  # (compiled once: not on the loop)
            await warm.transport.write(protocol.agent_bundle())
            if self._hooks.boot is not None:
                warm.conn = await self._hooks.boot(container, spec, warm.transport, slot / "ws")
            if moved and warm.conn is not None:
                # gVisor's first process in a sandbox costs ~10 ms more than later ones (its
                # kernel loads sh): spent here, not by the claimant; it leaves nothing.
                await warm.conn.request("exec", {"command": "true", "timeout": 30}, timeout=60)
            if moved and self.config.freeze and self.freezing is None:
                warm.frozen = await asyncio.to_thread(self._freeze, container)
        except BaseException:
            await self._discard(warm)
            raise
        return warm

    def _freeze(self, container: Any) -> Path | None:
        """Freeze a booted gVisor sandbox while it waits (:mod:`.freezer`); its freezer file,
        or None when this host does not let us (:attr:`freezing` says why). Blocking."""
        path = freezer.of_pid((container.attrs.get("State") or {}).get("Pid"))
        try:
            if path is None:
                raise OSError("its cgroup's freezer is not found from here")
            freezer.freeze(path)
        except OSError as e:
            self.freezing = f"gVisor warm sandboxes wait unfrozen: {e}"
            log.info("sandbox.pool_freeze_off", reason=self.freezing)
            return None
        return path

    async def _discard(self, warm: _Warm) -> None:
        """Remove a pooled sandbox and its slot (best effort; a frozen one is thawed by
        the removal: :meth:`.engine.Engine.remove`)."""
        if warm.conn is not None:
            with contextlib.suppress(Exception):
                await warm.conn.close("warm sandbox discarded")
        if warm.transport is not None:
            with contextlib.suppress(Exception):
                await warm.transport.close()
        with contextlib.suppress(SandboxError):
            await self._hooks.engine.remove(warm.container)
        await asyncio.to_thread(slots.release_container, warm.container)
        _let_go(warm)

    # -- reporting -------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The pool as ``doctor`` and the metrics show it."""
        return {
            "mode": self.config.mode,
            "enabled": self.disabled is None,
            "disabled": self.disabled,
            "size": self.config.size,
            "max_total": self.config.max_total,
            "ready": sum(not w.lost for c in self._classes.values() for w in c.ready),
            "frozen": sum(w.frozen is not None for c in self._classes.values() for w in c.ready),
            "starting": sum(c.filling for c in self._classes.values()),
            "claims": sum(c.claims for c in self._classes.values()),
            "misses": sum(c.misses for c in self._classes.values()),
            "declined": sum(c.declined for c in self._classes.values()),
            "failures": self.failures,
            "classes": {
                key: {
                    "image": c.spec.image,
                    "runtime": c.spec.runtime,
                    "user": f"{c.uid}:{c.gid}",
                    "ready": sum(not w.lost for w in c.ready),
                    "target": self.target(c),
                    # (what auto sizes by: one warm sandbox's make and the refill's pause)
                    "refill_ms": round(c.demand.refill_s * 1000),
                    "claims": c.claims,
                    "misses": c.misses,
                    "declined": c.declined,
                }
                for key, c in self._classes.items()
            },
        }


def _let_go(warm: _Warm) -> None:
    """Close ``warm``'s hold on its slot (claimed, or removed)."""
    fd, warm.owner = warm.owner, None
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
