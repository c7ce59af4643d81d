"""Read the server name out of a TLS ClientHello, without terminating TLS.

The gateway never decrypts anything: it reads the client's first TLS record, takes the
server_name (SNI) the client is about to verify the certificate against, and checks that
it is the name the connection was allowed for (``CONNECT pypi.org:443`` must not carry
``SNI: evil.example``; that is domain fronting through an allowed name).

Written here rather than taken from a library: no maintained Python package parses a
ClientHello without also implementing TLS, and the part needed is small (RFC 8446 4.1.2
and RFC 6066 3), bounded (one record, at most 16 KiB + 5 bytes) and fuzzed by the tests.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

#: The first bytes of a TLS handshake record.
HANDSHAKE = 0x16
#: A record's largest payload (RFC 8446 5.1); a ClientHello longer than one record is
#: refused (no client sends one; accepting it would mean buffering more).
MAX_RECORD = 1 << 14
_EXT_SERVER_NAME = 0
_EXT_ECH = 0xFE0D  # encrypted_client_hello: hides the real name behind a public one
#: A fatal "access_denied" alert (RFC 8446 6.2), sent before closing a refused handshake.
ACCESS_DENIED_ALERT = bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31])


class NotClientHello(ValueError):
    """The bytes are not one complete, well-formed TLS ClientHello record."""


@dataclass(frozen=True)
class ClientHello:
    server_name: str | None  # lower-cased, no trailing dot; None when absent
    ech: bool  # carries an encrypted_client_hello extension


def record_length(head: bytes) -> int | None:
    """The full length (header included) of the TLS record ``head`` starts, once its 5-byte
    header is there (None before). Raises NotClientHello when it is not a handshake record
    or is longer than one record may be."""
    if len(head) < 5:
        if head and head[0] != HANDSHAKE:
            raise NotClientHello("not a TLS handshake")
        return None
    if head[0] != HANDSHAKE or head[1] != 0x03:
        raise NotClientHello("not a TLS handshake")
    (n,) = struct.unpack_from(">H", head, 3)
    if n > MAX_RECORD + 256 or n < 4:
        raise NotClientHello("bad TLS record length")
    return 5 + n


def parse_client_hello(record: bytes) -> ClientHello:
    """Parse one TLS record holding a ClientHello. Raises NotClientHello."""
    total = record_length(record)
    if total is None or len(record) < total:
        raise NotClientHello("incomplete TLS record")
    body = memoryview(record)[5:total]
    try:
        if body[0] != 1:  # handshake type client_hello
            raise NotClientHello("the first handshake message is not a ClientHello")
        hlen = int.from_bytes(body[1:4], "big")
        if hlen > len(body) - 4:
            raise NotClientHello("a ClientHello split over several records is not accepted")
        p = 4 + 2 + 32  # legacy_version, random
        p += 1 + body[p]  # legacy_session_id
        (n,) = struct.unpack_from(">H", body, p)  # cipher_suites
        p += 2 + n
        p += 1 + body[p]  # legacy_compression_methods
        end = 4 + hlen
        if p == end:
            return ClientHello(None, False)
        (n,) = struct.unpack_from(">H", body, p)
        p += 2
        if p + n > end:
            raise NotClientHello("extensions overrun the ClientHello")
        ext_end = p + n
        name: str | None = None
        ech = False
        seen: set[int] = set()
        while p < ext_end:
            etype, elen = struct.unpack_from(">HH", body, p)
            p += 4
            if p + elen > ext_end:
                raise NotClientHello("an extension overruns the ClientHello")
            if etype in seen:
                raise NotClientHello("an extension is repeated")
            seen.add(etype)
            if etype == _EXT_SERVER_NAME:
                name = _server_name(body[p : p + elen])
            elif etype == _EXT_ECH:
                ech = True
            p += elen
        return ClientHello(name, ech)
    except (IndexError, struct.error):
        raise NotClientHello("truncated ClientHello") from None


def _server_name(ext: memoryview) -> str | None:
    (list_len,) = struct.unpack_from(">H", ext, 0)
    if list_len + 2 != len(ext):
        raise NotClientHello("bad server_name list")
    p = 2
    names: list[str] = []
    while p < len(ext):
        kind, n = struct.unpack_from(">BH", ext, p)
        p += 3
        raw = bytes(ext[p : p + n])
        if len(raw) != n:
            raise NotClientHello("bad server_name entry")
        p += n
        if kind == 0:  # host_name
            try:
                names.append(raw.decode("ascii").rstrip(".").lower())
            except UnicodeDecodeError:
                raise NotClientHello("a server name that is not ASCII") from None
    if len(names) > 1:
        raise NotClientHello("more than one host name in server_name")
    return names[0] if names else None
