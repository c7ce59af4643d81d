"""The ``loom`` sandbox's configuration: a pydantic model, or the YAML file that holds it.

::

    # loom.yaml: every field optional
    image: loom-sandbox:latest     # any image on the engine with /bin/sh
    runtime: runsc                 # runc (default) or runsc (gVisor)
    cpus: 1
    memory: 1g
    pids: 256
    env: {PYTHONHASHSEED: "0"}
    egress: [pypi]                 # hosts the sandbox may reach; none by default
    allow_root: false              # exec as root (adduser, apt...): see docs/harness.md
    files: {data/input.csv: ./fixtures/input.csv}   # host files copied in at sample init
    workspace_root: /var/tmp/evals # where each sample's workspace is made
    keep_workspace: false          # keep it after the sample (its sandbox is removed)
    services:                      # several sandboxes per sample: one workspace each
      default: {}                  #   the first (or the one named "default") is the default
      db: {image: loom-sandbox:minimal}

A service's fields override the top-level ones; without ``services`` the sample has one
sandbox, ``default``. Every value is checked when the config is read: a bad one fails the
task before any sample starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

#: The fields that are the workspace's sandbox settings (``worker.workspace_settings``).
SETTINGS = ("image", "runtime", "cpus", "memory", "pids", "env", "egress", "allow_root", "ca_bundle")


class LoomServiceConfig(BaseModel):
    """One sandbox of a sample (what ``services`` maps a name to)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str | None = Field(None, description="Sandbox image (on the engine; default LOOM_IMAGE).")
    runtime: Literal["runc", "runsc"] | None = Field(None, description="runsc for gVisor.")
    cpus: float | None = Field(None, gt=0, description="CPU limit.")
    memory: str | None = Field(None, description="Memory limit, e.g. 2g.")
    pids: int | None = Field(None, ge=16, description="Process limit.")
    env: dict[str, str] | None = Field(None, description="Variables of every process in the sandbox.")
    egress: list[str] | None = Field(None, description="Hosts it may reach (pypi.org, presets pypi/npm/...).")
    allow_root: bool | None = Field(None, description="Commands may run as root (see docs/harness.md).")
    ca_bundle: str | None = Field(None, description="PEM file on the host: the sandbox's trust store.")
    files: dict[str, str] = Field(
        default_factory=dict, description="Sandbox path -> host file, copied in at sample init."
    )
    workspace: str | None = Field(
        None, description="A fixed host directory as the workspace (kept, its files too); default: fresh per sample."
    )

    def settings(self) -> dict[str, Any]:
        """The workspace settings this service sets (``configure_workspace``'s changes)."""
        return {k: getattr(self, k) for k in SETTINGS if getattr(self, k) is not None}

    @model_validator(mode="after")
    def _as_workspace_settings(self) -> LoomServiceConfig:
        # Every rule of a workspace's settings (an image reference, a size, at least 0.1
        # CPU, variable names, egress entries), so a bad one fails the task, not a sample.
        from ...workspace_settings import SettingsError, parse

        try:
            parse(self.settings())
        except SettingsError as e:
            raise ValueError(f"{e.field}: {e.message}") from None
        return self


class LoomSandboxConfig(LoomServiceConfig):
    """The ``loom`` sandbox of a task: its (default) service's fields, where samples'
    workspaces are made, and more services."""

    workspace_root: str | None = Field(
        None, description="Where each sample's fresh workspaces are made (default: <temp dir>/loom-inspect)."
    )
    keep_workspace: bool = Field(False, description="Keep a sample's fresh workspaces after it (not its sandboxes).")
    uid: int | None = Field(
        None, ge=1, description="Owner of fresh workspaces (the sandbox's user); default: ours, or 1000 as root."
    )
    gid: int | None = Field(None, ge=0, description="Their group (default: the uid's).")
    services: dict[str, LoomServiceConfig] | None = Field(
        None, description="Several sandboxes per sample, by name: the first (or 'default') is the default."
    )

    @field_validator("services")
    @classmethod
    def _names(cls, v: dict[str, LoomServiceConfig] | None) -> dict[str, LoomServiceConfig] | None:
        if v is not None:
            if not v:
                raise ValueError("services: name at least one")
            for name in v:
                if not name or not all(c.isalnum() or c in "-_." for c in name) or len(name) > 64:
                    raise ValueError(f"services: {name!r} is not a name (letters, digits, - _ .)")
        return v

    def service_items(self) -> list[tuple[str, LoomServiceConfig]]:
        """``(name, its config)`` in order, the default first, each with the top-level
        fields it does not set itself."""
        base = {k: v for k, v in self.model_dump(exclude_unset=True).items() if k in LoomServiceConfig.model_fields}
        if not self.services:
            return [("default", LoomServiceConfig(**base))]
        items = [
            (name, LoomServiceConfig(**{**base, **svc.model_dump(exclude_unset=True)}))
            for name, svc in self.services.items()
        ]
        items.sort(key=lambda item: item[0] != "default")  # stable: otherwise the first stays first
        return items

    def owner(self) -> tuple[int, int]:
        """Who owns a fresh workspace, and so runs its commands: never root (root in a
        sandbox is ``allow_root``'s, never the owner's)."""
        uid = self.uid if self.uid is not None else (os.getuid() or 1000)
        gid = self.gid if self.gid is not None else (uid if self.uid is not None or not os.getuid() else os.getgid())
        return uid, gid


def load(config: Any) -> LoomSandboxConfig:
    """The config inspect passes: None (defaults), a :class:`LoomSandboxConfig`, a dict,
    or the path of a YAML file. Raises ValueError naming the problem (a file that is not
    there or not YAML, a bad field)."""
    if config is None:
        return LoomSandboxConfig()
    if isinstance(config, LoomSandboxConfig):
        return config
    if isinstance(config, str):
        import yaml

        path = Path(config).expanduser()
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise ValueError(f"loom sandbox config {config}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ValueError(f"loom sandbox config {config}: not YAML ({e})") from None
        config = raw
        where = f"loom sandbox config {path}"
    else:
        where = "loom sandbox config"
    if isinstance(config, BaseModel):
        config = config.model_dump(exclude_unset=True)
    if not isinstance(config, dict):
        raise ValueError(f"{where}: a mapping of settings, not {type(config).__name__}")
    try:
        return LoomSandboxConfig.model_validate(config)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "config"
        raise ValueError(f"{where}: {field}: {first['msg']}") from None
