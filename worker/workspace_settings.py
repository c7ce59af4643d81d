"""Per-workspace settings: the image, runtime, limits, environment and trust store one
workspace's sandbox is made with, on top of the process-wide ``LOOM_*`` defaults.

Stored on the host next to the workspace's changelog
(``$LOOM_DATA_DIR/workspaces/<hash>/settings.json``, mode 0600), never in the workspace and
never mounted into a sandbox: a setting the agent could change would let it lift its own
limits. The operator changes them through the Python API
(:meth:`~worker.registry.ToolRegistry.configure_workspace`), the CLI (``loom-worker
workspace set``) or the HTTP API (``PATCH /v1/workspaces/{id}``); a change takes effect at
the workspace's next call, which replaces its container (the files are kept).

Every value is checked before anything is stored: unknown keys, bad sizes, a runtime the
engine does not have, limits above the operator's caps (``LOOM_MAX_CPUS``,
``LOOM_MAX_MEMORY``, ``LOOM_MAX_PIDS``, ``LOOM_MAX_IDLE_TTL``) raise :class:`SettingsError`
naming the field, and nothing changes.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandbox.spec import Cpus, IdleTtl, Pids, Runtime, SandboxSpec, check_home_mount, parse_size

from .changelog.recorder import workspace_dir
from .egress.policy import EgressPatternError, EgressPolicy
from .pem import pem_problem
from .sandbox_settings import HostPath, Image, Memory, Size, override
from .storage.atomic import write_atomic

if TYPE_CHECKING:  # annotations only: the settings module is not needed to use these
    from .egress.provision import SecretsHost
    from .settings import Settings

SETTINGS_FILE = "settings.json"
#: The directory of the CA bundles' copies (:meth:`Configs.trust_dir`).
TRUST_DIR = "trust"
#: The host's agents store under the data directory (:mod:`worker.agents.store`).
AGENTS_DIR = "agents"
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: Variables the worker owns in a sandbox: the agent runtime must not be steered through
#: the dynamic loader, and HOME/USER belong to the sandbox's tmpfs home.
_RESERVED_ENV = re.compile(r"^(LD_|LOOM_)|^(HOME|USER)$")


class SettingsError(ValueError):
    """A setting was refused; ``field`` names it (``memory``, ``env.FOO``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class WorkspaceSettings(BaseModel):
    """What one workspace overrides; ``None`` (absent) keeps the process default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The sandbox's settings a workspace may override (PER_WORKSPACE): their types,
    # validators and descriptions are the process-wide ones (worker.sandbox_settings).
    image: Image | None = override("image")
    runtime: Runtime | None = override("runtime")
    cpus: Cpus | None = override("cpus")
    memory: Memory | None = override("memory")
    pids: Pids | None = override("pids")
    idle_ttl: IdleTtl | None = override("idle_ttl")
    ca_bundle: HostPath | None = override("ca_bundle")
    tmp_size: Size | None = override("tmp_size")
    home_size: Size | None = override("home_size")
    # A workspace's own.
    env: dict[str, str] | None = Field(None, description="Environment variables of every process in the sandbox.")
    egress: list[str] | None = Field(
        None,
        description="Hosts the sandbox may reach through the egress gateway (pypi.org, *.example.com, "
        "host:8443, presets pypi/npm/debian/github, !denied.host); [] for none.",
    )
    allow_root: bool | None = Field(
        None,
        description="Let a harness run commands as root (exec with user root, e.g. inspect's adduser): the root "
        "file system becomes writable and root holds CHOWN, DAC_OVERRIDE, FOWNER, SETGID, SETUID; the owner's "
        "commands keep no capability. Off by default; the trade is in docs/harness.md.",
    )
    home_mount: str | None = Field(
        None,
        description="Mount the workspace a second time at this home directory (/home/<name>), which becomes "
        "$HOME (and <name> $USER): what is written there is the workspace's, recorded like any change. E2B's "
        "API gives its sandboxes /home/user (docs/e2b.md).",
    )

    agents: list[str] | None = Field(
        None,
        description="Agent CLIs of the host's agents store (claude, codex, opencode; `loom-worker agent install "
        "NAME`): the pinned install of each is mounted read-only at /opt/loom/agents/<name>, its bin first on PATH.",
    )

    @field_validator("agents")
    @classmethod
    def _agents(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        from .agents.catalog import AGENTS

        for name in v:
            if name not in AGENTS:
                raise ValueError(f"unknown agent {name!r} (known: {', '.join(AGENTS)})")
        return sorted(set(v))

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > 256:
            raise ValueError("at most 256 variables")
        for key, value in v.items():
            if not _ENV_KEY.match(key):
                raise ValueError(f"{key!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
            if _RESERVED_ENV.search(key):
                raise ValueError(f"{key} is the worker's own (LD_*, LOOM_*, HOME, USER)")
            if "\x00" in value or len(value) > 32768:
                raise ValueError(f"{key}: a value has no NUL and at most 32768 characters")
        return dict(sorted(v.items()))

    @field_validator("home_mount")
    @classmethod
    def _home_mount(cls, v: str | None) -> str | None:
        return None if v is None else check_home_mount(v)

    @field_validator("egress")
    @classmethod
    def _egress(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        try:
            return list(EgressPolicy.parse(v).entries)
        except EgressPatternError as e:
            raise ValueError(f"entry {e.entry!r} refused: {e.message}") from None

    def set_fields(self) -> dict[str, Any]:
        """The fields this workspace overrides."""
        return self.model_dump(exclude_none=True)


@dataclass(frozen=True)
class Caps:
    """The operator's upper bounds for per-workspace settings."""

    max_cpus: float = 4.0
    max_memory: int = 8 << 30
    max_pids: int = 4096
    max_idle_ttl: int = 86_400

    @classmethod
    def from_settings(cls, settings: Settings) -> Caps:
        return cls(
            max_cpus=settings.max_cpus,
            max_memory=parse_size(settings.max_memory),
            max_pids=settings.max_pids,
            max_idle_ttl=settings.max_idle_ttl,
        )


def parse(changes: dict[str, Any], base: WorkspaceSettings | None = None) -> WorkspaceSettings:
    """``base`` with ``changes`` applied (a value of None removes that override).

    Raises SettingsError naming the first bad field (unknown ones included).
    """
    merged = dict((base or WorkspaceSettings()).set_fields())
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    try:
        return WorkspaceSettings.model_validate(merged)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "settings"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            known = ", ".join(WorkspaceSettings.model_fields)
            msg = f"unknown setting (known: {known})"
        raise SettingsError(field, msg) from None


def check(s: WorkspaceSettings, caps: Caps, runtimes: set[str] | None) -> None:
    """The checks a model cannot make alone: the operator's caps, the engine's runtimes
    (None: not asked), the CA bundle on disk. Raises SettingsError."""
    if s.cpus is not None and s.cpus > caps.max_cpus:
        raise SettingsError("cpus", f"{s.cpus} is above the operator's cap of {caps.max_cpus} (LOOM_MAX_CPUS)")
    if s.memory is not None and parse_size(s.memory) > caps.max_memory:
        raise SettingsError(
            "memory", f"{s.memory} is above the operator's cap of {caps.max_memory} bytes (LOOM_MAX_MEMORY)"
        )
    if s.pids is not None and s.pids > caps.max_pids:
        raise SettingsError("pids", f"{s.pids} is above the operator's cap of {caps.max_pids} (LOOM_MAX_PIDS)")
    if s.idle_ttl is not None and s.idle_ttl > caps.max_idle_ttl:
        raise SettingsError(
            "idle_ttl", f"{s.idle_ttl} s is above the operator's cap of {caps.max_idle_ttl} s (LOOM_MAX_IDLE_TTL)"
        )
    if s.runtime is not None and runtimes is not None and s.runtime not in runtimes:
        raise SettingsError(
            "runtime", f"{s.runtime} is not installed on this Docker engine (it has: {', '.join(sorted(runtimes))})"
        )
    if s.ca_bundle is not None:
        check_ca_bundle("ca_bundle", s.ca_bundle)


def check_ca_bundle(field: str, path: str) -> None:
    """A readable PEM file with at least one certificate. Raises SettingsError."""
    problem = pem_problem(path)
    if problem is not None:
        raise SettingsError(field, problem)


def spec_for(
    base: dict[str, Any], s: WorkspaceSettings, egress_dir: Path | None = None, agents_root: Path | None = None
) -> SandboxSpec:
    """The sandbox spec of a workspace: the process defaults ``base`` (``Settings.
    sandbox_spec_kwargs()``) with its overrides; ``egress_dir``: the gateway's socket
    directory to mount when the workspace may reach the network; ``agents_root``: the
    host's agents store (:mod:`worker.agents.store`). Raises ValueError for a bad default,
    SettingsError for an agent not installed."""
    kw = dict(base)
    for key, value in s.set_fields().items():
        if key not in ("egress", "agents"):
            kw[key] = value
    if s.agents:
        kw["agents"] = agent_mounts(s.agents, agents_root)
    kw["egress_dir"] = None if egress_dir is None else str(egress_dir)
    return SandboxSpec(**kw)


def agent_mounts(names: list[str], agents_root: Path | None) -> dict[str, str]:
    """Each agent's pinned install (name -> its directory). Raises SettingsError naming
    the first one not installed."""
    from .agents.store import AgentStore

    store = AgentStore(agents_root) if agents_root is not None else None
    mounts: dict[str, str] = {}
    for name in names:
        got = store.get(name) if store is not None else None
        if got is None:
            raise SettingsError("agents", f"{name} is not installed on this host: loom-worker agent install {name}")
        mounts[name] = str(got.path)
    return mounts


class SettingsStore:
    """The settings files of the workspaces under one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self._cache: dict[Path, tuple[Any, WorkspaceSettings]] = {}
        # The file of each workspace, by the path it was asked for: :meth:`changed` runs
        # on every call, and naming the file (a realpath and a sha256) cost ~10 times the
        # stat itself.
        self._paths: dict[Path, str] = {}
        #: Also part of what :meth:`changed` compares: a stamp of other files the sandbox
        #: is made from (the secrets files, whose placeholders are in its environment).
        self.also: Callable[[Path], object] | None = None

    def path(self, workspace: Path) -> Path:
        return workspace_dir(self.data_dir, workspace) / SETTINGS_FILE

    def _file_stamp(self, workspace: Path) -> tuple[int, int, int] | None:
        path = self._paths.get(workspace)
        if path is None:
            path = self._paths[workspace] = str(self.path(workspace))
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _stamp(self, workspace: Path) -> Any:
        own = self._file_stamp(workspace)
        return own if self.also is None else (own, self.also(workspace))

    def changed(self, workspace: Path) -> bool:
        """Whether the file differs from what :meth:`load` last read (one stat: cheap
        enough for every call, so a change made by another process is seen at once)."""
        cached = self._cache.get(workspace)
        return cached is None or cached[0] != self._stamp(workspace)

    def load(self, workspace: Path) -> WorkspaceSettings:
        """The stored settings (none set when there is no file). Raises SettingsError for a
        file that does not parse (it was edited by hand), OSError when it cannot be read."""
        stamp = self._stamp(workspace)
        cached = self._cache.get(workspace)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        if self._file_stamp(workspace) is None:
            s = WorkspaceSettings()
        else:
            try:
                raw = json.loads(self.path(workspace).read_text())
            except ValueError as e:
                raise SettingsError("settings", f"{self.path(workspace)} is not JSON: {e}") from None
            if isinstance(raw, dict):
                raw.pop("workspace", None)  # written for a reader of the file, not a setting
            s = parse(raw if isinstance(raw, dict) else {"settings": raw})
        self._cache[workspace] = (stamp, s)
        return s

    def save(self, workspace: Path, s: WorkspaceSettings) -> None:
        """Write atomically (temp file, fsync, rename), readable by this user only.
        Raises OSError."""
        path = self.path(workspace)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        body = json.dumps({"workspace": str(workspace), **s.set_fields()}, indent=2, sort_keys=True) + "\n"
        write_atomic(path, body)
        self._cache[workspace] = (self._stamp(workspace), s)


@dataclass
class Configured:
    """What :meth:`~worker.registry.ToolRegistry.configure_workspace` did."""

    settings: WorkspaceSettings  # what the workspace overrides now
    effective: dict[str, Any]  # what its sandbox is made with
    changed: bool  # the sandbox's spec changed: its container is replaced at the next call
    egress_changed: bool = False  # the allowlist changed (applies to new connections at once)

    @property
    def message(self) -> str:
        if not self.changed:
            if self.egress_changed:
                return "Saved. The egress allowlist applies to the sandbox's new connections at once."
            return "Nothing changed for the sandbox."
        return (
            "Saved. The sandbox is recreated with these settings at the workspace's next call; "
            "the workspace's files are kept."
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings.set_fields(),
            "effective": self.effective,
            "recreate": self.changed,
            "message": self.message,
        }


def effective(spec: SandboxSpec, egress: EgressPolicy | None = None) -> dict[str, Any]:
    """The settings a sandbox is made with, as the operator sees them: every one a
    workspace may set, as its spec has it."""
    shown = set(WorkspaceSettings.model_fields) - {"egress"}
    return {"egress": list(egress.entries) if egress else [], **spec.model_dump(include=shown)}


class Configs:
    """One registry's view of the per-workspace settings: the store, the process
    defaults they override, and the operator's caps; with ``egress_socket_dir`` (the
    gateway's, per workspace) a workspace allowed out gets its socket mounted."""

    def __init__(
        self,
        store: SettingsStore,
        base: dict[str, Any],
        caps: Caps,
        *,
        egress_default: list[str] | None = None,
        egress_socket_dir: Callable[[Path], Path] | None = None,
        secrets: SecretsHost | None = None,
    ) -> None:
        self.store = store
        self.base = base
        self.caps = caps
        #: ``LOOM_EGRESS_ALLOW``: the allowlist of workspaces that set none (parsed once).
        self.egress_default = EgressPolicy.parse(egress_default or [])
        self.egress_socket_dir = egress_socket_dir
        #: The secrets (:class:`worker.egress.provision.SecretsHost`): a sandbox allowed out
        #: gets their placeholders and the workspace CA in its spec; a change to them is a
        #: change of its settings.
        self.secrets = secrets
        if secrets is not None:
            store.also = secrets.stamp

    def policy(self, workspace: Path, s: WorkspaceSettings | None = None) -> EgressPolicy:
        """The workspace's egress allowlist (with ``s``: under those settings; else as
        stored now): its own, else the default. Raises SettingsError (a settings file
        edited into something invalid)."""
        own = (s if s is not None else self.store.load(workspace)).egress
        if own is None:
            return self.egress_default
        return _parsed_policy(tuple(own))

    def spec(self, workspace: Path, s: WorkspaceSettings | None = None) -> SandboxSpec:
        """The workspace's spec (with ``s``: under those settings). Raises SettingsError
        (a settings file edited into something invalid), OSError (the trust bundle of its
        secrets cannot be written)."""
        if s is None:
            s = self.store.load(workspace)
        egress_dir = None
        if self.egress_socket_dir is not None and self.policy(workspace, s):
            egress_dir = self.egress_socket_dir(workspace)
        spec = spec_for(self.base, s, egress_dir, self.store.data_dir / AGENTS_DIR)
        if egress_dir is not None and self.secrets is not None:
            given = self.secrets.for_sandbox(workspace, spec.ca_bundle, egress_dir)  # OSError
            if given is not None:
                spec = spec.model_copy(update={"env": {**spec.env, **given.env}, "ca_bundle": given.ca_bundle})
        return spec

    def effective(self, workspace: Path, s: WorkspaceSettings | None = None) -> dict[str, Any]:
        return effective(self.spec(workspace, s), self.policy(workspace, s))

    def trust_dir(self, workspace: Path) -> Path:
        """Where the copies of CA bundles a sandbox mounts are written
        (:func:`worker.pem.trusted_copy`): beside the egress sockets, whose directory has
        the same path for the worker and the engine when the worker is a container (the
        data directory need not), else under the data directory."""
        if self.egress_socket_dir is not None:
            return self.egress_socket_dir(workspace).parent / TRUST_DIR
        return self.store.data_dir / TRUST_DIR


@functools.lru_cache(maxsize=256)
def _parsed_policy(entries: tuple[str, ...]) -> EgressPolicy:
    # Each egress connection asks for its workspace's policy: parse a list once.
    return EgressPolicy.parse(entries)
