"""What the core commands call when given ``--ray`` (found by the entry point
``loom_worker.integrations: ray``): ``loom-worker cluster ...`` and the front door of
``loom-worker serve --ray``."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from ...settings import Settings
from .client import ClusterRegistry
from .errors import RayNotConnectedError


def front_door(settings: Settings, address: str, namespace: str, e2b: list[Any] | None = None) -> Any:
    """The service app whose workspaces are on the cluster (:mod:`.frontdoor`), with
    E2B's routes ``e2b`` (None: those ``serve`` mounts)."""
    from .frontdoor import front_door as make

    return make(settings, address, namespace=namespace, e2b=e2b)


def cluster_command(action: str, address: str, namespace: str, as_json: bool) -> int:
    """``loom-worker cluster status|metrics|gc``. Returns the exit code (1: the cluster
    cannot be reached)."""
    from . import status

    try:
        cluster = ClusterRegistry.connect(address, namespace=namespace)
    except RayNotConnectedError as e:
        print(f"loom-worker cluster: {e}", file=sys.stderr)
        return 1

    async def run() -> Any:
        async with cluster:
            if action == "status":
                return await status.status(namespace)
            if action == "metrics":
                return {"nodes": await status.metrics(namespace)}
            return {"nodes": await status.gc(namespace)}

    found = asyncio.run(run())
    if action == "status":
        _status(found, as_json)
    elif as_json:
        print(json.dumps(found, indent=2))
    else:
        for node in found["nodes"]:
            print(node.pop("node_id"), json.dumps(node))
    return 1 if any("error" in n for n in found["nodes"]) else 0


def _status(found: dict[str, Any], as_json: bool) -> None:
    if as_json:
        keys = ("node_id", "alive", "slots", "used", "workspaces")
        print(json.dumps({"nodes": [{k: n[k] for k in keys} for n in found["nodes"]]}, indent=2))
        return
    print(f"{'NODE':<18} {'ALIVE':<6} {'SLOTS':>5} {'USED':>5} {'OPEN':>5}  {'VERSIONS':<22} WORKSPACES")
    for n in found["nodes"]:
        d = n["details"]
        versions = f"loom {d['loom_version']} ray {d['ray_version']}" if "loom_version" in d else "-"
        ws = ", ".join(n["workspaces"]) or "-"
        print(
            f"{n['node_id'][:16]:<18} {'yes' if n['alive'] else 'LOST':<6} {n['slots']:>5} {n['used']:>5} "
            f"{d.get('sandboxes_open', '-'):>5}  {versions:<22} {ws}"
        )
