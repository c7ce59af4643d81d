"""Host overrides of the egress gateway (``LOOM_EGRESS_HOSTS``): for a name (and optionally a
port), the address and port the gateway dials instead of resolving the name, as curl's
``--connect-to``. Everything else still applies to the name the sandbox asked for: the
allowlist, the address checks (so a private or loopback address must also be in
``LOOM_EGRESS_TRUSTED_NETWORKS``), TLS verification of the name and the secrets for its
hosts. Used to point an agent at a mock provider under the provider's real name.
"""

from __future__ import annotations

from dataclasses import dataclass

from .addresses import IPAddress
from .authority import normalize_host, parse_ip


@dataclass(frozen=True)
class Target:
    address: IPAddress
    port: int | None  # None: the port the sandbox asked for


class OverrideError(ValueError):
    """An entry of LOOM_EGRESS_HOSTS that is not ``host[:port]=address[:port]``; says which."""


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise OverrideError(f"LOOM_EGRESS_HOSTS entry {entry!r}: port {text!r} is not 1-65535")
    return int(text)


def _split(text: str, entry: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port``."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise OverrideError(f"LOOM_EGRESS_HOSTS entry {entry!r}: unclosed '['")
        rest = text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise OverrideError(f"LOOM_EGRESS_HOSTS entry {entry!r}: junk after ']'")
        return text[1:end], (_port(rest[1:], entry) if rest else None)
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, _port(port, entry)
    return text, None


def parse_overrides(value: str | None) -> dict[tuple[str, int | None], Target]:
    """``host[:port]=address[:port],...`` by (normalized host, port or None). The address is an
    IP literal (the gateway dials it, no name to resolve again). Raises OverrideError naming
    the entry."""
    out: dict[tuple[str, int | None], Target] = {}
    for raw in (value or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        if entry.count("=") != 1:
            raise OverrideError(f"LOOM_EGRESS_HOSTS entry {entry!r}: expected host[:port]=address[:port]")
        left, right = (part.strip() for part in entry.split("="))
        host, port = _split(left, entry)
        if not host or parse_ip(host) is not None or "*" in host or "/" in host:
            raise OverrideError(f"LOOM_EGRESS_HOSTS entry {entry!r}: {host!r} is not a host name")
        address, dial_port = _split(right, entry)
        ip = parse_ip(address)
        if ip is None:
            raise OverrideError(f"LOOM_EGRESS_HOSTS entry {entry!r}: {address!r} is not an IP address")
        try:
            key = (normalize_host(host), port)
        except ValueError:
            raise OverrideError(f"LOOM_EGRESS_HOSTS entry {entry!r}: {host!r} is not a host name") from None
        if key in out:
            raise OverrideError(f"LOOM_EGRESS_HOSTS entry {entry!r}: {left!r} is given twice")
        out[key] = Target(ip, dial_port)
    return out


def lookup(overrides: dict[tuple[str, int | None], Target], host: str, port: int) -> Target | None:
    """The override for ``host:port`` (an exact port first, then the host's any-port entry)."""
    name = normalize_host(host)
    return overrides.get((name, port)) or overrides.get((name, None))
