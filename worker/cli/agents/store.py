"""``loom-worker agent install|list|remove``: the host's agents store (docs/agents.md).

    loom-worker agent install claude            (the registry's latest, pinned)
    loom-worker agent install codex 0.171.0 --json
    loom-worker agent list [--json]
    loom-worker agent remove opencode [VERSION]

``install`` runs ``npm install`` inside a loom sandbox (the default image) whose only way out
is loom's egress gateway with the npm registry allowed; its progress goes to stderr, the
result to stdout. Exit codes: 0 done; 1 the install failed (nothing of it is kept); 2 a usage
error (an unknown agent, a bad version: the message names it).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...agents.store import AgentStore, Installed
    from ...settings import Settings


def _usage(message: str) -> int:
    print(f"loom-worker agent: error: {message}", file=sys.stderr)
    return 2


def _store(settings: Settings, *, install: bool = False) -> AgentStore:
    from ...agents.store import AgentStore

    installer = None
    if install:
        from ...agents.npm_install import sandbox_installer

        installer = sandbox_installer(settings)
    return AgentStore(settings.data_dir / "agents", installer=installer)


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def _line(i: Installed) -> str:
    return f"{i.name:<10} {i.version:<16} {_mb(i.size):>8}  {'pinned' if i.pinned else '':<6}  {i.package}"


def _install(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from ...agents.catalog import AGENTS, check_version
    from ...agents.store import InstallError

    if args.name not in AGENTS:
        return _usage(f"NAME: unknown agent {args.name!r} (known: {', '.join(AGENTS)})")
    if args.version is not None:
        try:
            check_version(args.version)
        except ValueError as e:
            return _usage(f"VERSION: {e}")

    def progress(message: str) -> None:
        print(f"[agent install] {message}", file=sys.stderr, flush=True)

    try:
        got = asyncio.run(_store(settings, install=True).install(args.name, args.version, progress=progress))
    except (InstallError, OSError) as e:
        print(f"loom-worker agent install: {args.name}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(got.as_dict(), indent=2))
    else:
        print(f"{got.name} {got.version} installed and pinned ({_mb(got.size)}): {got.path}")
    return 0


def _list(args: argparse.Namespace, settings: Settings) -> int:
    items = _store(settings).installed()
    if args.json:
        print(json.dumps([i.as_dict() for i in items], indent=2))
    elif not items:
        print("No agents installed (loom-worker agent install claude|codex|opencode).")
    else:
        print(f"{'NAME':<10} {'VERSION':<16} {'SIZE':>8}  {'PINNED':<6}  PACKAGE")
        for i in items:
            print(_line(i))
    return 0


def _remove(args: argparse.Namespace, settings: Settings) -> int:
    from ...agents.catalog import AGENTS

    if args.name not in AGENTS:
        return _usage(f"NAME: unknown agent {args.name!r} (known: {', '.join(AGENTS)})")
    try:
        gone = _store(settings).remove(args.name, args.version)
    except LookupError as e:
        return _usage(str(e.args[0]))
    except OSError as e:
        print(f"loom-worker agent remove: {e}", file=sys.stderr)
        return 1
    print(f"removed {args.name} {', '.join(gone)}")
    return 0


def register(sub: Any) -> None:
    from ...agents.catalog import AGENTS

    known = "|".join(AGENTS)
    p = sub.add_parser(
        "install",
        help=f"Install an agent CLI ({known}) from npm into the host's agents store, and pin it.",
        description="npm install runs in a loom sandbox that reaches only the npm registry, through loom's egress "
        "gateway; the install is put in place (and pinned) only when it completed.",
        epilog="Exit status: 0; 1 the install failed (nothing of it is kept); 2 usage error.",
    )
    p.add_argument("name", metavar="NAME", help=f"The agent: {', '.join(AGENTS)}.")
    p.add_argument("version", metavar="VERSION", nargs="?", help="An exact version or a tag (default: latest).")
    p.add_argument("--json", action="store_true", help="Print the install as JSON.")
    p.set_defaults(func=_install)
    q = sub.add_parser(
        "list", help="The agents installed: name, version, size, which one is pinned.", epilog="Exit status: 0."
    )
    q.add_argument("--json", action="store_true", help="Print JSON.")
    q.set_defaults(func=_list)
    r = sub.add_parser(
        "remove",
        help="Remove an installed agent (one version, or all of them).",
        epilog="Exit status: 0; 1 the store could not be changed; 2 usage error (an unknown agent, one not installed).",
    )
    r.add_argument("name", metavar="NAME", help=f"The agent: {', '.join(AGENTS)}.")
    r.add_argument("version", metavar="VERSION", nargs="?", help="Only this version (default: every one).")
    r.set_defaults(func=_remove)
