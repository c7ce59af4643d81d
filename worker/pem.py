"""Whether a file is a usable PEM bundle: one check for the settings of the process
(``LOOM_CA_BUNDLE``, ``LOOM_EGRESS_UPSTREAM_CA``) and of a workspace (``ca_bundle``)."""

from __future__ import annotations


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
