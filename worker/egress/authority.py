"""``host[:port]`` (``[v6]:port`` for an IPv6 literal): parsed here, once, for every place
the gateway meets one: a ``CONNECT`` target, a ``Host`` header (a tunnel's, a plain
request's, an intercepted request's) and an allowlist or secret entry.

Two layers: :func:`split` cuts the text into host and port the way every caller agrees
on (brackets around an IPv6 literal, at most one ``:`` otherwise), and says what is wrong
with :class:`AuthorityError`; :func:`parse` is the strict reading of an authority that
came over the wire: the host normalized (:func:`normalize_host`: lower case, no trailing
dot, IDNA; an IP literal in its compressed form, without brackets), no user part, no
unbracketed IPv6, a port in 1-65535, or None.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

#: What a normalized name may hold (IDNA has turned every other letter into ASCII).
_NAME = re.compile(r"^[a-z0-9_.-]+$")


def normalize_host(host: str) -> str:
    """Lower case, no trailing dot, IDNA (punycode) for non-ASCII names.

    Raises ValueError for a name IDNA cannot encode."""
    host = host.strip().rstrip(".").lower()
    if host and not host.isascii():
        host = host.encode("idna").decode("ascii")
    return host


def parse_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address when ``host`` is an IP literal (``[v6]`` too), else None."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class AuthorityError(ValueError):
    """The text is not ``host[:port]``; the message says why (as an allowlist error shows it)."""


@dataclass(frozen=True)
class Split:
    """``text`` cut in two, nothing checked but the shape."""

    host: str  # as written; without its brackets when ``bracketed``
    port: str | None  # the digits after the last ``:``, unchecked; None when absent
    bracketed: bool  # the host was written ``[...]``


def split(text: str) -> Split:
    """Cut ``host[:port]``. Without brackets, a text with two or more ``:`` is all host (a
    bare IPv6 literal: callers refuse it their own way). Raises AuthorityError."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise AuthorityError("an IPv6 address needs its closing ]")
        host, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise AuthorityError("only :PORT may follow an IPv6 address")
        return Split(host, rest[1:] if rest else None, True)
    if text.count(":") == 1:
        host, port = text.split(":")
        return Split(host, port, False)
    return Split(text, None, False)


def port_number(text: str) -> int:
    """A port's digits as a number in 1-65535. Raises AuthorityError."""
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise AuthorityError(f"{text!r} is not a port (1-65535)")
    return int(text)


@dataclass(frozen=True)
class Authority:
    host: str  # normalized; an IPv6 literal without brackets
    port: int | None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def parse(text: str, default_port: int | None = None) -> Authority | None:
    """The authority ``text`` names, ``default_port`` when it gives none; None when it is
    not one (see the module docstring)."""
    try:
        s = split(text.strip())
        port = default_port if s.port is None else port_number(s.port)
        host = normalize_host(s.host)
    except ValueError:  # AuthorityError, or a name IDNA cannot encode
        return None
    if not host:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if s.bracketed or ":" in host or not _NAME.match(host):
            return None  # a name in brackets, a user part, a bare IPv6 literal, a path, spaces
        return Authority(host, port)
    if s.bracketed != (ip.version == 6) or (isinstance(ip, ipaddress.IPv6Address) and ip.scope_id):
        return None  # (a zone names an interface of the gateway's host: not the sandbox's to pick)
    return Authority(ip.compressed, port)


#: The port a URL's scheme implies.
SCHEME_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def of_netloc(netloc: str, scheme: str) -> Authority | None:
    """The authority of a URL's ``netloc`` (a user part dropped), its port implied by
    ``scheme`` when it gives none; None when it is not one."""
    return parse(netloc.rpartition("@")[2], SCHEME_PORTS.get(scheme.lower()))
