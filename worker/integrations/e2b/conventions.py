"""E2B's sandbox conventions, mapped onto loom's: what a create (or a connect, a network
update) asks for, as a workspace's settings.

- **Templates are images** (``LOOM_E2B_TEMPLATES``): ``base``, ``code-interpreter-v1`` and
  ``code-interpreter`` are the service's default image (LOOM_IMAGE) unless that setting
  names them; a snapshot's id or name is a template too (a sandbox made from it is a fork
  of it); any other name is refused, naming the setting.
- **/home/user is the workspace**: every E2B sandbox has the workspace mounted a second
  time at ``/home/user`` (the ``home_mount`` setting), its ``$HOME`` and ``$USER``, so
  E2B's paths and its users' code work as written and what they write is recorded.
- **envVars** are the workspace's environment (the ``env`` setting).
- **Network**: ``allow_internet_access`` true (or unset) is the operator's default egress
  allowlist (``LOOM_EGRESS_ALLOW``), never the whole internet; false is no egress at all.
  ``network.allowOut`` adds hosts (names, ``*.domain``, addresses) to it, an allowOut of
  ``0.0.0.0/0`` is that default again; ``network.denyOut`` of ``0.0.0.0/0`` starts from
  nothing, single addresses in it are denials. Loom's gateway matches names and ports (80
  and 443 unless an entry names one), not address blocks: a CIDR block wider than one
  address, and the fields loom has no equivalent of (``egressProxy``, ``rules``,
  ``dnsServers``, ``maskRequestHost``, ``httpsPorts``, ``allowPublicTraffic``), are
  refused with 501 naming the field.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from worker.egress.policy import EgressPatternError, EgressPolicy, parse_allow_env
from worker.settings import Settings

from .answers import E2BError, not_offered
from .records import DEFAULT_TIMEOUT

#: The templates every service has: its default image.
BUILTIN_TEMPLATES = ("base", "code-interpreter-v1", "code-interpreter")
#: E2B's user's home, and the working directory of its commands: the workspace.
E2B_HOME = "/home/user"
_ALL_TRAFFIC = ("0.0.0.0/0", "::/0")


class _Body(BaseModel):
    """A request body: fields E2B spells in camelCase (and one in snake_case), unknown
    ones ignored as E2B's API ignores them."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class AutoResume(_Body):
    enabled: bool = False


class NewSandbox(_Body):
    """E2B's ``NewSandbox`` (``POST /sandboxes``, ``POST /v2/sandboxes``)."""

    template_id: str = Field(alias="templateID", min_length=1, max_length=256)
    timeout: int | None = Field(None, ge=0)
    auto_pause: bool | None = Field(None, alias="autoPause")
    auto_pause_memory: bool | None = Field(None, alias="autoPauseMemory")
    auto_resume: AutoResume | None = Field(None, alias="autoResume")
    secure: bool | None = None
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(None, alias="envVars")
    mcp: dict[str, Any] | None = None
    iam: dict[str, Any] | None = None
    volume_mounts: list[Any] | None = Field(None, alias="volumeMounts")

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None and (len(v) > 64 or any(len(k) > 256 or len(x) > 4096 for k, x in v.items())):
            raise ValueError("at most 64 entries, keys of at most 256 characters and values of at most 4096")
        return v


class Timeout(_Body):
    """``SandboxTimeoutRequest``, ``ConnectSandbox``, ``ResumedSandbox``, ``SandboxRefreshRequest``."""

    timeout: int | None = Field(None, ge=0)
    duration: int | None = Field(None, ge=0)
    auto_pause: bool | None = Field(None, alias="autoPause")
    #: connect's: False reboots instead of restoring memory (loom's pause keeps none anyway).
    memory: bool | None = None


def parse_body(model: type[BaseModel], raw: Any) -> Any:
    """``raw`` (a JSON value) as ``model``. Raises E2BError 400 naming the field."""
    try:
        return model.model_validate({} if raw is None else raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        raise E2BError(400, f"{where}: {err['msg']}") from None


def template_image(settings: Settings, template: str) -> str | None:
    """The image of E2B template ``template`` (None when it is not one: a snapshot's, or
    unknown). A tag loom ignores (``base:latest``, ``base:default``) is allowed."""
    images = settings.e2b_templates
    for name in (template, template.rsplit(":", 1)[0] if template.endswith((":latest", ":default")) else None):
        if name is None:
            continue
        if name in images:
            return images[name]
        if name in BUILTIN_TEMPLATES:
            return settings.image
    return None


def unknown_template(settings: Settings, template: str) -> E2BError:
    known = sorted({*BUILTIN_TEMPLATES, *settings.e2b_templates})
    return E2BError(
        404,
        f"template {template!r} not found: loom-worker's templates are images named in LOOM_E2B_TEMPLATES "
        f"(this service has: {', '.join(known)}), or a snapshot's id",
    )


def check_timeout(settings: Settings, timeout: int, what: str = "timeout") -> int:
    """``timeout`` if within ``LOOM_E2B_MAX_TIMEOUT``. Raises E2BError 400."""
    if timeout > settings.e2b_max_timeout:
        raise E2BError(
            400,
            f"{what} of {timeout} s is longer than this service allows ({settings.e2b_max_timeout} s, "
            "LOOM_E2B_MAX_TIMEOUT)",
        )
    return timeout


@dataclass
class CreatePlan:
    """What a create asks of loom: the workspace's settings and the sandbox's record."""

    template: str
    timeout: int
    metadata: dict[str, str]
    env_vars: dict[str, str]
    allow_internet_access: bool | None
    network: dict[str, Any] | None
    auto_pause: bool
    auto_resume: bool
    #: The workspace's own settings (``home_mount``, ``env``, ``egress``, ``image``).
    settings: dict[str, Any] = field(default_factory=dict)


def base_settings(settings: Settings) -> dict[str, Any]:
    """The settings of every E2B sandbox's workspace: ``/home/user``, and root where the
    operator allows it for E2B's sandboxes (``LOOM_E2B_ALLOW_ROOT``)."""
    own: dict[str, Any] = {"home_mount": E2B_HOME}
    if settings.e2b_allow_root:
        own["allow_root"] = True
    return own


def plan_create(settings: Settings, body: NewSandbox, *, default_timeout: int = DEFAULT_TIMEOUT) -> CreatePlan:
    """The plan of a create (the template not resolved yet: a snapshot is looked up by
    the caller). Raises E2BError: 400 a value refused, 501 what loom does not offer."""
    if body.mcp:
        raise not_offered("mcp", "E2B's MCP gateway is a program of E2B's templates; run an MCP server as a command")
    if body.iam and body.iam.get("tokens"):
        raise not_offered("iam", "workload identity tokens; give a sandbox credentials with loom's secrets")
    if body.volume_mounts:
        raise not_offered("volumeMounts", "E2B volumes; a sandbox's files are its workspace (snapshots copy it)")
    timeout = check_timeout(settings, default_timeout if body.timeout is None else body.timeout)
    own = base_settings(settings)
    if body.env_vars:
        own["env"] = dict(body.env_vars)
    egress = egress_of(settings, body.allow_internet_access, body.network)
    if egress is not None:
        own["egress"] = egress
    return CreatePlan(
        template=body.template_id,
        timeout=timeout,
        metadata=dict(body.metadata or {}),
        env_vars=dict(body.env_vars or {}),
        allow_internet_access=body.allow_internet_access,
        network=body.network,
        auto_pause=bool(body.auto_pause),
        auto_resume=bool(body.auto_resume and body.auto_resume.enabled),
        settings=own,
    )


def _entry(text: Any, where: str) -> tuple[str, bool]:
    """An allowOut/denyOut entry as loom's egress entry, and whether it is every address."""
    if not isinstance(text, str) or not text.strip():
        raise E2BError(400, f"{where}: an entry is a non-empty string")
    text = text.strip()
    if text in _ALL_TRAFFIC:
        return text, True
    if "/" in text:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise E2BError(400, f"{where}: {text!r} is not a CIDR block, an address or a host name") from None
        if net.prefixlen != net.max_prefixlen:
            raise not_offered(
                f"{where} {text!r}", "loom's egress allowlist names hosts and single addresses, not address blocks"
            )
        address = net.network_address
    else:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            return text.lower(), False  # a host name (checked with the whole list below)
    return (f"[{address}]" if address.version == 6 else str(address)), False


_UNOFFERED_NETWORK = {
    "egressProxy": "loom's sandboxes reach hosts through loom's own egress gateway only",
    "rules": "header transforms: give a sandbox credentials with loom's secrets (docs/secrets.md)",
    "dnsServers": "the sandbox resolves names through loom's egress gateway only",
    "maskRequestHost": "sandbox URLs: loom serves a sandbox's ports at /v1/workspaces/{id}/ports/{port}/",
    "httpsPorts": "sandbox URLs: loom serves a sandbox's ports at /v1/workspaces/{id}/ports/{port}/",
}


def egress_of(settings: Settings, allow_internet: bool | None, network: dict[str, Any] | None) -> list[str] | None:
    """The workspace's egress allowlist for E2B's ``allow_internet_access`` and ``network``
    (see the module docstring); None: the operator's default, unchanged. Raises
    E2BError: 400 an entry refused, 501 a field or a block loom does not have."""
    network = network or {}
    for name, why in _UNOFFERED_NETWORK.items():
        if network.get(name):
            raise not_offered(f"network.{name}", why)
    if network.get("allowPublicTraffic") is True:
        raise not_offered("network.allowPublicTraffic", "a sandbox's ports are served only with the service's token")
    allow_out, deny_out = network.get("allowOut"), network.get("denyOut")
    for name, value in (("allowOut", allow_out), ("denyOut", deny_out)):
        if value is not None and not isinstance(value, list):
            raise E2BError(400, f"network.{name}: a list of strings")
    if allow_internet is not False and not allow_out and not deny_out:
        return None
    allows, allow_all = [], False
    for item in allow_out or []:
        entry, every = _entry(item, "network.allowOut")
        allow_all = allow_all or every
        if not every:
            allows.append(entry)
    denies, deny_all = [], allow_internet is False
    for item in deny_out or []:
        entry, every = _entry(item, "network.denyOut")
        if every:
            deny_all = True
        elif _is_address(entry):
            if entry not in allows:  # (E2B: an allowed entry wins over a denied one)
                denies.append("!" + entry)
        else:
            raise E2BError(400, f"network.denyOut: {item!r}: deny rules take addresses and CIDR blocks, not names")
    base = [] if deny_all and not allow_all else parse_allow_env(settings.egress_allow)
    entries = list(dict.fromkeys([*base, *allows, *denies]))
    try:
        return list(EgressPolicy.parse(entries).entries)
    except EgressPatternError as e:
        raise E2BError(400, f"network.allowOut: {e.entry!r} refused: {e.message}") from None


def _is_address(entry: str) -> bool:
    try:
        ipaddress.ip_address(entry.strip("[]"))
    except ValueError:
        return False
    return True


__all__ = [
    "BUILTIN_TEMPLATES",
    "E2B_HOME",
    "CreatePlan",
    "NewSandbox",
    "Timeout",
    "base_settings",
    "check_timeout",
    "egress_of",
    "parse_body",
    "plan_create",
    "template_image",
    "unknown_template",
]
