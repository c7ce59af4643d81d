"""The Docker backend: the only module that imports the Docker SDK.

One container per workspace directory, named after the hash of its real path, so every
worker process (a CLI call, a server) finds and reuses the same one; a creation race
between two processes ends in a 409 for one of them, which then adopts the winner's
container. Each process talks to its own agent, started with one ``docker exec`` per
connection and then kept open: a request costs a round trip over that attached stream
(~0.2 ms), not a ``docker exec`` (~40 ms).

Blocking SDK calls run in threads (``asyncio.to_thread``); idempotent daemon calls
(inspect, create, start, info) are retried with tenacity; a command is never retried.
Docker errors are translated into :mod:`sandbox.errors` here and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import socket
import stat as statmod
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import docker
import docker.errors
from docker.types import Mount
from requests.exceptions import ConnectionError as RequestsConnectionError
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from . import __version__, protocol, users
from .base import ExecResult, Sandbox, SandboxBackend, TreeRemoval
from .client import AgentSandbox, agent_info
from .connection import AgentConnection, SocketTransport, StreamProtocol, StreamTransport
from .errors import (
    DaemonUnavailableError,
    ImageNotFoundError,
    ImageUnusableError,
    RuntimeUnavailableError,
    SandboxError,
    SandboxLostError,
    SandboxUnavailableError,
    UserUnsupportedError,
)
from .handover import FdChannel, take_fd_channel
from .hostscan import HostScanner
from .identity import workspace_key
from .logs import get_logger
from .spec import (
    ACTIVITY_FILE,
    AGENT_COMMAND,
    CA_BUNDLE_PATH,
    EGRESS_MOUNT,
    HOME_DIR,
    LABEL_PREFIX,
    ROOT_CAPABILITIES,
    RUNTIME_MOUNT,
    WORKSPACE_MOUNT,
    SandboxSpec,
)

log = get_logger("sandbox.docker")
T = TypeVar("T")

LABEL_WORKER = f"{LABEL_PREFIX}.worker"
LABEL_WS = f"{LABEL_PREFIX}.workspace"
LABEL_WS_HASH = f"{LABEL_PREFIX}.workspace-hash"
LABEL_VERSION = f"{LABEL_PREFIX}.version"
LABEL_SPEC = f"{LABEL_PREFIX}.spec"
LABEL_RUNTIME = f"{LABEL_PREFIX}.agent-runtime"
LABEL_PIDS = f"{LABEL_PREFIX}.pids"  # the configured limit (the engine's differs under gVisor)


def _int_label(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def container_name(workspace: Path) -> str:
    return f"loom-sbx-{workspace_key(workspace)}"


def _transient(exc: BaseException) -> bool:
    """Daemon hiccups worth retrying: connection errors and 5xx, never 4xx."""
    if isinstance(exc, RequestsConnectionError):
        return True
    if isinstance(exc, docker.errors.APIError):
        code = exc.status_code or 0
        return code >= 500 and "No such" not in str(exc)
    return False


_retry = retry(
    retry=retry_if_exception(_transient),
    stop=stop_after_attempt(4),
    wait=wait_exponential(multiplier=0.1, max=2.0),
    reraise=True,
)


def _translate(exc: Exception, what: str) -> Exception:
    if isinstance(exc, docker.errors.ImageNotFound):
        return ImageNotFoundError(
            f"{what}: image not found ({exc.explanation}). The project's images are built by scripts/setup "
            "(or `loom-worker build-image`); an image of your own must be on this engine: `docker build -t NAME .` "
            "or `docker load -i FILE` (no registry is pulled from)"
        )
    if isinstance(exc, RequestsConnectionError | docker.errors.DockerException) and not isinstance(
        exc, docker.errors.APIError
    ):
        return DaemonUnavailableError(f"{what}: the Docker daemon does not answer ({exc})")
    if isinstance(exc, docker.errors.APIError):
        return SandboxUnavailableError(f"{what}: {exc.explanation or exc}")
    return SandboxUnavailableError(f"{what}: {exc}")


class _AttachProtocol(StreamProtocol):
    """The attach stream: Docker's frames are demuxed as they arrive and handed on."""

    def __init__(self) -> None:
        super().__init__()
        self.demux = protocol.Demuxer()

    def buffer_updated(self, nbytes: int) -> None:
        # The demuxer copies what it keeps: the buffer is reused by the next read.
        out, err = self.demux.feed(self._buffer[:nbytes])
        if out or err:
            self.feed.data(out, err)


class DockerExecTransport(StreamTransport):
    """An attached ``docker exec`` stream (hijacked HTTP connection) on an
    ``asyncio.Protocol`` that pushes each response to the connection as it arrives
    (see :class:`~sandbox.connection.ProtocolFeed`)."""

    def __init__(self, sock_io: Any, transport: asyncio.Transport, proto: _AttachProtocol) -> None:
        super().__init__(transport, proto)
        self._keep = sock_io  # keeps the HTTP response (and so the socket) alive

    @classmethod
    async def open(cls, sock_io: Any) -> DockerExecTransport:
        raw = getattr(sock_io, "_sock", sock_io)
        if not isinstance(raw, socket.socket):
            raise SandboxUnavailableError("Docker endpoint gives no plain socket (TLS/SSH hosts are not supported)")
        raw.setblocking(False)
        transport, proto = await asyncio.get_running_loop().create_connection(_AttachProtocol, sock=raw)
        return cls(sock_io, cast(asyncio.Transport, transport), proto)

    async def close(self) -> None:
        await super().close()
        with contextlib.suppress(OSError):
            self._keep.close()


_AGENT_SOCKET = re.compile(r"/tmp/(loom-direct-[A-Za-z0-9_]{1,64})/s")


async def connect_agent_socket(pid: int, path: str) -> SocketTransport:
    """Connect to the agent's socket at ``path`` inside the container whose process
    ``pid`` (host pid namespace) is given, without following any link the sandbox could
    have planted on the way.

    A command in the container runs as the agent's uid, so between the agent's offer and
    this connect it could swap the directory or the socket for a symlink, say to
    ``/var/run/docker.sock``: resolved from the host, an absolute link leaves the
    container. So the path is walked from ``/proc/<pid>/root`` one component at a time
    with ``O_NOFOLLOW``, the last one must be a socket, and the connect goes through
    ``/proc/self/fd`` to exactly that inode. (The handshake's secret would expose a
    foreign listener anyway; this keeps a root worker from even connecting to one.)

    Raises OSError when the path is malformed, unreachable, a link, or not a socket.
    """
    with _agent_socket_path(pid, path) as safe:
        return await SocketTransport.connect(safe)


async def connect_fd_channel(pid: int, path: str) -> FdChannel:
    """Connect to the agent's fd channel at ``path`` (a ``SOCK_SEQPACKET`` socket; see
    ``sandbox/agent/tunnel.py``), walked as :func:`connect_agent_socket` walks it.
    Raises OSError as it does."""
    with _agent_socket_path(pid, path) as safe:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, safe)
        except OSError:
            sock.close()
            raise
        return FdChannel(sock)


@contextlib.contextmanager
def _agent_socket_path(pid: int, path: str) -> Iterator[str]:
    """A ``/proc/self/fd/N`` path to exactly the socket inode at ``path`` in the container,
    valid inside the ``with``. Raises OSError (see :func:`connect_agent_socket`)."""
    m = _AGENT_SOCKET.fullmatch(path)
    if m is None:
        raise OSError(errno.EINVAL, "unexpected agent socket path", path)
    fds: list[int] = []
    try:
        fds.append(os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        for name in ("tmp", m.group(1)):
            fds.append(os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
        fds.append(os.open("s", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
        if not statmod.S_ISSOCK(os.fstat(fds[-1]).st_mode):
            raise OSError(errno.ENOTSOCK, "the agent's socket is not a socket", path)
        yield f"/proc/self/fd/{fds[-1]}"
    finally:
        for fd in fds:
            os.close(fd)


class DockerSandbox(AgentSandbox):
    """An :class:`AgentSandbox` that knows its container (for tests and diagnostics).

    With ``host_scanner`` (gVisor sandboxes) scans of the workspace root and the removal of
    whole trees run on the host (see :mod:`sandbox.hostscan`): seconds in the sandbox,
    milliseconds here.
    """

    container_name: str
    host_scanner: HostScanner | None = None
    #: The workspace owner (uid, gid), whether root may run commands here, and how an
    #: agent of another user is started (set by the backend; see :meth:`as_user`).
    owner: tuple[int, int] = (-1, -1)
    allow_root: bool = False
    user_connect: Callable[[tuple[int, int]], Awaitable[AgentConnection]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Agents of other users, kept for their next commands (closed with this one).
        self._users: dict[tuple[int, int], AgentSandbox] = {}

    async def _scan(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        scanner = self.host_scanner
        if scanner is not None and req.get("path") == ".":
            try:
                return await asyncio.to_thread(scanner.scan, req)
            except (OSError, RecursionError) as e:
                # The agent's full walk answers instead (slower, same result).
                log.warning("sandbox.host_scan_failed", workspace=str(self.workspace), error=repr(e))
        return await super()._scan(req, timeout)

    async def remove_tree(self, path: str) -> TreeRemoval:
        scanner = self.host_scanner
        if scanner is not None:
            try:
                removed, (files, dirs, size) = await asyncio.to_thread(scanner.remove_tree, path)
                return TreeRemoval(removed=removed, files=files, dirs=dirs, bytes=size)
            except (OSError, ValueError, RecursionError) as e:
                # The agent removes what is left (slower, same result).
                log.info("sandbox.host_remove_fallback", workspace=str(self.workspace), error=repr(e))
        return await super().remove_tree(path)

    async def as_user(self, user: str) -> Sandbox | ExecResult:
        if not users.valid(user):
            raise UserUnsupportedError(f"{user!r} is not a user name or uid[:gid]")
        passwd = await self.read_path("/etc/passwd", max_bytes=4 << 20)
        found = users.resolve(user, passwd.data.decode("utf-8", "replace"))
        if found is None:
            message = users.NOT_FOUND.format(user=user) + "\n"
            return ExecResult(126, b"", message.encode(), "exit", 0.0, False, launch_error="user")
        if found == self.owner:
            return self
        if found[0] == 0 and not self.allow_root:
            raise UserUnsupportedError(
                f"this workspace does not run commands as root ({user}): its settings would have to allow it "
                "(allow_root: a writable root file system and the capabilities adduser needs; see docs/harness.md)"
            )
        box = self._users.get(found)
        if box is None:
            uid_gid: tuple[int, int] = found

            def connect(_lost: bool) -> Awaitable[AgentConnection]:
                return self.user_connect(uid_gid)

            box = self._users[found] = AgentSandbox(self.workspace, connect, io_timeout=self._io_timeout)
        return box

    async def close(self) -> None:
        if self.host_scanner is not None:
            self.host_scanner.close()
        for box in list(self._users.values()):
            await box.close()
        self._users.clear()
        await super().close()


class DockerBackend(SandboxBackend):
    """Per-workspace hardened containers on a Docker engine."""

    def __init__(
        self,
        spec: SandboxSpec | None = None,
        *,
        worker_id: str | None = None,
        base_url: str | None = None,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.spec = spec or SandboxSpec()
        #: Per-workspace specs (:meth:`configure`); the others get :attr:`spec`.
        self._specs: dict[Path, SandboxSpec] = {}
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self._base_url = base_url
        self._client_factory = client_factory
        self._client: Any = None
        self._boxes: dict[Path, DockerSandbox] = {}
        self._locks: dict[Path, asyncio.Lock] = {}
        self._started: set[str] = set()
        self._fresh: set[str] = set()  # started by us, main agent not attached yet
        self._runsc_checked = False
        self._runsc_uds = False
        self._runtime_volume: str | None = None
        self._runtime_lock = asyncio.Lock()
        # The agents' direct channel: unreachable from this process at all (no access to
        # /proc/<pid>/root), or failed its handshake in these containers (possibly a
        # command interfering): those stay on the attach stream.
        self._direct_unreachable = False
        self._direct_failed: set[str] = set()
        self.restarts = 0
        self._cpu_seen: dict[str, tuple[int, float]] = {}  # container id -> (CPU ns, monotonic s)

    # -- docker client ---------------------------------------------------------------

    def _docker(self) -> Any:
        if self._client is None:
            try:
                if self._client_factory is not None:
                    self._client = self._client_factory()
                elif self._base_url:
                    self._client = docker.DockerClient(base_url=self._base_url, timeout=60)
                else:
                    self._client = docker.from_env(timeout=60)
            except docker.errors.DockerException as e:
                raise DaemonUnavailableError(f"Cannot reach the Docker daemon: {e}") from e
        return self._client

    async def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def run() -> T:
            return _retry(fn)(*args, **kwargs)

        try:
            return await asyncio.to_thread(run)
        except (docker.errors.DockerException, RequestsConnectionError) as e:
            raise _translate(e, what) from e

    # -- container lifecycle -----------------------------------------------------------

    def _owner(self, ws: Path) -> tuple[int, int]:
        st = ws.stat()
        spec = self.spec_of(ws)
        uid = spec.uid if spec.uid is not None else st.st_uid
        gid = spec.gid if spec.gid is not None else (st.st_gid if spec.uid is None else uid)
        return uid, gid

    def _mounts(self, ws: Path) -> list[Mount]:
        mounts = [Mount(target=WORKSPACE_MOUNT, source=str(ws), type="bind", read_only=False)]
        if self._runtime_volume:
            mounts.append(Mount(target=RUNTIME_MOUNT, source=self._runtime_volume, type="volume", read_only=True))
        spec = self.spec_of(ws)
        if spec.ca_bundle:
            mounts.append(Mount(target=CA_BUNDLE_PATH, source=spec.ca_bundle, type="bind", read_only=True))
        if spec.egress_dir:
            # The gateway's socket (its directory, so a restarted gateway's new socket shows)
            # and the resolv.conf naming the agent's stub resolver; both read-only.
            mounts.append(Mount(target=EGRESS_MOUNT, source=spec.egress_dir, type="bind", read_only=True))
            mounts.append(
                Mount(target="/etc/resolv.conf", source=f"{spec.egress_dir}/resolv.conf", type="bind", read_only=True)
            )
        # Git runs hooks and honours config (core.fsmonitor, core.hooksPath, ...) when the
        # host later uses the repository: the sandbox must not be able to plant them. Both
        # are mounted read-only, and .git itself is bound onto itself so that it is a mount
        # point: renaming or removing it (to put a fresh .git with hooks in its place) fails
        # with EBUSY. Only real entries inside the workspace qualify, never a link out of it.
        git = ws / ".git"
        try:
            git_st = os.lstat(git)
        except OSError:
            return mounts
        if not statmod.S_ISDIR(git_st.st_mode):
            return mounts
        mounts.append(Mount(target=f"{WORKSPACE_MOUNT}/.git", source=str(git), type="bind", read_only=False))
        for rel in (".git/hooks", ".git/config"):
            p = ws / rel
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if statmod.S_ISLNK(st.st_mode) or not p.resolve().is_relative_to(ws):
                continue
            mounts.append(Mount(target=f"{WORKSPACE_MOUNT}/{rel}", source=str(p), type="bind", read_only=True))
        return mounts

    def container_config(self, ws: Path) -> dict[str, Any]:
        """The ``containers.create`` arguments for workspace ``ws`` (real path)."""
        uid, gid = self._owner(ws)
        spec = self.spec_of(ws)
        # exec said outright: Docker mounts a tmpfs noexec unless told, and agents run what
        # they put in /tmp and $HOME (a venv, pip --user scripts, test binaries, npx caches)
        tmpfs_opts = "rw,exec,nosuid,nodev"
        return {
            "image": spec.image,
            "name": container_name(ws),
            # The main process is an agent too: the process that starts the container talks
            # to it over the attach stream (no `docker exec`, and its Python boots while the
            # engine finishes the start); once that client goes (StdinOnce), it stays as the
            # keeper that ends the container after the idle TTL. Other processes exec their own.
            # The agent runs from the runtime volume whatever the image holds; the image's
            # own ENTRYPOINT must not wrap it (an entrypoint set here also drops its CMD).
            "entrypoint": [*AGENT_COMMAND, protocol.BOOTSTRAP],
            "stdin_open": True,
            "detach": False,  # with stdin_open: StdinOnce, see above
            # Agent traffic (file contents!) must not end up in the engine's container logs.
            "log_config": docker.types.LogConfig(type="none"),
            "user": f"{uid}:{gid}",
            "working_dir": WORKSPACE_MOUNT,
            "environment": spec.environment(uid),
            "labels": {
                LABEL_WORKER: "1",
                LABEL_WS: str(ws),
                LABEL_WS_HASH: workspace_key(ws),
                LABEL_VERSION: __version__,
                LABEL_SPEC: spec.fingerprint(),
                LABEL_RUNTIME: self._runtime_volume or "",
                LABEL_PIDS: str(spec.pids),
            },
            "hostname": "sandbox",
            "network_mode": "none",
            # allow_root (off by default): the container's user is root, so that an agent
            # started for root gets ROOT_CAPABILITIES (the engine gives an exec process
            # capabilities only in a container whose user is root); its main agent drops
            # to the owner at once (setuid: the kernel clears its capabilities), and
            # every other process of the owner is started as the owner, with none.
            **({"user": "0:0", "cap_add": list(ROOT_CAPABILITIES)} if spec.allow_root else {}),
            "runtime": spec.runtime,
            "nano_cpus": int(spec.cpus * 1e9),
            "mem_limit": spec.memory,
            "memswap_limit": spec.memory,
            "pids_limit": spec.host_pids_limit(),
            "read_only": not spec.allow_root,  # allow_root: adduser writes /etc
            "tmpfs": {
                "/tmp": f"{tmpfs_opts},size={spec.tmp_size},mode=1777",
                HOME_DIR: f"{tmpfs_opts},size={spec.home_size},mode=0700,uid={uid},gid={gid}",
            },
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "init": True,
            "privileged": False,
            "ipc_mode": "private",
            "mounts": self._mounts(ws),
            "ulimits": [
                docker.types.Ulimit(name="core", soft=0, hard=0),
                docker.types.Ulimit(name="fsize", soft=spec.max_file_size, hard=spec.max_file_size),
            ],
            "tty": False,
            # With egress the agent's relay listens on the sandbox's own loopback on ports 53,
            # 80 and 443 (no capability needed: the sandbox's network namespace has nothing
            # else to protect).
            **({"sysctls": {"net.ipv4.ip_unprivileged_port_start": "0"}} if spec.egress_dir else {}),
        }

    async def _check_runtime(self, spec: SandboxSpec) -> None:
        if spec.runtime != "runsc" or (self._runsc_checked and (self._runsc_uds or not spec.egress_dir)):
            return
        info = await self._call("docker info", lambda: self._docker().info())
        runsc = (info.get("Runtimes") or {}).get("runsc") or {}
        args = " ".join(runsc.get("runtimeArgs") or []) if isinstance(runsc, dict) else ""
        self._runsc_uds = "--host-uds=open" in args or "--host-uds=all" in args
        if spec.egress_dir and runsc and not self._runsc_uds:
            raise RuntimeUnavailableError(
                "this workspace may reach the network, but the engine's runsc runtime is not registered with "
                "--host-uds=open, so its sandbox could not reach the egress gateway's socket. Run scripts/setup "
                "(it registers runsc with that flag in /etc/docker/daemon.json), or use LOOM_RUNTIME=runc."
            )
        if "runsc" not in (info.get("Runtimes") or {}):
            raise RuntimeUnavailableError(
                "gVisor (runsc) was requested but the Docker engine has no 'runsc' runtime registered; "
                "refusing to run without it. Run scripts/setup (it installs the runsc this "
                "project needs, not bookworm's, whose statx breaks `ls -l`, and registers it in "
                "/etc/docker/daemon.json), or set LOOM_RUNTIME=runc."
            )
        self._runsc_checked = True

    async def ensure_container(self, ws: Path) -> Any:
        """Find this workspace's running container or start one. Returns the container;
        ``name in self._fresh`` when this call started it (its main agent awaits us).

        Raises ImageNotFoundError, RuntimeUnavailableError, DaemonUnavailableError.
        """
        spec = self.spec_of(ws)
        await self.prepare(spec)
        name = container_name(ws)
        client = self._docker()
        for _attempt in range(5):
            container = await self._find(name)
            if container is not None:
                labels = container.labels or {}
                same = (
                    labels.get(LABEL_SPEC) == spec.fingerprint()
                    and labels.get(LABEL_WS) == str(ws)
                    and labels.get(LABEL_RUNTIME, "") == self._runtime_volume
                )
                if container.status == "running" and same:
                    self._started.add(name)
                    return container
                if container.status == "created" and same and await self._started_by_peer(name):
                    continue  # another process created it and has just started it: adopt it
                # Exited (idle TTL, OOM, killed), made with other settings, or created by a
                # process that died before starting it: replace it.
                await self._remove(container)
                continue
            if spec.allow_root and self._owner(ws)[0] == 0:
                # Its main agent would stay root with root's capabilities, and so would
                # every command of the owner: allow_root is root's alone.
                raise SandboxUnavailableError(
                    f"allow_root needs a workspace owned by another user than root (or LOOM_UID): {ws} is root's"
                )
            if ws.stat().st_uid == 0 and spec.uid is None:
                log.warning(
                    "sandbox.root_workspace",
                    workspace=str(ws),
                    detail="workspace is owned by root: the sandbox runs as uid 0 with every capability "
                    "dropped; use gVisor (LOOM_RUNTIME=runsc) or userns-remap for more margin",
                )
            cfg = self.container_config(ws)
            try:
                container = await self._call("create sandbox", client.containers.create, **cfg)
            except SandboxUnavailableError as e:
                if "Conflict" in str(e) or "already in use" in str(e):
                    await asyncio.sleep(0.05)
                    continue  # another process created it first: adopt theirs
                raise
            try:
                await self._call("start sandbox", container.start)
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

    async def prepare(self, spec: SandboxSpec | None = None) -> None:
        """What every container needs before :meth:`container_config` can describe it:
        the runtime checked (gVisor in effect when asked for) and the agent runtime's
        volume in place. Idempotent and cheap after the first call.

        Raises RuntimeUnavailableError, ImageNotFoundError, DaemonUnavailableError.
        """
        await self._check_runtime(spec or self.spec)
        await self._ensure_runtime_volume()

    async def _ensure_runtime_volume(self) -> None:
        """Make sure the agent runtime of :attr:`SandboxSpec.agent_runtime_image` is in a
        volume (``loom-agent-runtime-<image id>``), once per image version: the engine
        fills an empty named volume from the image when a container first mounts it, so
        creating (never starting) one container does the copy. Several workers may race
        here; volume create is idempotent and the copy happens once.

        Raises ImageNotFoundError (the runtime image is not built), DaemonUnavailableError.
        """
        if self._runtime_volume is not None:
            return
        async with self._runtime_lock:
            if self._runtime_volume is not None:
                return
            client = self._docker()
            image = await self._call(
                "agent runtime image " + self.spec.agent_runtime_image, client.images.get, self.spec.agent_runtime_image
            )
            volume = "loom-agent-runtime-" + image.id.split(":")[-1][:12]

            def fill() -> None:
                try:
                    client.volumes.get(volume)
                    return
                except docker.errors.NotFound:
                    pass
                client.volumes.create(volume, labels={LABEL_WORKER: "1", LABEL_RUNTIME: image.id})
                helper = client.containers.create(
                    image.id,
                    command=["/opt/loom-runtime/lib/loader"],
                    mounts=[Mount(target="/opt/loom-runtime", source=volume, type="volume")],
                    network_mode="none",
                    labels={LABEL_WORKER: "1"},
                )
                helper.remove(force=True)

            await self._call("fill the agent runtime volume", fill)
            self._runtime_volume = volume

    async def _started_by_peer(self, name: str, wait: float = 5.0) -> bool:
        """A container of ours sits in "created": a peer process made it and is about to
        start it (create and start are two engine calls). Wait up to ``wait`` seconds for
        it to run. False when it does not (its creator died in between) or it is gone."""
        deadline = asyncio.get_running_loop().time() + wait
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
            container = await self._find(name)
            if container is None:
                return True  # gone: the caller's next round creates it
            if container.status != "created":
                return container.status == "running"
        return False

    async def _find(self, name: str) -> Any:
        client = self._docker()

        def get() -> Any:
            try:
                return client.containers.get(name)
            except docker.errors.NotFound:
                return None

        return await self._call("inspect sandbox", get)

    async def _remove(self, container: Any) -> None:
        def rm() -> None:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    raise

        await self._call("remove sandbox", rm)
        # removal is asynchronous on the daemon side; wait until the name is free
        for _ in range(50):
            if await self._find(container.name) is None:
                return
            await asyncio.sleep(0.05)

    async def _attach_agent(self, container: Any, spec: SandboxSpec) -> AgentConnection:
        """Talk to the container's main process (an agent waiting for its source)."""
        api = self._docker().api

        def attach() -> Any:
            params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            return api.attach_socket(container.id, params=params)

        sock_io = await self._call("attach sandbox agent", attach)
        transport = await DockerExecTransport.open(sock_io)
        conn = AgentConnection(transport, label=container.name)
        hello = await conn.start(
            {
                "root": WORKSPACE_MOUNT,
                "activity_file": ACTIVITY_FILE,
                "keeper_ttl": spec.idle_ttl,
                # allow_root: the container's main process starts as root; the agent
                # becomes the owner before anything else.
                **({"run_as": list(self._owner(Path(container.labels[LABEL_WS])))} if spec.allow_root else {}),
                **spec.agent_config(),
            },
            timeout=spec.agent_start_timeout,
        )
        await self._check_image(conn, hello, spec)
        return conn

    async def _check_image(self, conn: AgentConnection, hello: dict[str, Any], spec: SandboxSpec) -> None:
        """Refuse an image the tools cannot work in, at once and saying why (the agent
        itself runs in any image). Raises ImageUnusableError."""
        if hello.get("shell") is False:
            await conn.close()
            raise ImageUnusableError(
                f"image {spec.image} has no /bin/sh: shell_execute runs commands with the image's own "
                "/bin/sh, so this image cannot be a sandbox. Add a shell to it (for example busybox) or use "
                "another image."
            )

    async def _exec_agent(
        self, container: Any, spec: SandboxSpec, user: tuple[int, int] | None = None
    ) -> AgentConnection:
        """An agent started in ``container`` with ``docker exec``: as the workspace owner,
        or as ``user`` (uid, gid: a harness's command as another user, see
        :meth:`DockerSandbox.as_user`), from ``/`` (another user may not enter the
        workspace)."""
        api = self._docker().api
        ws = Path(container.labels[LABEL_WS])
        uid, gid = user if user is not None else self._owner(ws)

        def start() -> Any:
            ex = api.exec_create(
                container.id,
                [*AGENT_COMMAND, protocol.BOOTSTRAP],
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                workdir=WORKSPACE_MOUNT if user is None else "/",
                user=f"{uid}:{gid}",  # always said: with allow_root the container's user is root
            )
            return api.exec_start(ex["Id"], socket=True)

        sock_io = await self._call("start sandbox agent", start)
        transport = await DockerExecTransport.open(sock_io)
        conn = AgentConnection(transport, label=container.name)
        config = {"root": WORKSPACE_MOUNT, "activity_file": ACTIVITY_FILE, **spec.agent_config()}
        if user is not None:
            config["as_user"] = True
        hello = await conn.start(config, timeout=spec.agent_start_timeout)
        await self._check_image(conn, hello, spec)
        return conn

    async def _connect_user(self, ws: Path, user: tuple[int, int]) -> AgentConnection:
        """An agent of ``ws``'s sandbox running as ``user`` (uid, gid). Raises what
        :meth:`_connect` raises."""
        container = await self.ensure_container(ws)
        if container.name in self._fresh:
            # Its main agent waits for this process: attach it first.
            await self._connect(ws)
        return await self._exec_agent(container, self.spec_of(ws), user)

    async def _settle(self, ws: Path) -> None:
        """After a lost connection: if the container is dying (OOM, keeper killed), wait
        until the engine says so, so the reconnect replaces it instead of exec-ing into a
        container that is about to vanish."""
        for _ in range(10):
            container = await self._find(container_name(ws))
            if container is None or container.status != "running":
                return
            await asyncio.sleep(0.1)

    async def _connect(self, ws: Path, *, after_loss: bool = False) -> AgentConnection:
        if after_loss:
            self.restarts += 1
            await self._settle(ws)
        last: Exception | None = None
        for attempt in range(2):
            container = await self.ensure_container(ws)
            spec = self.spec_of(ws)
            try:
                if container.name in self._fresh:
                    self._fresh.discard(container.name)
                    conn = await self._attach_agent(container, spec)
                else:
                    conn = await self._exec_agent(container, spec)
            except ImageUnusableError:
                with contextlib.suppress(SandboxUnavailableError):
                    await self._remove(container)
                raise
            except (SandboxLostError, SandboxUnavailableError) as e:
                # The container died between inspect and exec (OOM, killed, TTL): replace it once.
                last = e
                log.warning("sandbox.agent_start_failed", workspace=str(ws), attempt=attempt, error=str(e))
                with contextlib.suppress(SandboxUnavailableError):
                    await self._remove(container)
                self.restarts += 1
                continue
            if spec.runtime == "runsc":
                await self._verify_gvisor(conn, container)
            elif spec.direct and not self._direct_unreachable and container.name not in self._direct_failed:
                conn = await self._go_direct(conn, container, spec)
            return conn
        assert last is not None
        raise last

    async def _go_direct(self, conn: AgentConnection, container: Any, spec: SandboxSpec) -> AgentConnection:
        """Move ``conn`` to the agent's direct channel: a unix socket on the container's
        /tmp, reached through ``/proc/<pid>/root`` (~0.04 ms per round trip instead of
        ~0.4 ms through the engine). Stays on the attach stream when that path is not
        reachable (a worker without ptrace-read access to the container, or inside
        another pid namespace) and from then on stops trying. gVisor never gets here:
        its /tmp lives inside the sandbox kernel.

        Raises SandboxLostError/SandboxUnavailableError only when starting a plain
        replacement agent fails as well.
        """
        pid = (container.attrs.get("State") or {}).get("Pid") or 0
        if not pid:
            await self._call("inspect sandbox", container.reload)
            pid = (container.attrs.get("State") or {}).get("Pid") or 0
        if not isinstance(pid, int) or pid <= 0:
            return conn
        try:
            os.close(os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as e:
            # No access to the container's processes from here (another pid namespace, no
            # ptrace-read access): true of every container, so do not ask again.
            log.info("sandbox.direct_unavailable", container=container.name, error=repr(e))
            self._direct_unreachable = True
            return conn

        async def open_socket(path: str) -> SocketTransport:
            return await connect_agent_socket(pid, path)

        try:
            if await conn.go_direct(open_socket, timeout=spec.agent_start_timeout):
                await self._take_fd_channel(conn, pid, container.name, spec)
                return conn
            # The container's root was reachable but the socket was not (a command may
            # have moved it): this container stays on the attach stream.
            self._direct_failed.add(container.name)
            return conn
        except SandboxLostError as e:
            # The agent may have moved already: this connection is closed. Start a plain
            # one (the container is fine) and stay on attach streams from now on.
            log.warning("sandbox.direct_failed", container=container.name, error=str(e))
            self._direct_failed.add(container.name)
            return await self._exec_agent(container, spec)

    async def _take_fd_channel(self, conn: AgentConnection, pid: int, name: str, spec: SandboxSpec) -> None:
        """Where the direct channel works, the agent can also hand tunnels' sockets over
        whole (:mod:`sandbox.tunnel`): a port-forward at the speed of the sandbox's own
        loopback. Best effort: on any failure tunnels are relayed over the channel."""

        async def open_channel(path: str) -> FdChannel:
            return await connect_fd_channel(pid, path)

        try:
            await take_fd_channel(conn, open_channel, timeout=spec.agent_start_timeout)
        except (SandboxError, OSError, TimeoutError) as e:
            log.info("sandbox.fd_channel_unavailable", container=name, error=repr(e))

    async def _verify_gvisor(self, conn: AgentConnection, container: Any) -> None:
        """Fail closed unless the agent really runs on gVisor's kernel."""
        hello = agent_info(await conn.request("hello", {}, timeout=10))
        await self._call("inspect sandbox", container.reload)
        runtime = container.attrs.get("HostConfig", {}).get("Runtime")
        if runtime != "runsc" or hello.kernel == os.uname().release:
            await conn.close("gVisor not in effect")
            await self._remove(container)
            raise RuntimeUnavailableError(
                f"gVisor was requested but is not in effect (runtime={runtime!r}, "
                f"kernel={hello.kernel!r}); refusing to run"
            )

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
                on_exec_lost=lambda: self._reset_after_lost_exec(ws),
            )
            box.container_name = container_name(ws)
            box.owner = self._owner(ws)
            box.allow_root = spec.allow_root

            def user_connect(user: tuple[int, int], ws: Path = ws) -> Awaitable[AgentConnection]:
                return self._connect_user(ws, user)

            box.user_connect = user_connect
            if spec.runtime == "runsc":
                box.host_scanner = HostScanner(ws)
            self._boxes[ws] = box
        return box

    async def _reset_after_lost_exec(self, ws: Path) -> str | None:
        """The agent died or froze while running a command (``kill -9 $PPID``, ``kill
        -STOP -1``, ...), or the whole sandbox was killed. Processes the command started may
        have escaped the agent's tree-kill, and a frozen keeper would keep the container past
        its idle TTL: remove the container, so every one of its processes is gone; the next
        call starts a fresh one. Other processes using it reconnect to the new one.

        Returns "oom" when the engine killed the container for memory (under gVisor the
        host's cgroup sees the sandbox as one process, so a command's allocation past the
        limit takes the sandbox: still the command's out-of-memory, not an infrastructure
        failure), "reset" when it removed it otherwise, None when it could not."""
        try:
            container = await self._find(container_name(ws))
            for _ in range(15):  # an OOM kill ends the container within moments: let it settle
                if container is None or container.status not in ("running", "restarting"):
                    break
                await asyncio.sleep(0.1)
                await self._call("inspect sandbox", container.reload)
            if container is None:
                return "reset"  # already gone (TTL, removed): nothing of the command is left
            oom = bool((container.attrs.get("State") or {}).get("OOMKilled"))
            await self._remove(container)
        except SandboxUnavailableError as e:
            log.warning("sandbox.reset_failed", workspace=str(ws), error=str(e))
            return None
        log.warning("sandbox.reset_after_lost_exec", workspace=str(ws), container=container.name, oom=oom)
        return "oom" if oom else "reset"

    async def stop(self, workspace: Path) -> bool:
        ws = Path(workspace).resolve()
        box = self._boxes.pop(ws, None)
        if box is not None:
            await box.close()
        container = await self._find(container_name(ws))
        if container is None:
            return False
        await self._remove(container)
        log.info("sandbox.stopped", workspace=str(ws))
        return True

    async def aclose(self) -> None:
        for box in list(self._boxes.values()):
            await box.close()
        self._boxes.clear()
        if self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._client.close)
            self._client = None

    # -- housekeeping --------------------------------------------------------------------

    async def list_sandboxes(self) -> list[dict[str, Any]]:
        """Every container carrying our labels, running or not."""
        client = self._docker()
        containers = await self._call(
            "list sandboxes", lambda: client.containers.list(all=True, filters={"label": f"{LABEL_WORKER}=1"})
        )
        return [
            {
                "name": c.name,
                "status": c.status,
                "workspace": (c.labels or {}).get(LABEL_WS),
                "version": (c.labels or {}).get(LABEL_VERSION),
                "container": c,
            }
            for c in containers
        ]

    async def gc(self, *, all_running: bool = False) -> list[str]:
        """Remove exited sandboxes, sandboxes of vanished workspaces or other worker
        versions (and every running one with ``all_running``). Only our labels are touched.
        """
        removed = []
        for item in await self.list_sandboxes():
            ws = item["workspace"]
            stale = (
                item["status"] != "running"
                or not ws
                or not Path(ws).is_dir()
                or item["version"] != __version__
                or all_running
            )
            if stale:
                await self._remove(item["container"])
                removed.append(item["name"])
        return removed

    async def remove_all_started(self) -> None:
        """Remove every container this backend started or adopted (tests' cleanup)."""
        for name in list(self._started):
            container = await self._find(name)
            if container is not None:
                await self._remove(container)
        self._started.clear()

    async def daemon_info(self) -> dict[str, Any]:
        """``docker info`` (raises DaemonUnavailableError)."""
        result: dict[str, Any] = await self._call("docker info", lambda: self._docker().info())
        return result

    async def runtimes(self) -> set[str]:
        """The OCI runtimes the engine has (``runc``, ``runsc``...). Raises
        DaemonUnavailableError."""
        info = await self._call("docker info", lambda: self._docker().info())
        return set((info.get("Runtimes") or {}).keys())

    async def image_exists(self) -> bool:
        """Whether the default spec's image is on the engine (raises DaemonUnavailableError)."""
        return await self.has_image(self.spec.image)

    async def has_image(self, image: str) -> bool:
        """Whether ``image`` is on the engine (nothing is pulled). Raises
        DaemonUnavailableError."""
        client = self._docker()

        def get() -> bool:
            try:
                client.images.get(image)
                return True
            except docker.errors.ImageNotFound:
                return False
            except docker.errors.APIError as e:
                if e.status_code == 400:  # not a valid reference: not an image we have
                    return False
                raise

        return await self._call("inspect image", get)

    async def inspect(self, workspace: Path) -> dict[str, Any] | None:
        """The raw ``docker inspect`` of a workspace's container, or None."""
        container = await self._find(container_name(Path(workspace).resolve()))
        return None if container is None else dict(container.attrs)

    async def status(self, workspace: Path) -> dict[str, Any] | None:
        """A workspace's container as it is now, without starting one (None when it has
        none): its state, image, runtime and limits, and while it runs its CPU (percent
        of one CPU since this backend last looked; two looks 0.1 s apart the first time)
        and memory in use (page cache it can drop not counted, as ``docker stats``).
        Raises DaemonUnavailableError."""
        container = await self._find(container_name(Path(workspace).resolve()))
        if container is None:
            return None
        attrs = container.attrs or {}
        state, host, config = attrs.get("State") or {}, attrs.get("HostConfig") or {}, attrs.get("Config") or {}
        nano = host.get("NanoCpus") or 0
        out: dict[str, Any] = {
            "container": container.name,
            "status": state.get("Status"),
            "running": state.get("Status") == "running",
            "oom_killed": bool(state.get("OOMKilled")),
            "started_at": state.get("StartedAt"),
            "image": config.get("Image"),
            "runtime": host.get("Runtime"),
            "limits": {
                "cpus": nano / 1e9 if nano else None,
                "memory_bytes": host.get("Memory") or None,
                "pids": _int_label((config.get("Labels") or {}).get(LABEL_PIDS)) or host.get("PidsLimit") or None,
            },
            "usage": None,
        }
        if out["running"]:
            out["usage"] = await self._usage(container)
        return out

    async def _usage(self, container: Any) -> dict[str, Any] | None:
        def sample() -> dict[str, Any]:
            stats: dict[str, Any] = container.stats(stream=False, one_shot=True)
            return stats

        try:
            stats = await self._call("sandbox stats", sample)
            now = time.monotonic()
            seen = self._cpu_seen.get(container.id)
            if seen is None or now - seen[1] > 60:
                self._cpu_seen[container.id] = (_cpu_ns(stats), now)
                await asyncio.sleep(0.1)
                stats = await self._call("sandbox stats", sample)
                now = time.monotonic()
        except SandboxUnavailableError as e:
            if "No such container" in str(e) or "404" in str(e):
                return None  # it stopped between the two looks
            raise
        cpu = _cpu_ns(stats)
        prev = self._cpu_seen.get(container.id)
        if len(self._cpu_seen) > 512:
            self._cpu_seen.clear()
        self._cpu_seen[container.id] = (cpu, now)
        mem = stats.get("memory_stats") or {}
        detail = mem.get("stats") or {}
        usage = mem.get("usage")
        if isinstance(usage, int):
            usage -= detail.get("total_inactive_file", detail.get("inactive_file", 0)) or 0
        percent = None
        if prev is not None and now > prev[1] and cpu >= prev[0]:
            percent = round((cpu - prev[0]) / ((now - prev[1]) * 1e9) * 100, 1)
        return {
            "cpu_percent": percent,
            "memory_bytes": usage if isinstance(usage, int) else None,
            "memory_limit_bytes": mem.get("limit"),
            "pids": (stats.get("pids_stats") or {}).get("current"),
        }


def _cpu_ns(stats: dict[str, Any]) -> int:
    total = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    return total if isinstance(total, int) else 0
