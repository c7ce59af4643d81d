"""``loom-worker egress-log``: what a workspace's sandbox tried to reach, and what the
egress gateway did (the allowlist itself: ``loom-worker workspace set --egress``).

Exit codes: 0 ok, 2 a bad argument (no such directory, a settings file that is not
valid).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from .common import path_arg

if TYPE_CHECKING:
    from ..settings import Settings


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _print(status: dict[str, Any]) -> None:
    policy = ", ".join(status["policy"]) or "none (no network)"
    print(f"allowlist: {policy}")
    for rec in reversed(status["entries"]):  # oldest first, as a log reads
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(rec.get("time", 0))))
        where = f"{rec.get('host')}:{rec.get('port')}" if rec.get("kind") != "dns" else str(rec.get("host"))
        moved = ""
        if rec.get("bytes_up") or rec.get("bytes_down"):
            moved = f"  up {_size(int(rec['bytes_up']))} down {_size(int(rec['bytes_down']))}"
        addr = f" -> {rec['address']}" if rec.get("address") else ""
        verdict, kind = rec.get("verdict", "?"), rec.get("kind", "?")
        if kind == "secret":  # a secret used in a request (or a placeholder that was not)
            answer = f" -> {rec['status']}" if rec.get("status") else ""
            where += f" {rec.get('secret') or '-'} {rec.get('method')} {rec.get('path')}{answer}"
        print(f"{when}  {verdict:<8} {kind:<11} {where}{addr}{moved}  {rec.get('reason')}")


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    from ..registry import default_registry
    from ..tool import ToolError
    from ..workspace_settings import SettingsError

    async with default_registry(settings, catalog=False) as registry:
        try:
            status = registry.egress_status(args.workspace, limit=args.limit, verdict=args.verdict)
        except (ToolError, SettingsError) as e:
            print(f"loom-worker egress-log: error: {e}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        _print(status)
    return 0


def _sync(args: argparse.Namespace, settings: Settings) -> int:
    from .. import aio

    return aio.run(_run(args, settings))


def register(sub: Any) -> None:
    p = sub.add_parser(
        "egress-log",
        help="What a workspace's sandbox tried to reach, and the gateway's verdicts.",
        epilog="Exit status: 0; 2 usage error (an unknown workspace).",
    )
    p.add_argument("--workspace", "-w", required=True, type=path_arg, help="The workspace directory.")
    p.add_argument("--limit", "-n", type=int, default=50, help="The newest N records (default 50).")
    p.add_argument("--verdict", choices=("allowed", "denied", "limited", "error"), help="Only these.")
    p.add_argument("--json", action="store_true", help="Print JSON (newest first).")
    p.set_defaults(func=_sync)
