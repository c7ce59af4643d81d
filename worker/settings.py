"""Configuration, read once at the entry point (``LOOM_`` environment variables).

Library code never calls ``os.getenv``: it takes values. Each area keeps its settings in
its own block below so they stay easy to find.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .limits import MAX_REQUEST_BYTES, MIN_REQUEST_BYTES
from .sandbox_settings import Image, SandboxSettings, Size


def _default_data_dir() -> Path:
    """The user's data directory (``~/.local/share/loom-worker`` on Linux)."""
    return Path(platformdirs.user_data_dir("loom-worker", appauthor=False))


class Settings(SandboxSettings, BaseSettings):
    """Every ``LOOM_*`` setting: the sandbox's (:class:`~worker.sandbox_settings.SandboxSettings`,
    declared there) and the process's own."""

    # -- sandbox (issue 2) -----------------------------------------------------------
    docker_host: str | None = Field(None, description="Docker endpoint (default: DOCKER_HOST or the socket).")
    max_parallel_starts: int = Field(
        16,
        ge=1,
        le=256,
        description="Sandboxes the engine is asked to start at once, and (separately) agents booted in "
        "started ones at once; first calls beyond it wait their turn (many workspaces opened at once "
        "start side by side, as a pipeline, without thrashing the engine).",
    )

    model_config = SettingsConfigDict(env_prefix="LOOM_", extra="ignore")

    # -- warm sandboxes (issue 44) ---------------------------------------------------------
    warm_pool: str = Field(
        "off",
        description="Started sandboxes kept ready for new workspaces (under gVisor only for an empty workspace "
        "directory on the pool's mount; docs/sandbox.md#warm-sandboxes): "
        "off; a number N (N per class of image, runtime, settings and user); auto (per class one more than the "
        "most claims seen within one refill time in the last minute, up to LOOM_WARM_POOL_MAX). Needs a worker "
        "running as root on the engine's host; otherwise it stays off and doctor says why.",
    )
    warm_pool_max: int = Field(
        32, ge=1, le=1024, description="Warm sandboxes of every class together (each holds its memory and pids)."
    )
    warm_pool_freeze: bool = Field(
        False,
        description="Freeze gVisor warm sandboxes while they wait (an idle one costs ~2.5% of a core under "
        "runsc 20240729's systrap). A frozen one blocks the engine: stop the worker before restarting Docker, "
        "and remove them with `gc`, not `docker rm -f` (docs/sandbox.md).",
    )
    warm_pool_dir: Path | None = Field(
        None,
        description="Host directory of the warm sandboxes' slots (default <data_dir>/pool); made a shared mount. "
        "gVisor's slots are made beside it, in <dir>-runsc.",
    )

    # -- per-workspace settings: the operator's caps (issue 15) -------------------------
    max_cpus: float = Field(4.0, gt=0, le=64, description="Most CPUs a workspace's settings may ask for.")
    max_memory: Size = Field("8g", description="Most memory a workspace's settings may ask for.")
    max_pids: int = Field(4096, ge=16, le=65536, description="Most processes a workspace's settings may ask for.")
    max_idle_ttl: int = Field(86_400, ge=10, description="Longest idle TTL a workspace's settings may ask for.")

    # -- background processes (issue 17) -----------------------------------------------------
    max_processes: int = Field(8, ge=1, le=64, description="Background processes running at once per workspace.")
    process_timeout: float = Field(
        3600.0, gt=0, description="Default timeout of a background process (seconds); its whole tree is killed."
    )
    max_process_timeout: float = Field(86_400.0, gt=0, description="Longest timeout a background process may ask.")
    process_linger: float = Field(
        600.0, ge=0, description="Seconds an ended background process's output can still be read."
    )

    # -- network egress (issue 16) ---------------------------------------------------------
    egress_allow: str | None = Field(
        None,
        description="Default egress allowlist of every workspace, comma-separated (pypi.org, *.example.com, "
        "host:8443, presets pypi/npm/debian/github, !denied.host). Unset: no network at all.",
    )
    egress_dir: Path | None = Field(
        None,
        description="Host directory of the egress gateway's sockets (default <data_dir>/egress); under "
        "`docker compose up` a path that is the same inside the worker and on the host.",
    )
    egress_trusted_networks: str | None = Field(
        None,
        description="Networks the gateway may dial although private or local (an internal mirror, a test "
        "server), comma-separated CIDRs; the allowlist still applies.",
    )
    egress_hosts: str | None = Field(
        None,
        description="Names the gateway dials at a fixed address instead of resolving them, comma-separated "
        "host[:port]=address[:port] (api.anthropic.com=127.0.0.1:8443): a mock or mirror under the real name. "
        "The allowlist, address checks (LOOM_EGRESS_TRUSTED_NETWORKS), TLS checks and secrets still apply "
        "to the name.",
    )
    egress_max_connections: int = Field(64, ge=1, le=4096, description="Open egress connections per workspace.")
    egress_bytes_per_minute: str = Field(
        "4g", description="Egress bytes per workspace per minute (both ways); a flood beyond is cut."
    )

    # -- secrets at the egress gateway (issue 30) -------------------------------------------
    egress_upstream_ca: Path | None = Field(
        None,
        description="PEM bundle the egress gateway also trusts when it verifies the real host of a secret "
        "(a private registry, a test server), on top of this host's own trust store. Secrets themselves "
        "are set with `loom-worker secret set` or PUT /v1/workspaces/{id}/secrets/{name}, never here.",
    )

    # -- data (issue 4) --------------------------------------------------------------
    data_dir: Path = Field(default_factory=_default_data_dir, description="Changelog and index storage.")
    durability: Literal["full", "process"] = Field(
        "full",
        description="full: a change's entry and new content are fsync'd before the file is replaced, "
        "its directory right after the answer (survives power loss); "
        "process: no fsync (survives a killed worker or agent, not a power loss), much faster.",
    )
    changelog_max_file_bytes: int = Field(
        16 << 20, ge=0, le=16 << 20, description="Larger files changed by commands get no before-image."
    )
    changelog_max_total_bytes: int = Field(
        1 << 30, ge=0, description="Content the shell baseline keeps per workspace; beyond it, stat only."
    )
    changelog_max_files: int = Field(200_000, ge=1, description="Files a change scan walks (beyond: reported).")
    changelog_reserve_bytes: int = Field(
        64 << 20,
        ge=0,
        description="Free space the data directory must have before a command or write starts (room to record "
        "its changes); below it the call is refused as a limit, nothing run. 0: no check.",
    )
    call_journal_bytes: int = Field(
        16 << 20,
        ge=0,
        description="History of tool calls kept per workspace (the dashboard's timeline, GET .../calls); "
        "0: none recorded.",
    )
    # -- snapshots and forks (issue 29) --------------------------------------------------
    max_snapshots: int = Field(
        32, ge=1, le=10_000, description="Snapshots kept per workspace; one more is refused until one is deleted."
    )
    max_snapshot_bytes: str = Field(
        "64g",
        description="Bytes the snapshot store may hold (the apparent size of every snapshot's files, whatever "
        "copy-on-write shares); a snapshot beyond it is refused.",
    )
    snapshot_strategy: Literal["auto", "btrfs", "reflink", "overlay", "copy"] = Field(
        "auto",
        description="How snapshots and forks copy a tree: auto tries btrfs subvolume snapshots, then reflinks "
        "(XFS, btrfs), then (forks only) an overlay volume the local Docker engine mounts (ext4 and any "
        "filesystem overlay2 runs on), then a plain copy; a name starts the list there.",
    )
    changelog_ignored_dirs: list[str] | None = Field(
        None, description='Directory names tracked by stat only (JSON list; default "node_modules", ".venv", ...).'
    )

    @field_validator("warm_pool")
    @classmethod
    def _warm_pool(cls, v: str) -> str:
        v = v.strip().lower()
        if v in ("off", "auto") or (v.isdigit() and 0 <= int(v) <= 1024):
            return "off" if v == "0" else v
        raise ValueError(f"off, auto or a number of sandboxes from 0 to 1024, not {v!r}")

    def pool_config(self) -> Any:
        """The Docker backend's :class:`~sandbox.docker.pool.PoolConfig` of these settings."""
        from sandbox.docker.pool import PoolConfig

        root = self.warm_pool_dir or self.data_dir / "pool"
        if self.warm_pool == "off":
            return PoolConfig(mode="off", root=root)
        if self.warm_pool == "auto":
            return PoolConfig(
                mode="demand",
                size=self.warm_pool_max,
                max_total=self.warm_pool_max,
                root=root,
                freeze=self.warm_pool_freeze,
            )
        top, freeze = self.warm_pool_max, self.warm_pool_freeze
        return PoolConfig(mode="fixed", size=int(self.warm_pool), max_total=top, root=root, freeze=freeze)

    @field_validator("egress_allow")
    @classmethod
    def _egress_allow(cls, v: str | None) -> str | None:
        from .egress.policy import EgressPatternError, EgressPolicy, parse_allow_env

        try:
            EgressPolicy.parse(parse_allow_env(v))
        except EgressPatternError as e:
            raise ValueError(f"LOOM_EGRESS_ALLOW entry {e.entry!r} refused: {e.message}") from None
        return v

    @field_validator("egress_trusted_networks")
    @classmethod
    def _egress_trusted(cls, v: str | None) -> str | None:
        from .egress.addresses import parse_networks

        parse_networks(v)  # ValueError naming the entry
        return v

    @field_validator("egress_hosts")
    @classmethod
    def _egress_hosts(cls, v: str | None) -> str | None:
        from .egress.overrides import parse_overrides

        parse_overrides(v)  # OverrideError (a ValueError) naming the entry
        return v

    @field_validator("egress_upstream_ca")
    @classmethod
    def _upstream_ca(cls, v: Path | None) -> Path | None:
        if v is not None:
            from .pem import pem_problem

            problem = pem_problem(str(v))
            if problem is not None:
                raise ValueError(problem)
        return v

    @field_validator("max_snapshot_bytes")
    @classmethod
    def _snapshot_bytes(cls, v: str) -> str:
        from sandbox.spec import parse_size

        parse_size(v)
        return v

    @field_validator("egress_bytes_per_minute")
    @classmethod
    def _egress_rate(cls, v: str) -> str:
        from sandbox.spec import parse_size

        parse_size(v)
        return v

    def changelog_limits(self) -> Any:
        """The changelog's :class:`~worker.changelog.Limits` from these settings."""
        from .changelog import Limits

        extra: dict[str, Any] = {}
        if self.changelog_ignored_dirs is not None:
            extra["ignored_dirs"] = tuple(self.changelog_ignored_dirs)
        return Limits(
            max_file_bytes=self.changelog_max_file_bytes,
            max_total_bytes=self.changelog_max_total_bytes,
            max_files=self.changelog_max_files,
            durability=self.durability,
            reserve_bytes=self.changelog_reserve_bytes,
            **extra,
        )

    # -- service (issue 5) -----------------------------------------------------------
    workspace_root: Path = Field(Path("/srv/loom/workspaces"), description="Directory of HTTP workspaces.")
    api_token: str | None = Field(None, description="Bearer token required by the HTTP API.")
    e2b_api: bool | None = Field(
        None,
        description="Serve E2B's API beside loom's (docs/e2b.md): None: when the e2b extra is installed "
        "(pip install 'loom-worker[e2b]'); true: refuse to start without it; false: never.",
    )
    host: str = Field("127.0.0.1", description="HTTP bind address.")
    port: int = Field(8080, ge=1, le=65535, description="HTTP port.")
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="Log lines on stderr: JSON, console, or auto (console on a terminal, JSON otherwise)."
    )
    log_level: str = Field("info", description="Lowest level logged: debug, info, warning, error.")
    max_concurrent_calls: int = Field(64, ge=1, le=10_000, description="In-flight HTTP/MCP calls before 429.")
    mcp_native_tools: bool = Field(
        False,
        description="MCP also lists Anthropic's `bash` and `str_replace_based_edit_tool` by those names "
        "(docs/native-tools.md); `loom-worker mcp --native-tools` for one stdio server.",
    )
    max_body_bytes: int = Field(
        MAX_REQUEST_BYTES,
        ge=MIN_REQUEST_BYTES,
        description="Largest request accepted on every surface, refused while it is read: an HTTP body (413 "
        "beyond), an MCP message (stdio and HTTP), a call sent to the CLI's local worker (worker/limits.py).",
    )
    stop_sandboxes_on_exit: bool = Field(
        True,
        description="`serve` stops the sandboxes it used when it shuts down (`LOOM_MAX_PARALLEL_STARTS` at a time).",
    )

    # -- E2B's API (issue 42; worker/integrations/e2b, docs/e2b.md) -----------------------
    e2b_templates: dict[str, Image] = Field(
        {},
        description='E2B templates and the images they are (JSON object, e.g. {"my-template": '
        '"python:3.12-slim"}); base, code-interpreter-v1 and code-interpreter are LOOM_IMAGE unless named here.',
    )
    e2b_max_timeout: int = Field(
        86_400,
        ge=1,
        description="Longest lifetime (seconds) an E2B sandbox may be given (create, set_timeout, connect).",
    )
    e2b_max_sandboxes: int = Field(
        100, ge=1, description="E2B sandboxes running at once (paused ones not counted); one more is refused (429)."
    )
    e2b_allow_root: bool = Field(
        False,
        description='E2B\'s sandboxes are made with allow_root, so that commands may run as root (user="root", '
        "sudo-less installs); off: root is refused as in any workspace (docs/harness.md has the trade).",
    )
    e2b_warm_sandboxes: int = Field(
        2,
        ge=0,
        le=64,
        description="E2B sandboxes of the plain kind (default image, no env vars, default network) kept started "
        "ahead, so a create's first command does not wait for a container; 0: none. Made once a create came.",
    )
    e2b_kill_deletes: bool = Field(
        False,
        description="E2B's kill (and a timeout) also deletes the sandbox's workspace; by default its files and "
        "changelog are kept for `loom-worker log` and undo, and the sandbox is gone for E2B's API only.",
    )

    # -- the CLI's local worker (issue 18) ---------------------------------------------
    # The CLI reads LOOM_CLI_DAEMON from the environment itself, with the same meaning:
    # constructing these settings costs more than a whole call through the worker.
    cli_daemon: bool = Field(
        True,
        description="`loom-worker call` and `batch` go through a per-user local worker that keeps "
        "connections warm (started on first use); false: every call runs in the CLI's own process.",
    )
    cli_daemon_idle: int = Field(900, ge=1, description="Seconds without calls before the local worker exits.")

    # -- catalog (issue 6) -----------------------------------------------------------
    tools_dir: Path | None = Field(None, description="Custom tool YAML files (default: <data_dir>/tools).")
    llm_base_url: str | None = Field(None, description="OpenAI-compatible chat endpoint for tool search.")
    llm_model: str | None = Field(None, description="Chat model used to re-rank / expand tool searches.")
    llm_api_key: str | None = Field(None, description="Bearer key for the chat endpoint.")
    llm_timeout: float = Field(10.0, gt=0, le=120, description="Seconds per chat request, then FAST.")
    mcp_servers_file: Path | None = Field(
        None, description="MCP servers config (default: <data_dir>/mcp_servers.yaml)."
    )
    catalog: bool = Field(
        True, description="default_registry adds tool_search, custom YAML tools and MCP servers' tools."
    )

    def sandbox_spec_kwargs(self) -> dict[str, object]:
        """The :class:`sandbox.spec.SandboxSpec` of these settings (its keyword arguments)."""
        from .owner import owner_id

        return {
            **self.spec_kwargs(),
            # gVisor's direct channels live beside the egress gateway's sockets: a
            # directory with the same path in the worker and on the engine's host (compose).
            "channel_dir": str((self.egress_dir or self.data_dir / "egress") / "channels"),
            # gc removes only this data directory's sandboxes (worker/owner.py).
            "owner": owner_id(self.data_dir),
        }


def describe_errors(error: Any) -> str:
    """A pydantic ``ValidationError`` of :class:`Settings` as ``LOOM_NAME: problem; ...``,
    naming the variables to fix."""
    problems = []
    for err in error.errors(include_url=False):
        name = "LOOM_" + "_".join(str(p) for p in err["loc"][:1]).upper()
        problems.append(f"{name}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)


def describe_source_error(error: Exception) -> str:
    """pydantic-settings' own error (a value it could not decode, before validation) as
    ``LOOM_NAME: not valid JSON``."""
    import re

    m = re.search(r'field "(\w+)"', str(error))
    return f"LOOM_{m.group(1).upper()}: not valid JSON" if m else str(error).splitlines()[0]
