"""Whether a file is a usable PEM bundle: one check for the settings of the process
(``LOOM_CA_BUNDLE``, ``LOOM_EGRESS_UPSTREAM_CA``) and of a workspace (``ca_bundle``); and
the copy of its certificates a sandbox is given instead of the file itself."""

from __future__ import annotations

import errno
import hashlib
import re
from pathlib import Path

from .storage.atomic import write_atomic

_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+?-----END CERTIFICATE-----")
#: The trust copies' file names: ``ca-<sha256 of the certificates, 16 hex>.pem``.
COPY_PREFIX = "ca-"


def pem_problem(path: str) -> str | None:
    """What is wrong with ``path`` as a CA bundle (unreadable, no PEM certificate in its
    first MiB), or None when it is a readable file holding at least one certificate."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    if b"-----BEGIN CERTIFICATE-----" not in head:
        return f"{path} holds no PEM certificate"
    return None


def certificates(data: bytes) -> bytes:
    """The PEM certificates in ``data``, each as written, one after another: whatever else
    a bundle holds (a private key beside its certificate, comments) is left out."""
    return b"".join(m.group(0) + b"\n" for m in _CERTIFICATE.finditer(data))


def trusted_copy(path: str, directory: Path) -> str:
    """A copy of the certificates of bundle ``path`` in ``directory`` (mode 0644, named by
    their hash), the file a sandbox mounts instead of ``path``: read here, once, as the
    worker, so what the sandbox sees is certificates only (never a key kept in the same
    file) and cannot become another file later (``path`` swapped for a symlink after it
    was checked). Copies are kept: one per distinct bundle, and a container recreated
    from a spec made days ago still names its own. Safe from several threads and
    processes at once. Returns the copy's path. Raises OSError (``path`` unreadable, or
    without a certificate: ``EINVAL`` naming it)."""
    with open(path, "rb") as f:
        body = certificates(f.read(64 << 20))
    if not body:
        raise OSError(errno.EINVAL, "holds no PEM certificate", path)
    copy = directory / f"{COPY_PREFIX}{hashlib.sha256(body).hexdigest()[:16]}.pem"
    write_once(copy, body)
    return str(copy)


def write_once(path: Path, body: bytes) -> None:
    """Make ``path`` (a name given by its content's hash) hold ``body``, readable by a
    sandbox's user (0644, its directory 0711), unless it exists. Atomic, and safe from
    several threads and processes at once: each writer has its own temporary file, and
    whoever renames last renames the same bytes. Raises OSError."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    write_atomic(path, body, mode=0o644, fsync=False)
