"""What the gateway does to one intercepted HTTP request and its answer (no I/O here).

In a request to a host of some of the workspace's secrets (``applicable``):

* a placeholder of an applicable secret in a **header value** is replaced by the value,
  also inside ``Authorization: Basic`` credentials (base64 of ``user:password``, which is
  how git sends what a credential helper or a ``https://user:$TOKEN@host`` URL gave it);
* a header-template secret whose header the request lacks gets it added; a request that
  sends that header itself (without the placeholder) keeps its own;
* a query-parameter secret sets its parameter when the request lacks it or gives it the
  placeholder as its whole value;
* a placeholder anywhere else (the URL, the body, another header's name, which HTTP/1.1
  cannot even hold) and every placeholder of a secret that is not for this host, or of no
  secret of this workspace, is left as it is, and noted as an attempt.

In the answer, the values sent (and the Basic credentials built from them) are masked
should the server reflect them: in header values by the placeholder, in the body by as
many ``*`` (the length is kept: Content-Length stays right). A compressed body is not
looked into. Values shorter than :data:`MIN_MASKED` are not masked (they would match by
accident).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from .authority import parse as parse_authority
from .secrets import PLACEHOLDER, PLACEHOLDER_PREFIX, Secret, SecretUnavailable, basic

MIN_MASKED = 8
#: The longest placeholder: "loom-secret:" + a 64-character name + ":" + 32 hex digits.
MAX_PLACEHOLDER = len(PLACEHOLDER_PREFIX) + 64 + 1 + 32

Headers = list[tuple[bytes, bytes]]


@dataclass
class Use:
    """A secret used in a request (``allowed``), or a placeholder that was not (``denied``)."""

    secret: str | None  # None: a placeholder of no secret of this workspace
    verdict: str
    reason: str


@dataclass
class Rewritten:
    headers: Headers
    target: bytes
    uses: list[Use] = field(default_factory=list)
    #: What the answer must not show, and what to show instead in a header.
    masks: dict[bytes, bytes] = field(default_factory=dict)


class _Rewriter:
    def __init__(self, host: str, port: int, secrets: dict[str, Secret]) -> None:
        self.where = f"{host}:{port}"
        self.known = {s.placeholder.encode(): s for s in secrets.values()}
        self.applicable = {ph: s for ph, s in self.known.items() if s.matches(host, port)}
        self.uses: list[Use] = []
        self.masks: dict[bytes, bytes] = {}
        self._noted: set[tuple[str | None, str]] = set()
        self._values: dict[str, str | None] = {}

    def note(self, secret: str | None, verdict: str, reason: str) -> None:
        if (secret, reason) not in self._noted:
            self._noted.add((secret, reason))
            self.uses.append(Use(secret, verdict, reason))

    def value(self, s: Secret) -> str | None:
        if s.name not in self._values:
            try:
                self._values[s.name] = s.secret_value()
            except SecretUnavailable as e:
                self._values[s.name] = None
                self.note(s.name, "error", f"not added: {e}")
        v = self._values[s.name]
        if v is not None and len(v) >= MIN_MASKED:
            self.masks[v.encode()] = s.placeholder.encode()
            if s.query is not None:
                self.masks[quote(v, safe="").encode()] = s.placeholder.encode()
        return v

    def stray(self, placeholder: bytes, where: str) -> None:
        """A placeholder that is not substituted."""
        s = self.known.get(placeholder)
        if s is None:
            name = placeholder.split(b":")[1].decode("ascii", "replace")
            self.note(None, "denied", f"a placeholder of no secret here ({name}) in {where}: sent unchanged")
        elif placeholder in self.applicable:
            self.note(s.name, "denied", f"placeholder in {where}: not substituted there (only in header values)")
        else:
            self.note(s.name, "denied", f"placeholder sent to {self.where}, not one of its hosts: sent unchanged")

    def header_value(self, name: bytes, raw: bytes) -> bytes:
        label = f"header {name.decode('ascii', 'replace')}"
        if name.lower() == b"authorization" and raw[:6].lower() == b"basic ":
            inner = _b64(raw[6:].strip())
            if inner is not None and PLACEHOLDER_PREFIX in inner:
                new = self.substitute(inner, label + " (Basic credentials)")
                if new != inner:
                    encoded = base64.b64encode(new)
                    self.masks[encoded] = raw[6:].strip()
                    return raw[:6] + encoded
        return self.substitute(raw, label)

    def substitute(self, text: bytes, where: str) -> bytes:
        if PLACEHOLDER_PREFIX not in text:
            return text
        out, last = bytearray(), 0
        for m in PLACEHOLDER.finditer(text):
            ph = m.group(0)
            s = self.applicable.get(ph)
            value = self.value(s) if s is not None else None
            out += text[last : m.start()]
            if s is not None and value is not None:
                out += value.encode()
                self.note(s.name, "allowed", f"placeholder replaced in {where}")
            else:
                out += ph
                if s is None:
                    self.stray(ph, where)
            last = m.end()
        out += text[last:]
        return bytes(out)

    def scan(self, text: bytes, where: str) -> None:
        for m in PLACEHOLDER.finditer(text):
            self.stray(m.group(0), where)


def rewrite_request(headers: Headers, target: bytes, host: str, port: int, secrets: dict[str, Secret]) -> Rewritten:
    """The request as it goes to ``host:port``. Never raises."""
    rw = _Rewriter(host, port, secrets)
    out: Headers = [(name, rw.header_value(name, value)) for name, value in headers]
    present = {name.lower() for name, _ in out}
    for s in rw.applicable.values():
        if s.header is not None and s.header.name.lower().encode() not in present:
            value = rw.value(s)
            if value is None:
                continue
            out.append((s.header.name.encode(), s.header.render(value)))
            present.add(s.header.name.lower().encode())
            if s.header.user is not None:
                rw.masks[basic(s.header.user, value).encode()] = s.placeholder.encode()
            rw.note(s.name, "allowed", f"header {s.header.name} added")
    new_target = _query(rw, target)
    return Rewritten(out, new_target, rw.uses, rw.masks)


def _query(rw: _Rewriter, target: bytes) -> bytes:
    """Set the parameters of query-parameter secrets; note every other placeholder in
    the URL (decoded, as the server would read it)."""
    wanted = {s.query: s for s in rw.applicable.values() if s.query is not None}
    path, sep, query = target.partition(b"?")
    parts = query.split(b"&") if query else []
    seen: set[str] = set()
    ours: set[int] = set()  # the parts the gateway wrote
    for i, part in enumerate(parts):
        key, eq, val = part.partition(b"=")
        name = unquote(key.decode("latin-1"))
        s = wanted.get(name)
        if s is None or name in seen:
            continue
        seen.add(name)  # the request's own value, unless it is the placeholder
        if eq and unquote(val.decode("latin-1")) == s.placeholder and (value := rw.value(s)) is not None:
            parts[i] = key + b"=" + quote(value, safe="").encode()
            ours.add(i)
            rw.note(s.name, "allowed", f"placeholder replaced in query parameter {name}")
    for name, s in wanted.items():
        if name not in seen and (value := rw.value(s)) is not None:
            ours.add(len(parts))
            parts.append(quote(name, safe="").encode() + b"=" + quote(value, safe="").encode())
            rw.note(s.name, "allowed", f"query parameter {name} added")
    for i, piece in enumerate([path, *parts]):
        if i - 1 not in ours:
            rw.scan(unquote(piece.decode("latin-1")).encode(), "the URL")
    return path + (sep or (b"?" if parts else b"")) + b"&".join(parts)


def _b64(data: bytes) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def stray_uses(
    placeholders: set[bytes], where: str, host: str, port: int, secrets: dict[str, Secret], *, plain: bool = False
) -> list[Use]:
    """The attempts that ``placeholders`` found in ``where`` amount to; ``plain``: in a
    plain-HTTP request (where no secret is ever put, not even for its own host)."""
    rw = _Rewriter(host, port, secrets)
    for ph in sorted(placeholders):
        s = rw.applicable.get(ph)
        if plain and s is not None:
            reason = f"placeholder in {where} of a plain-HTTP request: secrets go over TLS only; sent unchanged"
            rw.note(s.name, "denied", reason)
        else:
            rw.stray(ph, where)
    return rw.uses


def placeholders_in(text: bytes) -> set[bytes]:
    return {m.group(0) for m in PLACEHOLDER.finditer(text)} if PLACEHOLDER_PREFIX in text else set()


class BodyScan:
    """Placeholders in a request body, across the chunks it comes in."""

    def __init__(self) -> None:
        self._tail = b""
        self.found: set[bytes] = set()

    def feed(self, chunk: bytes) -> None:
        data = self._tail + chunk
        if PLACEHOLDER_PREFIX in data:
            self.found.update(m.group(0) for m in PLACEHOLDER.finditer(data))
        self._tail = data[-MAX_PLACEHOLDER:]


class Masker:
    """Masks the values of a request's secrets in its answer, chunk by chunk: a chunk's
    end that could begin a value is held back until the next chunk (only that: a
    streamed answer's lines are not delayed)."""

    def __init__(self, masks: dict[bytes, bytes]) -> None:
        self.masks = {k: v for k, v in masks.items() if len(k) >= MIN_MASKED}
        self._held = b""
        self.masked = 0

    def headers(self, headers: Headers) -> Headers:
        if not self.masks:
            return headers
        out = []
        for name, value in headers:
            for needle, shown in self.masks.items():
                if needle in value:
                    self.masked += 1
                    value = value.replace(needle, shown)
            out.append((name, value))
        return out

    def feed(self, chunk: bytes) -> bytes:
        if not self.masks:
            return chunk
        data = self._held + chunk if self._held else chunk
        for needle in self.masks:
            if needle in data:
                self.masked += data.count(needle)
                data = data.replace(needle, b"*" * len(needle))
        hold = max(_prefix_at_end(data, needle) for needle in self.masks)
        if hold:
            self._held, data = data[-hold:], data[:-hold]
        else:
            self._held = b""
        return data

    def finish(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _prefix_at_end(data: bytes, needle: bytes) -> int:
    """The length of the longest end of ``data`` that is a proper beginning of ``needle``."""
    i = data.find(needle[:1], max(0, len(data) - len(needle) + 1))
    while i != -1:
        if needle.startswith(data[i:]):
            return len(data) - i
        i = data.find(needle[:1], i + 1)
    return 0


def authority(text: str, default_port: int) -> tuple[str, int] | None:
    """``host[:port]`` (``[v6]:port``) of a Host header -> (normalized host, port)
    (:func:`worker.egress.authority.parse`)."""
    a = parse_authority(text, default_port)
    return None if a is None or a.port is None else (a.host, a.port)
