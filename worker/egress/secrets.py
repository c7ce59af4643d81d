"""Secrets that never enter a sandbox: what one is, and the checks it passes.

A secret is a NAME, a value, the hosts it belongs to (entries as in the egress allowlist:
``api.github.com``, ``*.example.com``, ``host:8443``, a preset), and how it is used
there: an HTTP header built from a template (``Authorization: Bearer {value}``,
``Authorization: Basic {x-access-token:value}`` for git over HTTPS, ``X-API-Key: {}``)
or a query parameter. The sandbox sees only ``$NAME`` holding a placeholder
(``loom-secret:NAME:<32 hex>``); the egress gateway puts the value in requests to the
secret's hosts (:mod:`worker.egress.rewrite`). Where they are kept, and how they are
protected at rest: :mod:`worker.egress.secretstore`.

The placeholder is made once, when a secret is created, and kept until it is deleted:
a changed value (rotation) keeps it, so a running sandbox needs no restart and its next
request carries the new value. It is not itself a secret: the gateway substitutes a
workspace's placeholders only in requests arriving on that workspace's own socket, to
that secret's hosts, so a placeholder copied anywhere else is worth nothing.

Exceptions: :class:`SecretError` (a refused name, host, template or value; a
``ValueError`` whose ``field`` names it; its message never holds the value), and
:class:`SecretUnavailable` (a ``value_file`` that cannot be read at use).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets as _random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.spec import CA_ENV_VARS, EGRESS_ENV

from .authority import normalize_host
from .policy import EgressPatternError, Rule, parse_rule

MAX_VALUE = 8192
MAX_HOSTS = 32
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
#: A placeholder as it appears in a request (bytes: requests are scanned as bytes).
PLACEHOLDER = re.compile(rb"loom-secret:([A-Za-z_][A-Za-z0-9_]{0,63}):([0-9a-f]{32})")
PLACEHOLDER_PREFIX = b"loom-secret:"
#: Variables the worker sets in a sandbox (or the loader reads): a secret may not take
#: their name, or it would replace the proxy, the trust store or the agent's own.
_RESERVED = re.compile(r"^(LD_|LOOM_|GIT_CONFIG_|SSL_CERT_)")
_RESERVED_NAMES = frozenset(
    {"HOME", "USER", "LOGNAME", "PATH", "LANG", "LC_ALL", "SHELL", "PWD", "TERM", "GIT_CONFIG_COUNT"}
    | set(EGRESS_ENV)
    | set(CA_ENV_VARS)
)
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")  # an HTTP header name (RFC 9110 5.6.2)
#: Headers a template may not set: the message's framing and routing, and the proxy's.
_NOT_A_TEMPLATE = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "proxy-authorization",
        "proxy-connection",
    }
)
_SLOT = re.compile(r"\{(?:value|([^{}:\s]{1,64}):value)?\}")
_QUERY_NAME = re.compile(r"^[A-Za-z0-9_.~-]{1,64}$")


class SecretError(ValueError):
    """A secret was refused; ``field`` names what (``name``, ``hosts``, ``header``,
    ``value``...). The message never includes the value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class SecretUnavailable(Exception):
    """A secret's ``value_file`` could not be read when a request needed it."""


@dataclass(frozen=True)
class Template:
    """An HTTP header built from a secret: ``name: prefix + slot + suffix``, the slot being
    the value, or ``base64(user:value)`` (HTTP Basic) when ``user`` is set."""

    text: str
    name: str
    prefix: str
    suffix: str
    user: str | None

    def render(self, value: str) -> bytes:
        slot = basic(self.user, value) if self.user is not None else value
        return (self.prefix + slot + self.suffix).encode()


def basic(user: str, value: str) -> str:
    """The credentials of an HTTP ``Authorization: Basic`` header (RFC 7617)."""
    return base64.b64encode(f"{user}:{value}".encode()).decode("ascii")


def parse_template(text: str) -> Template:
    """``"Authorization: Bearer {value}"`` (``{}`` also stands for the value;
    ``{USER:value}`` for HTTP Basic credentials of USER and the value). Raises
    SecretError."""
    if not isinstance(text, str) or any(c in text for c in "\r\n\x00"):
        raise SecretError("header", "one line: 'Name: template with {value}'")
    name, sep, rest = text.partition(":")
    name, rest = name.strip(), rest.strip()
    if not sep or not _TOKEN.match(name):
        raise SecretError("header", "write it as 'Header-Name: ... {value} ...' (a valid header name first)")
    if name.lower() in _NOT_A_TEMPLATE:
        raise SecretError("header", f"{name} is not a header a secret may set")
    slots = list(_SLOT.finditer(rest))
    if len(slots) != 1:
        raise SecretError("header", "the template needs exactly one {value} (or {}, or {USER:value} for Basic)")
    m = slots[0]
    prefix, suffix = rest[: m.start()], rest[m.end() :]
    if "{" in prefix + suffix or "}" in prefix + suffix or not (prefix + suffix).isascii():
        raise SecretError("header", "only the one {value} slot may use braces; the rest is ASCII text")
    return Template(text=f"{name}: {rest}", name=name, prefix=prefix, suffix=suffix, user=m.group(1))


def parse_hosts(entries: Any) -> tuple[tuple[str, ...], tuple[Rule, ...]]:
    """A secret's hosts (allowlist entries, no denials). Raises SecretError."""
    if not isinstance(entries, list | tuple) or not entries or not all(isinstance(e, str) for e in entries):
        raise SecretError("hosts", "a list of at least one host (as in the egress allowlist)")
    if len(entries) > MAX_HOSTS:
        raise SecretError("hosts", f"at most {MAX_HOSTS} hosts")
    rules: list[Rule] = []
    for entry in entries:
        if entry.strip().startswith("!"):
            raise SecretError("hosts", f"{entry!r}: a secret's hosts are where it is sent; a denial means nothing here")
        try:
            rules.extend(parse_rule(entry))
        except EgressPatternError as e:
            raise SecretError("hosts", f"{e.entry!r}: {e.message}") from None
    return tuple(e.strip() for e in entries), tuple(rules)


def check_name(name: Any) -> str:
    """Raises SecretError for a name that cannot be an environment variable of ours."""
    if not isinstance(name, str) or not NAME.match(name):
        raise SecretError("name", "a variable name: a letter or _, then letters, digits, _ (at most 64)")
    if _RESERVED.match(name) or name in _RESERVED_NAMES:
        raise SecretError("name", f"{name} is a variable the worker sets in the sandbox; choose another name")
    return name


def check_value(value: Any) -> str:
    """Raises SecretError (without echoing the value)."""
    if not isinstance(value, str) or not value:
        raise SecretError("value", "a non-empty string")
    if len(value) > MAX_VALUE:
        raise SecretError("value", f"at most {MAX_VALUE} characters")
    # A CR or LF would let the value end the header it is put in and start others; no
    # control character is valid in a header value (and an HTTP library's error about one
    # would quote it).
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise SecretError("value", "no line breaks or control characters (a file's trailing newline is removed)")
    return value


def make_placeholder(name: str) -> str:
    return f"loom-secret:{name}:{_random.token_hex(16)}"


@dataclass(frozen=True)
class Secret:
    """One secret as the gateway uses it. ``value`` is never in its repr."""

    name: str
    hosts: tuple[str, ...]
    rules: tuple[Rule, ...] = field(repr=False)
    placeholder: str
    header: Template | None = None
    query: str | None = None
    value: str | None = field(default=None, repr=False)
    value_file: str | None = None
    updated: float = 0.0
    scope: str = "workspace"  # or "default"

    def matches(self, host: str, port: int) -> bool:
        """Whether a request to ``host:port`` is one this secret is for."""
        host = normalize_host(host)
        return any(r.matches(host, port) for r in self.rules)

    def secret_value(self) -> str:
        """The value now (a ``value_file`` is read at each use). Raises SecretUnavailable."""
        if self.value is not None:
            return self.value
        assert self.value_file is not None
        try:
            text = Path(self.value_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SecretUnavailable(f"the value file of {self.name} cannot be read ({type(e).__name__})") from None
        text = text.rstrip("\r\n")
        try:
            return check_value(text)
        except SecretError:
            raise SecretUnavailable(f"the value file of {self.name} holds no usable value") from None

    def public(self) -> dict[str, Any]:
        """What any surface may show: everything but the value."""
        return {
            "name": self.name,
            "hosts": list(self.hosts),
            "header": self.header.text if self.header else None,
            "query": self.query,
            "placeholder": self.placeholder,
            "value_file": self.value_file,
            "updated": self.updated,
            "scope": self.scope,
        }


def parse_entry(name: str, raw: Any, *, scope: str, where: str) -> Secret:
    """One stored entry (``where``: its file, for a derived placeholder). Raises
    SecretError."""
    check_name(name)
    if not isinstance(raw, dict):
        raise SecretError(name, "an entry is an object")
    unknown = set(raw) - {"hosts", "header", "query", "value", "value_file", "placeholder", "updated"}
    if unknown:
        raise SecretError(f"{name}.{sorted(unknown)[0]}", "unknown field")
    hosts, rules = parse_hosts(raw.get("hosts"))
    header = raw.get("header")
    query = raw.get("query")
    if (header is None) == (query is None):
        raise SecretError(f"{name}.header", "give exactly one of header (a template) or query (a parameter name)")
    template = parse_template(header) if header is not None else None
    if query is not None and (not isinstance(query, str) or not _QUERY_NAME.match(query)):
        raise SecretError(f"{name}.query", "a query parameter name (letters, digits, _ . ~ -)")
    value, value_file = raw.get("value"), raw.get("value_file")
    if (value is None) == (value_file is None):
        raise SecretError(f"{name}.value", "give exactly one of value or value_file")
    if value is not None:
        check_value(value)
    elif not isinstance(value_file, str) or not os.path.isabs(value_file):
        raise SecretError(f"{name}.value_file", "an absolute path on the host")
    placeholder = raw.get("placeholder")
    if placeholder is None:
        # A hand-written entry: a placeholder derived from its file and name, stable.
        digest = hashlib.sha256(where.encode() + b"\0" + name.encode()).hexdigest()[:32]
        placeholder = f"loom-secret:{name}:{digest}"
    m = PLACEHOLDER.fullmatch(placeholder.encode()) if isinstance(placeholder, str) else None
    if m is None or m.group(1).decode() != name:
        raise SecretError(f"{name}.placeholder", "loom-secret:NAME:<32 hex digits>")
    updated = raw.get("updated", 0.0)
    return Secret(
        name=name,
        hosts=hosts,
        rules=rules,
        placeholder=placeholder,
        header=template,
        query=query,
        value=value,
        value_file=value_file,
        updated=float(updated) if isinstance(updated, int | float) else 0.0,
        scope=scope,
    )
