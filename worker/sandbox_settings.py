"""The sandbox's settings, declared once: image, runtime, limits, TTL, tmpfs sizes, CA
bundle, ... each with its one description and its one validator.

:class:`SandboxSettings` holds them. The process-wide settings
(:class:`worker.settings.Settings`, ``LOOM_IMAGE``, ``LOOM_MEMORY``, ...) contain them;
the per-workspace settings (:class:`worker.workspace_settings.WorkspaceSettings`) are the
ones a workspace may override (:data:`PER_WORKSPACE`), the same types and descriptions,
optional; a :class:`~sandbox.spec.SandboxSpec` is built from them
(:meth:`SandboxSettings.spec_kwargs`). The bounds of the limits are the spec's own
(:mod:`sandbox.spec`: ``Cpus``, ``Pids``, ...), so a value these accept the spec accepts.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field
from pydantic.fields import FieldInfo

from sandbox.pulls import check_reference, parse_registries
from sandbox.spec import Cpus, GvisorPlatform, IdleTtl, NonNegative, Pids, Pull, Runtime, parse_size

#: The least memory a sandbox may be given: below it the agent's runtime does not start.
MIN_MEMORY = 64 << 20


def _image(v: str) -> str:
    if v != v.strip() or any(c.isspace() or c == "\x00" for c in v):
        raise ValueError("an image name has no spaces")
    return check_reference(v)


def _size(v: str) -> str:
    parse_size(v)  # ValueError: "not a size"
    return v.strip().lower()


def _size_or_zero(v: str) -> str:
    return "0" if v.strip() == "0" else _size(v)


def _memory(v: str) -> str:
    if parse_size(v) < MIN_MEMORY:
        raise ValueError("at least 64m")
    return v.strip().lower()


def _registries(v: str) -> str:
    parse_registries(v)  # ValueError naming the entry
    return v


def _absolute(v: str) -> str:
    if not os.path.isabs(v) or "\x00" in v:
        raise ValueError("an absolute path on the host")
    return v


Image = Annotated[str, Field(min_length=1, max_length=512), AfterValidator(_image)]
Size = Annotated[str, Field(max_length=32), AfterValidator(_size)]
SizeOrZero = Annotated[str, Field(max_length=32), AfterValidator(_size_or_zero)]
Memory = Annotated[str, Field(max_length=32), AfterValidator(_memory)]


def _fspath(v: Any) -> Any:
    # A caller of the Python API may give a pathlib.Path, as the setting took before.
    return os.fspath(v) if isinstance(v, os.PathLike) else v


HostPath = Annotated[str, BeforeValidator(_fspath), Field(max_length=4096), AfterValidator(_absolute)]
Registries = Annotated[str, AfterValidator(_registries)]


class SandboxSettings(BaseModel):
    """What every sandbox is made with, unless its workspace overrides it."""

    # -- sandbox (issue 2) -----------------------------------------------------------
    image: Image = Field("loom-sandbox:latest", description="Sandbox image (any Linux image with /bin/sh).")
    agent_runtime_image: Image = Field(
        "loom-agent-runtime:latest", description="Image the agent's own interpreter is mounted from (images/runtime)."
    )
    runtime: Runtime = Field("runc", description="OCI runtime; runsc = gVisor.")
    gvisor_platform: GvisorPlatform = Field(
        "systrap",
        description="gVisor's platform under runsc: systrap (fastest here, gVisor's default), ptrace (slowest, "
        "runs anywhere), kvm (needs /dev/kvm with hardware virtualization). The engine needs a runtime for it "
        "(runsc-<platform>, or runsc registered with it: `loom-worker setup --register-gvisor`); a sandbox on "
        "another platform is refused.",
    )
    cpus: Cpus = Field(1.0, description="CPU limit per sandbox; at least 0.1 (with less, gVisor takes 40 s to start).")
    memory: Memory = Field("1g", description="Memory limit per sandbox, e.g. 2g; at least 64m (swap is set equal).")
    pids: Pids = Field(256, description="Process limit per sandbox.")
    tmp_size: Size = Field("256m", description="Size of the /tmp tmpfs.")
    home_size: Size = Field("128m", description="Size of the $HOME tmpfs.")
    max_file_size: Size = Field("4g", description="Largest file a sandbox process may write (RLIMIT_FSIZE).")
    disk_limit: SizeOrZero = Field(
        "8g", description="Disk one command may consume in the workspace; beyond: stopped (0: none)."
    )
    inode_limit: NonNegative = Field(1_000_000, description="Files one command may create in the workspace (0: none).")
    disk_reserve: SizeOrZero = Field(
        "1g", description="Free space kept on the workspace's disk: commands and writes stop short of it (0: none)."
    )
    uid: NonNegative | None = Field(None, description="Run as this uid instead of the workspace owner.")
    gid: NonNegative | None = Field(None, description="Run as this gid instead of the workspace owner's.")
    idle_ttl: IdleTtl = Field(900, description="Seconds without calls before a sandbox exits by itself.")
    direct_channel: bool = Field(
        True,
        description="Talk to runc sandboxes over a unix socket reached through /proc/<pid>/root "
        "instead of the engine's attach stream (falls back to it when unreachable).",
    )
    pull: Pull = Field(
        "missing",
        description="When a sandbox image is pulled: missing (not on the engine), never (build or load it "
        "first), always (before every new container). Credentials: Docker's own (docker login).",
    )
    registries: Registries = Field(
        "docker.io",
        description="Registries images may be pulled from, comma-separated host[:port] as image names write "
        'them (docker.io for names without one; "" for none). Images already on the engine are used anyway.',
    )
    ca_bundle: HostPath | None = Field(
        None,
        description="PEM file on the host (an absolute path) mounted read-only into sandboxes as the trust store "
        "of pip, npm, git, curl, requests and Node (a TLS-intercepting proxy's CA); per workspace too.",
    )

    def spec_kwargs(self) -> dict[str, Any]:
        """The :class:`~sandbox.spec.SandboxSpec` these settings make (as its keyword
        arguments; the spec parses the sizes)."""
        return {
            "image": self.image,
            "runtime": self.runtime,
            "gvisor_platform": self.gvisor_platform,
            "cpus": self.cpus,
            "memory": self.memory,
            "pids": self.pids,
            "tmp_size": self.tmp_size,
            "home_size": self.home_size,
            "max_file_size": self.max_file_size,
            "disk_limit": self.disk_limit,
            "disk_reserve": self.disk_reserve,
            "inode_limit": self.inode_limit,
            "uid": self.uid,
            "gid": self.gid,
            "idle_ttl": self.idle_ttl,
            "direct": self.direct_channel,
            "agent_runtime_image": self.agent_runtime_image,
            "pull": self.pull,
            "registries": parse_registries(self.registries),
            "ca_bundle": self.ca_bundle,
        }


#: The settings a workspace may override (the rest are the operator's alone).
PER_WORKSPACE = ("image", "runtime", "cpus", "memory", "pids", "idle_ttl", "ca_bundle", "tmp_size", "home_size")


def override(name: str) -> Any:
    """The field of a per-workspace override of setting ``name``: absent (None) by
    default, with the setting's description."""
    field: FieldInfo = SandboxSettings.model_fields[name]
    return Field(None, description=field.description)
