"""Model providers of ``loom-worker agent run``: which environment variable holds an agent's
key, which API host it goes to (and only there: it becomes a gateway secret of that host),
how it is sent, and the base URL the agent is pointed at.

    ProviderError (ValueError)   a custom provider or base URL that cannot be used
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

#: What a key variable's name may be (the secrets store checks the rest: reserved names).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: A host as the egress allowlist takes it, with an optional port (no wildcard: a key
#: goes to named hosts only).
_HOST = re.compile(r"(?=.{1,253}(:|\Z))[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(:[0-9]{1,5})?\Z")


class ProviderError(ValueError):
    """A provider's part that cannot be used; ``field`` names the option it came from."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Provider:
    """A model API an agent talks to.

    ``key_env``: the variable the agent reads its key from (on the host: where the key is
    taken from; in the sandbox: the gateway secret's placeholder). ``hosts``: where the
    key may go (the secret's hosts, added to the egress allowlist for the run).
    ``header``: the secret's header template. ``base_url_env``/``base_url``: the variable
    that points the agent at the API, and its value (None: the agent's own default)."""

    name: str
    key_env: str
    hosts: tuple[str, ...]
    header: str
    base_url_env: str | None = None
    base_url: str | None = None

    @property
    def egress(self) -> tuple[str, ...]:
        """The allowlist entries the run adds: the key's hosts, nothing more."""
        return self.hosts

    def with_base_url(self, url: str) -> Provider:
        """This provider pointed at ``url`` (a gateway or proxy of the operator's): the key
        goes to that URL's host instead. Raises ProviderError (``--base-url``)."""
        host = host_of_url(url)
        return replace(self, hosts=(host,), base_url=url.rstrip("/"))


PROVIDERS: dict[str, Provider] = {
    "anthropic": Provider(
        "anthropic", "ANTHROPIC_API_KEY", ("api.anthropic.com",), "x-api-key: {value}",
        "ANTHROPIC_BASE_URL", "https://api.anthropic.com",
    ),
    "openai": Provider(
        "openai", "OPENAI_API_KEY", ("api.openai.com",), "Authorization: Bearer {value}",
        "OPENAI_BASE_URL", "https://api.openai.com/v1",
    ),
}  # fmt: skip


def custom(key_env: str, host: str, header: str = "Authorization: Bearer {value}") -> Provider:
    """A provider of ``--key-env NAME --key-host HOST [--key-header TEMPLATE]``. Raises
    ProviderError naming the option."""
    if not _ENV_NAME.match(key_env):
        raise ProviderError("--key-env", f"{key_env!r} is not a variable name")
    host = host.strip().lower()
    if not _HOST.match(host):
        raise ProviderError("--key-host", f"{host!r} is not a host name (HOST or HOST:PORT, no wildcard)")
    if "{value}" not in header and "{}" not in header:
        raise ProviderError("--key-header", "the template must hold {value}")
    return Provider("custom", key_env, (host,), header)


def host_of_url(url: str) -> str:
    """The allowlist entry (host, or host:port when not 443) of an ``https://`` URL.
    Raises ProviderError (``--base-url``)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ProviderError("--base-url", str(e)) from None
    if parts.scheme != "https" or not parts.hostname:
        raise ProviderError("--base-url", "an https:// URL with a host (a key is never sent over plain HTTP)")
    if parts.username or parts.password:
        raise ProviderError("--base-url", "no user or password in the URL (the key is a gateway secret)")
    host = parts.hostname.lower() + ("" if port in (None, 443) else f":{port}")
    if not _HOST.match(host):
        raise ProviderError("--base-url", f"{parts.hostname!r} is not a host name")
    return host
