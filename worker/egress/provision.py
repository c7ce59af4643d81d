"""The host's side of secrets, for one registry: the store, each workspace's CA, and what
a sandbox is given for them.

A sandbox of a workspace with secrets (its own or the defaults) and an egress allowlist
gets, through its spec (so a change is a new spec, and the container is recreated with
it at the next call):

* ``$NAME`` = the secret's placeholder, for each secret (after the workspace's own
  ``env``: a secret's name wins over a variable of the same name);
* the trust bundle (its CA bundle, ``LOOM_CA_BUNDLE`` or the host's store, plus the
  workspace's CA certificate) as its CA bundle, mounted read-only at
  ``/etc/loom/ca-bundle.pem`` and named by ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``,
  ``PIP_CERT``, ``NODE_EXTRA_CA_CERTS``, ``GIT_SSL_CAINFO``, ``CURL_CA_BUNDLE``.

Neither holds a value, and the CA's key stays in the data directory. A sandbox without
egress gets nothing: nothing it sends leaves it anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..changelog.recorder import workspace_dir
from .secretstore import SecretStore, Stamp, file_stamp

if TYPE_CHECKING:
    from .ca import WorkspaceCA

# .ca (and the cryptography package) is imported when a workspace first has secrets: a
# registry that never meets one does not pay for it.


@dataclass(frozen=True)
class SandboxSecrets:
    env: dict[str, str]  # NAME -> placeholder
    ca_bundle: str  # the trust bundle's path on the host


class SecretsHost:
    """The secrets of the workspaces under one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.store = SecretStore(self.data_dir)
        self._cas: dict[Path, tuple[Stamp, WorkspaceCA]] = {}

    def stamp(self, root: Path) -> tuple[Stamp, Stamp]:
        """Changes when a secrets file that applies to ``root`` does (two ``stat`` calls)."""
        return self.store.stamp(root)

    def loaded_ca(self, root: Path) -> WorkspaceCA | None:
        """``root``'s CA if this process has it and it has not changed (one ``stat``)."""
        from .ca import CA_CERT

        cached = self._cas.get(root)
        if cached is None or cached[0] != file_stamp(workspace_dir(self.data_dir, root) / CA_CERT):
            return None
        return cached[1]

    def ca(self, root: Path) -> WorkspaceCA:
        """``root``'s CA (read, or made on first use: a key, two files, fsync). Raises
        OSError."""
        from .ca import CA_CERT, WorkspaceCA

        ca = self.loaded_ca(root)
        if ca is not None:
            return ca
        d = workspace_dir(self.data_dir, root)
        ca = WorkspaceCA.open(d, d.name[:12])
        self._cas[root] = (file_stamp(d / CA_CERT), ca)
        return ca

    def for_sandbox(self, root: Path, base_bundle: str | None, socket_dir: Path) -> SandboxSecrets | None:
        """What ``root``'s sandbox gets (None: no secrets apply). ``base_bundle``: the CA
        bundle it would have without secrets; ``socket_dir``: its gateway directory, the
        bundle is written beside it. Raises OSError."""
        secrets = self.store.effective(root)
        if not secrets:
            return None
        from .ca import write_bundle

        bundle = write_bundle(self.ca(root).pem, base_bundle, str(socket_dir))
        return SandboxSecrets({s.name: s.placeholder for s in secrets.values()}, bundle)


def advice(secret: Any, created: bool, policy: Any) -> str:
    """What a change means for the sandbox, and what still keeps the secret from being
    used (hosts off the workspace's allowlist), in words for the CLI and the API.
    ``policy``: the workspace's egress allowlist (None: the process-wide defaults)."""
    if created:
        text = (
            f"Saved. The sandbox sees ${secret.name} (a placeholder, never the value) once it is recreated, at "
            "its next call (files are kept); the gateway puts the value in requests to its hosts."
        )
    else:
        text = "Saved. The next request to its hosts uses it (the placeholder is unchanged)."
    if policy is not None and not policy:
        text += " This workspace has no egress allowlist: nothing leaves its sandbox until it has one."
    elif policy is not None:
        off = [r.text for r in secret.rules if not any(policy.check(_example(r), p).allowed for p in r.ports)]
        if off:
            text += f" Not on this workspace's egress allowlist, so not reachable until they are: {', '.join(off)}."
    return text


def _example(rule: Any) -> str:
    """A name the rule matches (for ``*.example.com``: a name under it)."""
    if rule.ip is not None:
        return str(rule.ip)
    return str(rule.host) if rule.host is not None else f"loom-check.{rule.suffix}"
