"""SandboxSpec: everything that decides what a workspace container looks like.

The hardening block is not optional: network none, every capability dropped,
no-new-privileges, read-only root with size-limited tmpfs for /tmp and $HOME, an init
process as PID 1, CPU/memory/pids limits, and no host path but the workspace mounted.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .pulls import normalize_registry

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

WORKSPACE_MOUNT = "/workspace"
#: Where the agent runtime (images/runtime: CPython, its standard library, ripgrep and
#: glibc's loader) is mounted read-only in every sandbox, outside the workspace.
RUNTIME_MOUNT = "/.loom"
#: How the agent starts in any image: through the runtime's own dynamic loader, with the
#: runtime's libraries on the loader's command line (not LD_LIBRARY_PATH, which commands
#: would inherit), so neither the image's interpreter nor its C library is involved.
AGENT_COMMAND = (
    f"{RUNTIME_MOUNT}/lib/loader",
    "--library-path",
    f"{RUNTIME_MOUNT}/lib",
    f"{RUNTIME_MOUNT}/bin/python3",
    "-I",
    "-S",
    "-c",
)
#: The sandbox's init (PID 1) under runc: tini from the agent runtime, unreadable, so that
#: the kernel keeps it non-dumpable (out of reach of commands of the same uid).
INIT_COMMAND = (f"{RUNTIME_MOUNT}/bin/tini", "--")
HOME_DIR = "/home/sandbox"
_HOME_MOUNT = re.compile(r"/home/[a-z_][a-z0-9_-]{0,31}")
#: Where a trusted CA bundle (:attr:`SandboxSpec.ca_bundle`) is mounted, and the variables
#: that make it the trust store of the usual tools (OpenSSL, Python requests, pip, Node,
#: git, curl). SSL_CERT_FILE replaces the system store: the bundle should hold the public
#: roots as well as the extra CA (as the host's ca-certificates.crt does).
CA_BUNDLE_PATH = "/etc/loom/ca-bundle.pem"
CA_ENV_VARS = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
)
#: Network egress (when a workspace may reach hosts): the gateway's socket directory of
#: the host is mounted read-only here, and the agent relays the sandbox's loopback
#: listeners to its socket: an HTTP proxy at 127.0.0.1:EGRESS_PROXY_PORT, a stub
#: resolver at 127.0.0.1:53 (the mounted resolv.conf names it) and, for the addresses the
#: stub hands out (127.77.x.y), ports 80 and 443. The sandbox still has no interface but
#: loopback; every decision is the gateway's.
EGRESS_MOUNT = "/run/loom/egress"
EGRESS_SOCKET = f"{EGRESS_MOUNT}/s"
#: Under gVisor, where the worker's side of the agent's direct channel is mounted
#: (read-only; the agent's ``channel.DIAL_DIR``): the host's sockets the agent dials.
CHANNEL_MOUNT = "/.loom-host"
EGRESS_PROXY_PORT = 3128
EGRESS_PROXY = f"http://127.0.0.1:{EGRESS_PROXY_PORT}"
#: The clients' proxy settings: the usual variables (both cases), npm, pip, git, and
#: Node's own fetch (NODE_USE_ENV_PROXY, Node 22.?+); loopback is never proxied.
EGRESS_ENV = {
    "HTTP_PROXY": EGRESS_PROXY,
    "HTTPS_PROXY": EGRESS_PROXY,
    "ALL_PROXY": EGRESS_PROXY,
    "http_proxy": EGRESS_PROXY,
    "https_proxy": EGRESS_PROXY,
    "all_proxy": EGRESS_PROXY,
    "NO_PROXY": "localhost,127.0.0.1,::1",
    "no_proxy": "localhost,127.0.0.1,::1",
    "npm_config_proxy": EGRESS_PROXY,
    "npm_config_https_proxy": EGRESS_PROXY,
    "PIP_PROXY": EGRESS_PROXY,
    "NODE_USE_ENV_PROXY": "1",
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "http.proxy",
    "GIT_CONFIG_VALUE_0": EGRESS_PROXY,
}
#: Where each agent CLI of the host's agents store a sandbox asks for is mounted read-only
#: (``<AGENTS_MOUNT>/<name>``); its ``bin`` directory comes first on PATH.
AGENTS_MOUNT = "/opt/loom/agents"
_AGENT_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
ACTIVITY_FILE = "/tmp/.loom-activity"
#: The sandbox's own directories and the modes every agent gives them at start, whatever the
#: image's directories there had (see sandbox/docker/config.py: runc copies their modes).
OWN_DIRS = {"/tmp": 0o1777, HOME_DIR: 0o700}
#: What root's processes hold in a sandbox with :attr:`SandboxSpec.allow_root`: the least
#: Debian's ``adduser``/``userdel`` need (CHOWN, DAC_OVERRIDE, FOWNER: new entries in
#: /etc/shadow and /etc/gshadow, the new home chowned and chmodded; without any one of
#: them adduser fails), and SETUID/SETGID: the container's main agent starts as root and
#: must become the owner, and inspect counts root usable only with them (its injected
#: tools switch users). Docker's default set has fourteen.
ROOT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID")
LABEL_PREFIX = "dev.loom"


#: The bounds of the limits, declared once: the spec's fields and the settings they come
#: from (``worker.sandbox_settings``, the process's and each workspace's) use these.
Cpus = Annotated[float, Field(ge=0.1, le=64)]
Pids = Annotated[int, Field(ge=16, le=65536)]
IdleTtl = Annotated[int, Field(ge=10)]
NonNegative = Annotated[int, Field(ge=0)]
Runtime = Literal["runc", "runsc"]
GvisorPlatform = Literal["systrap", "ptrace", "kvm"]
Pull = Literal["missing", "never", "always"]


def parse_size(value: str | int) -> int:
    """``"1g"`` -> 1073741824. Raises ValueError for anything else."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("size must be positive")
        return value
    m = _SIZE.match(value)
    if not m:
        raise ValueError(f"not a size: {value!r} (use e.g. 512m, 1g)")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError("size must be positive")
    return n


def check_home_mount(path: str) -> str:
    """``path`` if a :attr:`SandboxSpec.home_mount` may name it: a user's home under /home
    (E2B's ``/home/user``), never a system directory nor the sandbox's own home. Raises
    ValueError."""
    if not isinstance(path, str) or not _HOME_MOUNT.fullmatch(path) or path == HOME_DIR:
        raise ValueError(f"a home directory /home/<name> (<name>: a-z, 0-9, _ and -), not {HOME_DIR}")
    return path


class SandboxSpec(BaseModel):
    """What every sandbox container of a backend is created with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = "loom-sandbox:latest"
    #: When the image is pulled (sandbox/docker/images.py): ``missing`` (not on the engine),
    #: ``never`` (it must be built or loaded), ``always`` (before every new container).
    pull: Pull = "missing"
    #: The registries a pull may reach, as image names write them (``docker.io`` for a name
    #: without one). An image already on the engine is used whatever its registry.
    registries: tuple[str, ...] = ("docker.io",)
    #: The image the agent runtime is copied from (into a read-only volume per version).
    agent_runtime_image: str = "loom-agent-runtime:latest"
    runtime: Runtime = "runc"
    #: gVisor's platform under ``runtime="runsc"`` (:mod:`sandbox.docker.gvisor`): how the
    #: sandbox's system calls reach gVisor's kernel. One engine runtime per platform.
    gvisor_platform: GvisorPlatform = "systrap"
    cpus: Cpus = 1.0
    memory: int = Field(1 << 30, description="bytes; swap is set equal, i.e. no swap")
    pids: Pids = 256
    tmp_size: int = 256 << 20
    home_size: int = 128 << 20
    #: The workspace is a bind mount of the host's disk, beyond the container's memory
    #: and tmpfs limits: no file a sandbox process writes may grow past ``max_file_size``
    #: (RLIMIT_FSIZE), no command may consume more than ``disk_limit`` of that disk, and
    #: none may push its free space below ``disk_reserve`` (the agent stops it).
    max_file_size: int = 4 << 30
    disk_limit: int = 8 << 30
    disk_reserve: int = 1 << 30
    #: Files one command may create in the workspace (0: no limit); and none may use the
    #: filesystem's last 1% of inodes.
    inode_limit: NonNegative = 1_000_000
    uid: NonNegative | None = None
    gid: NonNegative | None = None
    #: Seconds without a call before the container exits.
    idle_ttl: IdleTtl = 900
    agent_start_timeout: float = 20.0
    io_timeout: float = 30.0
    #: Environment variables every process in the sandbox gets (per-workspace settings).
    env: dict[str, str] = Field(default_factory=dict)
    #: A PEM file on the engine's host, mounted read-only as the sandbox's trust store.
    ca_bundle: str | None = None
    #: The egress gateway's socket directory on the engine's host (None: no network at
    #: all). The allowlist itself is not here: the gateway reads it per connection.
    egress_dir: str | None = None
    #: Under gVisor: the engine host's directory of the agents' direct channels. A
    #: sandbox's own subdirectory (its workspace key) is mounted read-only at
    #: CHANNEL_MOUNT, the worker listens there and the agent dials in (~10x lower latency
    #: per call than the engine's attach stream). None: the attach stream.
    channel_dir: str | None = None
    #: Talk to runc agents over a unix socket on the container's /tmp, reached through
    #: /proc/<pid>/root, instead of through the engine's attach stream (~10x lower latency
    #: per call). Falls back to the attach stream when the socket is not reachable.
    direct: bool = True
    #: Commands may run as root (``exec(user="root")``, as a harness such as inspect_ai
    #: asks to add users): the root file system is writable and root's processes hold
    #: :data:`ROOT_CAPABILITIES` (the capabilities ``adduser`` needs), in the bounding set,
    #: which no process of another user holds (the workspace owner's commands keep none).
    #: Everything else stays: no-new-privileges, the limits, no network, gVisor. Off by
    #: default; the trade is in docs/harness.md.
    allow_root: bool = False
    #: The workspace mounted a second time at this path (``/home/<name>``), which is then
    #: $HOME and $USER is ``<name>``: E2B's sandboxes have their user's home, ``/home/user``,
    #: as the working directory, and what is written there must be the workspace (the
    #: same directory of the host: recorded by the changelog's scans, undoable). The
    #: protections of ``.git`` apply under it as under /workspace. None: no second mount.
    home_mount: str | None = None
    #: Agent CLIs of the host's agents store (name -> the install's directory on the
    #: engine's host), each mounted read-only at ``AGENTS_MOUNT/<name>`` with its ``bin``
    #: first on the PATH of every command.
    agents: dict[str, str] = Field(default_factory=dict)
    #: Whose sandboxes these are: the identity of the worker installation (its data
    #: directory, see ``worker.owner``), set as a label on every container, so that
    #: ``gc`` removes only its own. None: unowned (tests, a backend made by hand).
    owner: str | None = None

    @field_validator("home_mount")
    @classmethod
    def _home_mount(cls, v: str | None) -> str | None:
        return None if v is None else check_home_mount(v)

    @field_validator("agents")
    @classmethod
    def _agents(cls, v: dict[str, str]) -> dict[str, str]:
        for name, path in v.items():
            if not _AGENT_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an agent's name (a-z, 0-9, _ and -)")
            if not path.startswith("/"):
                raise ValueError(f"{name}: {path!r} is not an absolute path")
        return dict(sorted(v.items()))

    def path_prepend(self) -> list[str]:
        """What comes before the image's PATH for every command: the agents' ``bin``."""
        return [f"{AGENTS_MOUNT}/{name}/bin" for name in self.agents]

    @field_validator("registries")
    @classmethod
    def _registries(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(normalize_registry(r) for r in v))

    @field_validator("memory", "tmp_size", "home_size", "max_file_size", mode="before")
    @classmethod
    def _size(cls, v: object) -> int:
        if isinstance(v, str | int) and not isinstance(v, bool):
            return parse_size(v)
        raise ValueError("size must be a number of bytes or a string like 512m")

    @field_validator("disk_limit", "disk_reserve", mode="before")
    @classmethod
    def _size_or_zero(cls, v: object) -> int:
        if isinstance(v, int | str) and not isinstance(v, bool) and str(v).strip() == "0":
            return 0  # no such check
        return cls._size(v)

    def environment(self, uid: int) -> dict[str, str]:
        """The container's environment (on top of the image's own)."""
        env = {"HOME": HOME_DIR, "USER": "sandbox", "LANG": "C.UTF-8"}
        if self.home_mount:
            env.update(HOME=self.home_mount, USER=self.home_mount.rsplit("/", 1)[1])
        if self.egress_dir:
            env.update(EGRESS_ENV)
        env.update(self.env)
        if self.ca_bundle:
            env.update(dict.fromkeys(CA_ENV_VARS, CA_BUNDLE_PATH))
        return env

    def agent_config(self) -> dict[str, object]:
        """What every agent of a sandbox is told at start (with its root and paths). The
        container's main agent also runs the egress relay when there is a gateway."""
        config: dict[str, object] = {
            "own_dirs": OWN_DIRS,
            "disk_limit": self.disk_limit,
            "disk_reserve": self.disk_reserve,
            "inode_limit": self.inode_limit,
        }
        if self.agents:
            config["path_prepend"] = self.path_prepend()
        if self.egress_dir:
            config["egress"] = {"socket": EGRESS_SOCKET, "proxy_port": EGRESS_PROXY_PORT, "dns_port": 53}
        return config

    def host_pids_limit(self) -> int:
        """The engine's pids limit for this sandbox. Under gVisor the host's cgroup counts
        the sandbox kernel's own threads (~30 idle) and the host threads its platform
        spends on sandboxed processes: measured here, per busy sandboxed process about 3
        under systrap and 6-7 under ptrace (about 1 and 2.5 per sleeping one). So
        ``pids`` processes get three times that (four with ptrace, which the workloads of
        this project's tests fit) plus the kernel's share; the limit still stops a fork
        bomb long before the host notices."""
        if self.runtime == "runsc":
            per_process = 4 if self.gvisor_platform == "ptrace" else 3
            return min(65536, self.pids * per_process + 128)
        return self.pids

    def fingerprint(self) -> str:
        """Hash of what a running container was created with (uid/gid decided per workspace)."""
        exclude = {"agent_start_timeout", "io_timeout", "uid", "gid", "direct", "pull", "registries", "owner"}
        if self.runtime != "runsc":
            exclude |= {"gvisor_platform", "channel_dir"}  # runc containers do not depend on them
        body = self.model_dump(exclude=exclude)
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
