"""Test cleanup: the engine's fork volumes (overlay forks) whose layers a test's data
directory holds. tmp_path goes; the engine's volumes would stay."""

from __future__ import annotations

from pathlib import Path

import docker


def remove_fork_volumes(under: Path) -> int:
    """Remove (forced: their containers first) the fork volumes whose upper layer is under
    ``under``. Returns how many."""
    client = docker.from_env()
    n = 0
    try:
        for vol in client.volumes.list(filters={"name": "loom-fork-"}):
            if f"upperdir={under}" not in (vol.attrs.get("Options") or {}).get("o", ""):
                continue
            for c in client.containers.list(all=True, filters={"volume": vol.name}):
                c.remove(force=True)
            vol.remove(force=True)
            n += 1
    finally:
        client.close()
    return n
