"""The container's configuration: its name and labels, its mounts, and the hardening
every sandbox is created with (the ``containers.create`` arguments)."""

from __future__ import annotations

import hashlib
import os
import stat as statmod
from pathlib import Path
from typing import Any

import docker
from docker.types import Mount

from .. import __version__, protocol
from ..identity import workspace_key
from ..spec import (
    AGENT_COMMAND,
    AGENTS_MOUNT,
    CA_BUNDLE_PATH,
    CHANNEL_MOUNT,
    EGRESS_MOUNT,
    HOME_DIR,
    INIT_COMMAND,
    LABEL_PREFIX,
    ROOT_CAPABILITIES,
    RUNTIME_MOUNT,
    WORKSPACE_MOUNT,
    SandboxSpec,
)
from . import seccomp

LABEL_WORKER = f"{LABEL_PREFIX}.worker"
LABEL_WS = f"{LABEL_PREFIX}.workspace"
LABEL_WS_HASH = f"{LABEL_PREFIX}.workspace-hash"
LABEL_VERSION = f"{LABEL_PREFIX}.version"
LABEL_SPEC = f"{LABEL_PREFIX}.spec"
LABEL_RUNTIME = f"{LABEL_PREFIX}.agent-runtime"
LABEL_PIDS = f"{LABEL_PREFIX}.pids"  # the configured limit (the engine's differs under gVisor)
LABEL_SECCOMP = f"{LABEL_PREFIX}.seccomp"  # the digest of the seccomp profile it was made with
LABEL_OWNER = f"{LABEL_PREFIX}.owner"  # the worker installation that made it (SandboxSpec.owner)
LABEL_POOL = f"{LABEL_PREFIX}.pool"  # the class key of a warm pool's sandbox (may be frozen: .freezer)
LABEL_MASKED = f"{LABEL_PREFIX}.masked"  # the digest of MASKED_PATHS it was made with

#: Paths of /proc and /sys the sandbox sees empty (a file) or as an empty directory: the
#: engine's own list (Docker 20.10's, which this replaces as a whole, plus what newer
#: engines add) and the kernel's facts that Docker leaves readable: its build
#: configuration (/proc/config.gz), the addresses and layout a crash dump needs
#: (/sys/kernel/vmcoreinfo: the kernel's physical base, a KASLR leak), its symbol
#: addresses (/proc/kallsyms: real ones on a host with kptr_restrict=0) and build id
#: (/sys/kernel/notes). A path the kernel lacks is skipped by the runtime; under gVisor
#: none of these exist in the first place (its /proc and /sys are its own).
MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/proc/config.gz", "/sys/kernel/vmcoreinfo", "/proc/kallsyms", "/sys/kernel/notes",
)  # fmt: skip


def masked_digest() -> str:
    """A short digest of :data:`MASKED_PATHS` (a label: a container made with another list
    is replaced)."""
    return hashlib.sha256("\n".join(MASKED_PATHS).encode()).hexdigest()[:12]


def create_args(cfg: dict[str, Any], api_version: str) -> dict[str, Any]:
    """The low-level ``create_container`` arguments for the ``containers.create``
    arguments ``cfg``, with :data:`MASKED_PATHS` (a host setting docker-py does not
    name: the engine takes it since API 1.30)."""
    from docker.models.containers import _create_container_args  # type: ignore[attr-defined]

    args: dict[str, Any] = _create_container_args({**cfg, "version": api_version})
    args["host_config"]["MaskedPaths"] = list(MASKED_PATHS)
    return args


#: Every workspace's container's name starts so.
NAME_PREFIX = "loom-sbx-"


def container_name(workspace: Path) -> str:
    return f"{NAME_PREFIX}{workspace_key(workspace)}"


def owner(ws: Path, spec: SandboxSpec) -> tuple[int, int]:
    """The uid and gid the sandbox of ``ws`` runs as: the spec's, else the workspace owner's."""
    st = ws.stat()
    uid = spec.uid if spec.uid is not None else st.st_uid
    gid = spec.gid if spec.gid is not None else (st.st_gid if spec.uid is None else uid)
    return uid, gid


def channel_dir(ws: Path, spec: SandboxSpec) -> Path | None:
    """The host directory of workspace ``ws``'s direct channel under gVisor (where the
    worker listens for the agent), or None (runc, or no ``channel_dir``)."""
    if spec.runtime != "runsc" or not spec.channel_dir:
        return None
    return Path(spec.channel_dir) / workspace_key(ws)


def container_mounts(
    ws: Path, spec: SandboxSpec, runtime_volume: str | None, workspace_volume: str | None = None
) -> list[Mount]:
    """The workspace (and its second mount at ``spec.home_mount``), the agent runtime, the
    CA bundle, the egress socket, and git's hooks and config (read-only) of workspace
    ``ws`` (real path). With ``workspace_volume`` (a fork on an overlay volume, ``ws`` its
    mountpoint) the workspace is that volume, which the engine mounts at each start."""
    targets = [WORKSPACE_MOUNT, *([spec.home_mount] if spec.home_mount else [])]
    # home_mount: the same tree again, not a link to /workspace: a program asking where it
    # is (getcwd, realpath) is told /home/user, as in E2B's sandboxes.
    if workspace_volume:
        # never the bare mountpoint: the engine mounts the overlay before the container
        # starts, or the start fails. no_copy: an empty fork must not be filled from the image.
        mounts = [Mount(target=t, source=workspace_volume, type="volume", no_copy=True) for t in targets]
    else:
        mounts = [Mount(target=t, source=str(ws), type="bind", read_only=False) for t in targets]
    if runtime_volume:
        mounts.append(Mount(target=RUNTIME_MOUNT, source=runtime_volume, type="volume", read_only=True))
    for name, source in spec.agents.items():
        mounts.append(Mount(target=f"{AGENTS_MOUNT}/{name}", source=source, type="bind", read_only=True))
    if spec.ca_bundle:
        mounts.append(Mount(target=CA_BUNDLE_PATH, source=spec.ca_bundle, type="bind", read_only=True))
    channel = channel_dir(ws, spec)
    if channel is not None:
        mounts.append(Mount(target=CHANNEL_MOUNT, source=str(channel), type="bind", read_only=True))
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
    # Under every mount of the workspace: a bind mount shows the host directory, not the
    # mounts made below another mount of it.
    # Not for a fork on an overlay volume: its .git exists only in the overlay the engine
    # mounts at the container's start, so no host path of it can be bound here, and the
    # engine binds a part of a volume only from API 1.45 (Docker 26, VolumeOptions.Subpath),
    # and even then fails the start when that part is missing (which the layers alone do
    # not tell: whiteouts, opaque and redirected directories). Binding the snapshot's .git
    # instead would send the sandbox's git writes into the lower layer. What holds there
    # is the host's guard after every call (worker/guard), with the fork's trust taken
    # from its snapshot's tree when it is made (``WorkspaceGuard.adopt_trust``), never
    # afresh at a new mount: what the sandbox plants is disabled before the host runs git.
    for target in targets if not workspace_volume else ():
        mounts.extend(_git_mounts(ws, target))
    return mounts


def _git_mounts(ws: Path, target: str) -> list[Mount]:
    """The protections of ``ws``'s ``.git`` where the workspace is mounted at ``target``."""
    git = ws / ".git"
    try:
        git_st = os.lstat(git)
    except OSError:
        return []
    if not statmod.S_ISDIR(git_st.st_mode):
        return []
    mounts = [Mount(target=f"{target}/.git", source=str(git), type="bind", read_only=False)]
    for rel in (".git/hooks", ".git/config"):
        p = ws / rel
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if statmod.S_ISLNK(st.st_mode) or not p.resolve().is_relative_to(ws):
            continue
        mounts.append(Mount(target=f"{target}/{rel}", source=str(p), type="bind", read_only=True))
    return mounts


def container_config(
    ws: Path,
    spec: SandboxSpec,
    runtime_volume: str | None,
    engine_runtime: str | None = None,
    workspace_volume: str | None = None,
) -> dict[str, Any]:
    """The ``containers.create`` arguments for workspace ``ws`` (real path), made with
    ``spec``, with the agent runtime in volume ``runtime_volume``, on the engine's runtime
    ``engine_runtime`` (default ``spec.runtime``; under gVisor, the one registered for the
    spec's platform, :func:`~.gvisor.engine_runtime`); ``workspace_volume``: the fork
    volume mounted as the workspace (:func:`container_mounts`)."""
    uid, gid = owner(ws, spec)
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
        # PID 1 is tini either way (it reaps orphans, forwards signals, exits with the
        # agent): under runc the runtime's unreadable copy, which the kernel keeps
        # non-dumpable, so no command can trace it or write its memory; gVisor must read
        # a program to load it, so there the engine's own (--init), which its kernel
        # protects anyway (see .seccomp and docs/seccomp.md).
        "entrypoint": [*(INIT_COMMAND if spec.runtime == "runc" else ()), *AGENT_COMMAND, protocol.BOOTSTRAP],
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
            LABEL_RUNTIME: runtime_volume or "",
            LABEL_PIDS: str(spec.pids),
            LABEL_SECCOMP: seccomp.digest(spec.runtime),
            **({LABEL_OWNER: spec.owner} if spec.owner else {}),
            LABEL_MASKED: masked_digest(),
        },
        "hostname": "sandbox",
        "network_mode": "none",
        # allow_root (off by default): the container's user is root, so that an agent
        # started for root gets ROOT_CAPABILITIES (the engine gives an exec process
        # capabilities only in a container whose user is root); its main agent drops to
        # the owner at once (setuid: the kernel clears its capabilities), and every other
        # process of the owner is started as the owner, with none.
        **({"user": "0:0", "cap_add": list(ROOT_CAPABILITIES)} if spec.allow_root else {}),
        "runtime": engine_runtime or spec.runtime,
        "nano_cpus": int(spec.cpus * 1e9),
        "mem_limit": spec.memory,
        "memswap_limit": spec.memory,
        "pids_limit": spec.host_pids_limit(),
        "read_only": not spec.allow_root,  # allow_root: adduser writes /etc
        # Both owned by the sandbox's uid: runc before 1.2 chmods a tmpfs mountpoint to the
        # mode of the image's directory after mounting, over mode= (an image whose /tmp is
        # 0755 would leave it unwritable), so the agents set the modes themselves at start
        # (OWN_DIRS), which only the owner may do without capabilities.
        "tmpfs": {
            "/tmp": f"{tmpfs_opts},size={spec.tmp_size},mode=1777,uid={uid},gid={gid}",
            HOME_DIR: f"{tmpfs_opts},size={spec.home_size},mode=0700,uid={uid},gid={gid}",
        },
        "cap_drop": ["ALL"],
        # Our own seccomp profile, whatever the engine's default is (see .seccomp).
        "security_opt": ["no-new-privileges", seccomp.security_opt(spec.runtime)],
        "init": spec.runtime != "runc",
        "privileged": False,
        "ipc_mode": "private",
        "mounts": container_mounts(ws, spec, runtime_volume, workspace_volume),
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
