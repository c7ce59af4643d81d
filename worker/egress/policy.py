"""Which hosts a workspace's sandbox may reach: the egress allowlist.

A policy is a list of entries, each one of:

``pypi.org``            that exact name, on the default ports (443 and 80)
``pypi.org:8443``       that name on that port only
``*.example.com``       every name *under* example.com (not example.com itself)
``203.0.113.7``         that address, as a literal (``[2001:db8::1]:443`` for IPv6)
``pypi`` / ``npm`` /    a preset: the hosts of that registry (:data:`PRESETS`)
``debian`` / ``github``
``!upload.pypi.org``    a denial: never, whatever else allows it (denials win)

Entries that would open everything, or more than a name's owner controls, are refused
with :class:`EgressPatternError` naming the entry: ``*``, ``*.com``, ``*.co.uk``,
``*.github.io`` (a wildcard over a public suffix, from the Public Suffix List), a scheme
(``https://...``), a path, a user part, empty labels (``a..b``), a port out of range.

The policy only matches names and ports. What a name resolves to is checked separately by
the gateway (:mod:`worker.egress.addresses`), for every address, before it connects.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .authority import AuthorityError, normalize_host, parse_ip, port_number, split

#: Ports an entry without one allows.
DEFAULT_PORTS = (443, 80)

#: The registries' hosts, as entries. Kept to what each client really dials.
PRESETS: dict[str, tuple[str, ...]] = {
    "pypi": ("pypi.org", "files.pythonhosted.org"),
    "npm": ("registry.npmjs.org", "registry.yarnpkg.com"),
    "debian": ("deb.debian.org", "security.debian.org", "snapshot.debian.org"),
    "github": (
        "github.com",
        "api.github.com",
        "codeload.github.com",
        "objects.githubusercontent.com",
        "raw.githubusercontent.com",
        "release-assets.githubusercontent.com",
    ),
}

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_MAX_ENTRIES = 256


class EgressPatternError(ValueError):
    """An allowlist entry was refused; ``entry`` is it, as given."""

    def __init__(self, entry: str, message: str) -> None:
        super().__init__(f"{entry!r}: {message}")
        self.entry = entry
        self.message = message


@functools.cache
def _psl() -> object:
    # The Public Suffix List, as the publicsuffixlist package ships it (no download): the
    # one list browsers use to tell a registrable domain from a public suffix.
    from publicsuffixlist import PublicSuffixList

    return PublicSuffixList()


def _is_public_suffix(name: str) -> bool:
    return bool(_psl().is_public(name))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Rule:
    """One parsed entry: ``host`` exact, or ``suffix`` for ``*.suffix``, or an address."""

    text: str  # the entry as given (a preset's hosts carry "preset:host")
    host: str | None = None
    suffix: str | None = None
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    ports: tuple[int, ...] = DEFAULT_PORTS
    deny: bool = False

    def matches_name(self, host: str) -> bool:
        if self.ip is not None:
            return parse_ip(host) == self.ip
        if self.suffix is not None:
            return host.endswith("." + self.suffix)
        return host == self.host

    def matches(self, host: str, port: int) -> bool:
        return port in self.ports and self.matches_name(host)


def _split_port(entry: str, body: str) -> tuple[str, tuple[int, ...] | None]:
    """The host (an IPv6 literal keeps its brackets) and the port of an entry."""
    try:
        s = split(body)
        port = None if s.port is None else port_number(s.port)
    except AuthorityError as e:
        raise EgressPatternError(entry, str(e)) from None
    host = f"[{s.host}]" if s.bracketed else s.host
    return host, None if port is None else (port,)


def parse_rule(entry: str) -> list[Rule]:
    """The rules of one entry (a preset gives several). Raises EgressPatternError."""
    if not isinstance(entry, str):
        raise EgressPatternError(str(entry), "an entry is a string")
    text = entry.strip()
    deny = text.startswith("!")
    body = text[1:].strip() if deny else text
    if not body:
        raise EgressPatternError(entry, "empty entry")
    if any(c.isspace() for c in body) or "\x00" in body:
        raise EgressPatternError(entry, "an entry has no spaces")
    if "://" in body or body.lower().startswith(("http:", "https:")):
        raise EgressPatternError(entry, "give a host name, not a URL (no scheme)")
    if "/" in body or "?" in body or "#" in body:
        raise EgressPatternError(entry, "give a host name, not a URL (no path)")
    if "@" in body:
        raise EgressPatternError(entry, "give a host name (no user part)")
    if body.lower() in PRESETS:
        return [Rule(text=f"{body.lower()}:{h}", deny=deny, **_host_fields(entry, h)) for h in PRESETS[body.lower()]]
    host, ports = _split_port(entry, body)
    if ip := parse_ip(host):
        if host.startswith("[") != (ip.version == 6):
            raise EgressPatternError(entry, "write an IPv6 address in brackets: [2001:db8::1]:443")
        return [Rule(text=text, ip=ip, ports=ports or DEFAULT_PORTS, deny=deny)]
    return [Rule(text=text, ports=ports or DEFAULT_PORTS, deny=deny, **_host_fields(entry, host))]


def _host_fields(entry: str, host: str) -> dict[str, Any]:
    if host in ("*", "*.", "**"):
        raise EgressPatternError(entry, "it would allow every host; name hosts (pypi.org, *.example.com) or a preset")
    wildcard = host.startswith("*.")
    name = host[2:] if wildcard else host
    if "*" in name:
        raise EgressPatternError(entry, "a wildcard is only allowed as the first label (*.example.com)")
    try:
        name = normalize_host(name)
    except ValueError:
        raise EgressPatternError(entry, "not a valid host name") from None
    labels = name.split(".")
    if not name or any(not _LABEL.match(label) for label in labels):
        raise EgressPatternError(entry, "not a valid host name (empty or bad label)")
    if len(name) > 253:
        raise EgressPatternError(entry, "a host name has at most 253 characters")
    if wildcard:
        if len(labels) < 2 or _is_public_suffix(name):
            raise EgressPatternError(
                entry, f"*.{name} would allow every domain under a public suffix; name a domain someone owns"
            )
        return {"suffix": name}
    return {"host": name}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str  # why, for the log and the model ("not on the allowlist", "denied by !x")
    rule: str | None = None


@dataclass(frozen=True)
class EgressPolicy:
    """A parsed allowlist. Empty means no egress at all."""

    entries: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = field(default=(), repr=False)

    @classmethod
    def parse(cls, entries: Iterable[str]) -> EgressPolicy:
        """Raises EgressPatternError naming the first bad entry."""
        items = list(entries)
        if len(items) > _MAX_ENTRIES:
            raise EgressPatternError(str(items[_MAX_ENTRIES]), f"at most {_MAX_ENTRIES} entries")
        rules: list[Rule] = []
        for entry in items:
            rules.extend(parse_rule(entry))
        return cls(tuple(e.strip() for e in items), tuple(rules))

    def __bool__(self) -> bool:
        return any(not r.deny for r in self.rules)

    def check(self, host: str, port: int) -> Verdict:
        """May the sandbox connect to ``host`` (a name or an IP literal) on ``port``?"""
        try:
            host = normalize_host(host)
        except ValueError:
            return Verdict(False, "not a valid host name")
        for rule in self.rules:
            if rule.deny and rule.matches_name(host):
                return Verdict(False, f"denied by {rule.text}", rule.text)
        literal = parse_ip(host) is not None
        same_name = None
        for rule in self.rules:
            if rule.deny:
                continue
            if rule.matches(host, port):
                return Verdict(True, f"allowed by {rule.text}", rule.text)
            if rule.matches_name(host):
                same_name = rule
        if same_name is not None:
            ports = ", ".join(str(p) for p in same_name.ports)
            return Verdict(False, f"port {port} is not allowed for {host} (allowed: {ports})", same_name.text)
        if literal:
            return Verdict(False, "an IP address is refused unless the operator listed that address")
        return Verdict(False, "not on the allowlist")

    def knows_name(self, host: str) -> bool:
        """Whether some allow rule names ``host`` on any port (and no denial does): what
        the sandbox's stub resolver answers for."""
        try:
            host = normalize_host(host)
        except ValueError:
            return False
        if any(r.deny and r.matches_name(host) for r in self.rules):
            return False
        return any(not r.deny and r.ip is None and r.matches_name(host) for r in self.rules)


def parse_allow_env(value: str | None) -> list[str]:
    """``LOOM_EGRESS_ALLOW`` (comma-separated) as a list of entries."""
    if not value:
        return []
    return [item.strip() for item in value.split(",") if item.strip()]
