"""The certificates of the intercepting gateway: one certificate authority per workspace,
short-lived leaf certificates for its secrets' hosts only, the sandbox's trust bundle, and
the trust store the gateway verifies the real hosts with.

* The CA (ECDSA P-256, ten years) is made the first time a workspace has a secret and kept
  next to its settings (``secrets-ca.key``, mode 0600, never copied anywhere;
  ``secrets-ca.pem``). Each workspace has its own, so one sandbox's trust never extends to
  another's gateway certificates.
* Its public certificate is appended to the sandbox's trust bundle (the workspace's CA
  bundle, ``LOOM_CA_BUNDLE``, or the host's own store), written beside the gateway's socket
  directory as ``<key>.ca-<hash>.pem`` and mounted where every CA bundle is
  (:data:`sandbox.spec.CA_BUNDLE_PATH`). The name carries a hash of the content, so a new
  bundle is a new sandbox spec (the container is recreated with it), never a file changed
  under a running one.
* Leaf certificates (24 hours) are made in memory when the gateway intercepts a host of a
  secret, for that exact name only, and loaded into an ``ssl.SSLContext`` through a memfd
  (Python's ``ssl`` loads certificates only from a path): no leaf key touches a disk.

``cryptography`` makes the keys and certificates (the library Python's TLS world uses;
writing ASN.1 ourselves would be the wrong kind of code to own), and the standard ``ssl``
module does the TLS. mitmproxy would bring its whole proxy for these ~150 lines.

Exceptions: OSError from the files; nothing else is raised on purpose.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import os
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..pem import certificates, write_once
from ..storage.atomic import write_atomic
from .authority import parse_ip

CA_KEY = "secrets-ca.key"
CA_CERT = "secrets-ca.pem"
CA_DAYS = 3650
LEAF_HOURS = 24
#: A leaf is made anew when less than this is left of it.
LEAF_RENEW = datetime.timedelta(hours=1)
#: Clocks of a sandbox and the host are the same kernel's, but a client may check against
#: a slightly earlier "now" (gVisor's vDSO, a rounding): a few minutes of slack.
SKEW = datetime.timedelta(minutes=5)
#: The only application protocol offered to the sandbox: the gateway reads and rewrites
#: requests with h11, an HTTP/1.1 parser. Every HTTP/2 client falls back to HTTP/1.1 when
#: the server does not pick h2 (ALPN is a negotiation), so API and git clients keep working;
#: an h2-only protocol (gRPC) to a secret's host does not.
ALPN = ["http/1.1"]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_private(path: Path, data: bytes) -> None:
    write_atomic(path, data)  # 0600, on disk before it replaces anything


@dataclass
class WorkspaceCA:
    """A workspace's CA, and the leaf contexts made with it (in memory)."""

    key: ec.EllipticCurvePrivateKey = field(repr=False)
    cert: x509.Certificate
    pem: bytes
    _leaves: dict[str, tuple[ssl.SSLContext, datetime.datetime]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, directory: Path, label: str) -> WorkspaceCA:
        """The CA kept in ``directory`` (made there, under a lock, if there is none).
        Raises OSError."""
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_path, cert_path = directory / CA_KEY, directory / CA_CERT
        fd = os.open(directory / "secrets-ca.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError, ValueError):
                key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
                pem = cert_path.read_bytes()
                cert = x509.load_pem_x509_certificate(pem)
                if isinstance(key, ec.EllipticCurvePrivateKey) and cert.not_valid_after_utc > _now():
                    return cls(key, cert, pem)
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _make_ca(key, label)
            pem = cert.public_bytes(serialization.Encoding.PEM)
            _write_private(key_path, _pem_key(key))
            _write_private(cert_path, pem)
            return cls(key, cert, pem)
        finally:
            os.close(fd)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for ``host`` (a name or an IP literal)
        signed by this CA; made once per host and renewed before it expires."""
        cached = self._leaves.get(host)
        if cached is not None and cached[1] - _now() > LEAF_RENEW:
            return cached[0]
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = _make_leaf(self, key, host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(ALPN)
        _load_chain(ctx, leaf.public_bytes(serialization.Encoding.PEM) + self.pem + _pem_key(key))
        self._leaves[host] = (ctx, leaf.not_valid_after_utc)
        return ctx


def _make_ca(key: ec.EllipticCurvePrivateKey, label: str) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "loom-worker"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"loom-worker secrets CA {label}"[:64]),
        ]
    )
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )


def _make_leaf(ca: WorkspaceCA, key: ec.EllipticCurvePrivateKey, host: str) -> x509.Certificate:
    ip = parse_ip(host)
    san: x509.GeneralName = x509.IPAddress(ip) if ip is not None else x509.DNSName(host)
    # The name is in the SAN (what clients check); a CN holds at most 64 characters.
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)] if len(host) <= 64 else [])
    now = _now()
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + datetime.timedelta(hours=LEAF_HOURS))
        .add_extension(x509.SubjectAlternativeName([san]), critical=not subject)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca.key, hashes.SHA256())
    )


def _load_chain(ctx: ssl.SSLContext, pem: bytes) -> None:
    """``load_cert_chain`` from memory: a memfd, read through /proc/self/fd."""
    fd = os.memfd_create("loom-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def host_trust_file() -> str | None:
    """The host's own CA bundle (OpenSSL's default file, else certifi's)."""
    paths = ssl.get_default_verify_paths()
    for p in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if p and os.path.isfile(p):
            return p
    with contextlib.suppress(ImportError):
        import certifi

        return str(certifi.where())
    return None


def write_bundle(ca_pem: bytes, base: str | None, prefix: str) -> str:
    """The sandbox's trust bundle: ``base`` (a PEM file; None: the host's store) and the
    workspace CA, at ``<prefix>.ca-<hash>.pem`` (readable by the sandbox's user). Returns
    its path. Raises OSError.

    Versions unused for a day are removed (not at once: another worker process, or a
    container being created, may still name one)."""
    base_pem = b""
    src = base or host_trust_file()
    if src:
        base_pem = certificates(Path(src).read_bytes())  # certificates only: never a key beside them
    body = base_pem + b"# loom-worker: this workspace's secrets CA (the egress gateway's)\n" + ca_pem
    digest = hashlib.sha256(body).hexdigest()[:16]
    path = Path(f"{prefix}.ca-{digest}.pem")
    write_once(path, body)
    for old in path.parent.glob(f"{Path(prefix).name}.ca-*.pem"):
        with contextlib.suppress(OSError):
            if old != path and time.time() - old.stat().st_mtime > 86_400:
                old.unlink()
    return str(path)


def upstream_context(extra_ca: str | None = None) -> ssl.SSLContext:
    """How the gateway verifies a secret's real host: the host's trust store, plus the
    operator's extra bundle (``LOOM_EGRESS_UPSTREAM_CA``: a private registry, a test
    server). HTTP/1.1 only (the gateway speaks h11 to it). Raises OSError, ssl.SSLError
    for an extra bundle that cannot be loaded."""
    ctx = ssl.create_default_context()
    if extra_ca:
        ctx.load_verify_locations(cafile=extra_ca)
    ctx.set_alpn_protocols(ALPN)
    return ctx
