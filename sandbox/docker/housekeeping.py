"""Housekeeping: the sandboxes on the engine (list, gc), a workspace container's status
and usage. Only containers carrying our labels are ever touched, and ``gc`` only those
of its own owner (the worker installation, ``SandboxSpec.owner``) unless asked for an
engine-wide sweep: two installations sharing one engine must not remove each other's
sandboxes in the middle of a call."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import DaemonUnavailableError, SandboxUnavailableError
from . import hostmounts, slots
from .config import LABEL_OWNER, LABEL_PIDS, LABEL_POOL, LABEL_VERSION, LABEL_WORKER
from .engine import Engine


def _int_label(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


async def list_sandboxes(engine: Engine) -> list[dict[str, Any]]:
    """Every container carrying our labels, running or not, of every owner (``owner``:
    its owner label, None for one made without); ``workspace`` is None for a warm
    sandbox nobody claimed (``pooled``: True for every warm one). Raises
    DaemonUnavailableError."""
    containers = await engine.listed("list sandboxes", {"label": f"{LABEL_WORKER}=1"})
    workspaces = await asyncio.to_thread(lambda: [slots.workspace_of(c.labels) for c in containers])
    return [
        {
            "name": c.name,
            "status": c.status,
            "workspace": ws,
            "pooled": LABEL_POOL in (c.labels or {}),
            "version": (c.labels or {}).get(LABEL_VERSION),
            "owner": (c.labels or {}).get(LABEL_OWNER) or None,
            "container": c,
        }
        for c, ws in zip(containers, workspaces, strict=True)
    ]


async def gc(
    engine: Engine, owner: str | None, *, all_running: bool = False, engine_wide: bool = False
) -> list[dict[str, Any]]:
    """Remove the stale sandboxes of ``owner`` (None: those made without an owner label):
    exited ones, those of vanished workspaces or of other worker versions, warm sandboxes
    nobody claimed (a running pool refills), and with ``all_running`` every one of them.
    A warm sandbox's slot is released with it (its workspace's bind undone).
    ``engine_wide`` drops the owner test: every loom sandbox on the engine, whoever made
    it (another data directory's, another user's worker, a running service's). Only our labels are touched.

    One the engine fails to remove (it times out on a container whose runtime hangs)
    does not stop the others: they are removed, then the error names it.

    Returns what was removed (``list_sandboxes`` items without the container). Raises
    DaemonUnavailableError.
    """
    removed = []
    failed: list[tuple[str, DaemonUnavailableError]] = []
    for item in await list_sandboxes(engine):
        if not engine_wide and item["owner"] != (owner or None):
            continue
        ws = item["workspace"]
        stale = (
            item["status"] != "running"
            or not ws
            or not Path(ws).is_dir()
            or item["version"] != __version__
            or all_running
        )
        if stale:
            try:
                await engine.remove(item["container"])
            except DaemonUnavailableError as e:
                failed.append((item["name"], e))
                continue
            await asyncio.to_thread(slots.release_container, item["container"])
            removed.append({k: v for k, v in item.items() if k != "container"})
    if failed:
        names = ", ".join(name for name, _ in failed)
        raise DaemonUnavailableError(
            f"gc removed {len(removed)} sandbox(es) but not {len(failed)}: {names}: {failed[0][1]}"
        )
    return removed


async def release_pool_root(engine: Engine, root: Path) -> None:
    """Undo the warm pool directory's own mounts (:func:`.hostmounts.release_root`) once
    no sandbox on the engine has a slot there (another owner's pool may share it). Raises
    DaemonUnavailableError, OSError."""
    prefix = os.path.realpath(root) + os.sep
    for item in await list_sandboxes(engine):
        slot = slots.slot_of(slots.labels_of(item["container"]))
        if slot is not None and str(slot).startswith(prefix):
            return
    await asyncio.to_thread(hostmounts.release_root, root)


class Status:
    """Workspace containers' status; remembers each one's last CPU reading, so that the
    next look gives the CPU used since."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._cpu_seen: dict[str, tuple[int, float]] = {}  # container id -> (CPU ns, monotonic s)

    async def of(self, container: Any, *, usage: bool = True) -> dict[str, Any] | None:
        """A workspace's container as it is now, without starting one (None when it has
        none): its state, image, runtime and limits, and while it runs and ``usage`` is
        asked for, its CPU (percent of one CPU since this backend last looked; two looks
        0.1 s apart the first time) and memory in use (page cache it can drop not counted,
        as ``docker stats``; None without ``usage``). Raises DaemonUnavailableError."""
        if container is None:
            return None
        attrs = container.attrs or {}
        state, host, config = attrs.get("State") or {}, attrs.get("HostConfig") or {}, attrs.get("Config") or {}
        nano = host.get("NanoCpus") or 0
        out: dict[str, Any] = {
            "container": container.name,
            "status": state.get("Status"),
            "running": state.get("Status") == "running",
            "oom_killed": bool(state.get("OOMKilled")),
            "started_at": state.get("StartedAt"),
            "image": config.get("Image"),
            "runtime": host.get("Runtime"),
            "limits": {
                "cpus": nano / 1e9 if nano else None,
                "memory_bytes": host.get("Memory") or None,
                "pids": _int_label((config.get("Labels") or {}).get(LABEL_PIDS)) or host.get("PidsLimit") or None,
            },
            "usage": None,
        }
        if out["running"] and usage:
            out["usage"] = await self._usage(container)
        return out

    async def _usage(self, container: Any) -> dict[str, Any] | None:
        def sample() -> dict[str, Any]:
            stats: dict[str, Any] = container.stats(stream=False, one_shot=True)
            return stats

        try:
            stats = await self._engine.call("sandbox stats", sample)
            now = time.monotonic()
            seen = self._cpu_seen.get(container.id)
            if seen is None or now - seen[1] > 60:
                self._cpu_seen[container.id] = (_cpu_ns(stats), now)
                await asyncio.sleep(0.1)
                stats = await self._engine.call("sandbox stats", sample)
                now = time.monotonic()
        except SandboxUnavailableError as e:
            if "No such container" in str(e) or "404" in str(e):
                return None  # it stopped between the two looks
            raise
        cpu = _cpu_ns(stats)
        prev = self._cpu_seen.get(container.id)
        if len(self._cpu_seen) > 512:
            self._cpu_seen.clear()
        self._cpu_seen[container.id] = (cpu, now)
        mem = stats.get("memory_stats") or {}
        detail = mem.get("stats") or {}
        usage = mem.get("usage")
        if isinstance(usage, int):
            usage -= detail.get("total_inactive_file", detail.get("inactive_file", 0)) or 0
        percent = None
        if prev is not None and now > prev[1] and cpu >= prev[0]:
            percent = round((cpu - prev[0]) / ((now - prev[1]) * 1e9) * 100, 1)
        return {
            "cpu_percent": percent,
            "memory_bytes": usage if isinstance(usage, int) else None,
            "memory_limit_bytes": mem.get("limit"),
            "pids": (stats.get("pids_stats") or {}).get("current"),
        }


def _cpu_ns(stats: dict[str, Any]) -> int:
    total = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    return total if isinstance(total, int) else 0
