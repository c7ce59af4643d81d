"""A workspace's identity: the sha256 of its real path, the one key every part of the
worker names a workspace by on the host.

Its forms must agree where two parts meet: the container of a workspace is named by
:func:`workspace_key` (``loom-sbx-<key>``, :mod:`sandbox.docker`) and so is the directory
its egress gateway's socket is in (``<egress dir>/<key>/s``, :mod:`worker.egress`), while
the changelog keeps a workspace's data under the longer :func:`workspace_digest` prefix
(``<data dir>/workspaces/<32 hex>``). It lives here, in ``sandbox``, because sandbox code
needs it and ``sandbox`` never imports ``worker``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: Hex digits of :func:`workspace_key` (container names, egress socket directories).
KEY_LENGTH = 16


def workspace_digest(workspace: Path | str) -> str:
    """The sha256 (hex) of ``workspace``'s real path (``~`` is not expanded; links are
    followed as far as they exist, as :func:`os.path.realpath` does). Never raises for a
    path that does not exist."""
    return hashlib.sha256(os.path.realpath(workspace).encode()).hexdigest()


def workspace_key(workspace: Path | str) -> str:
    """The short identity of ``workspace`` (:data:`KEY_LENGTH` hex digits of
    :func:`workspace_digest`) its container and its egress socket directory are named by."""
    return workspace_digest(workspace)[:KEY_LENGTH]


#: Names of the engine volumes forks live on (``sandbox.docker.overlays``).
FORK_VOLUME_PREFIX = "loom-fork-"


def fork_volume_of(path: Path | str) -> str | None:
    """The fork volume whose mountpoint ``path`` is, judged by its shape
    (``…/volumes/loom-fork-<hex>/_data``, the engine's own layout), or None. Only a shape:
    the Docker backend asks the engine before a sandbox mounts it."""
    p = Path(path)
    if p.name == "_data" and p.parent.name.startswith(FORK_VOLUME_PREFIX) and p.parent.parent.name == "volumes":
        return p.parent.name
    return None
