"""``loom-worker workspace set|show``: one workspace's own sandbox settings.

The settings live on the host next to the workspace's changelog (see
:mod:`worker.workspace_settings`); the sandbox is recreated with them at the workspace's
next call, its files kept. Exit codes: 0 ok, 2 a refused value (the message names the
field; nothing is stored), 1 the settings could not be stored or the engine could not be
asked about a runtime.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from .common import path_arg

if TYPE_CHECKING:
    from ..settings import Settings

_FIELDS = (
    "image",
    "runtime",
    "cpus",
    "memory",
    "pids",
    "idle_ttl",
    "env",
    "ca_bundle",
    "egress",
    "allow_root",
    "tmp_size",
    "home_size",
    "agents",
)


def _usage(message: str) -> int:
    print(f"loom-worker workspace: error: {message}", file=sys.stderr)
    return 2


def _changes(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, Any] | str:
    """The requested changes, or a usage message."""
    out: dict[str, Any] = {}
    for name in ("image", "runtime", "cpus", "memory", "pids", "idle_ttl", "ca_bundle", "tmp_size", "home_size"):
        value = getattr(args, name)
        if value is not None:
            out[name] = value
    env = dict(current_env)
    touched = False
    for item in args.env or []:
        key, sep, value = item.partition("=")
        if not sep:
            return f"--env {item!r}: use KEY=VALUE"
        env[key] = value
        touched = True
    for name in args.unset or []:
        if name.startswith("env."):
            env.pop(name[4:], None)
            touched = True
        elif name in _FIELDS:
            out[name] = None
        else:
            return f"--unset {name!r}: not a setting (one of {', '.join(_FIELDS)}, or env.NAME)"
    if touched:
        out["env"] = env or None
    if args.egress is not None:
        # "pypi,npm,!x.org"; "" or "none" for no network at all.
        text = args.egress.strip()
        out["egress"] = [] if text.lower() in ("", "none") else [e.strip() for e in text.split(",") if e.strip()]
    if args.allow_root is not None:
        out["allow_root"] = args.allow_root
    if args.agents is not None:
        # "claude,codex"; "" or "none" for none.
        text = args.agents.strip()
        out["agents"] = [] if text.lower() in ("", "none") else [a.strip() for a in text.split(",") if a.strip()]
    if args.ca_bundle is not None:
        from pathlib import Path

        out["ca_bundle"] = str(Path(args.ca_bundle).expanduser().resolve())
    return out


def _print(result: dict[str, Any], as_json: bool) -> None:
    from ..changelog.model import size_text

    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return
    own = result.get("settings") or {}
    for key, value in result["effective"].items():
        if key == "env":
            value = " ".join(f"{k}={v}" for k, v in value.items()) or "-"
        elif key == "egress":
            value = ", ".join(value) if value else "none (no network)"
        elif key == "memory":
            value = f"{size_text(value)} ({value} bytes)"
        source = "workspace" if key in own else "default"
        print(f"{key:<10} {value if value is not None else '-'}  ({source})")
    if "message" in result:
        print(result["message"], file=sys.stderr)


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    from sandbox.errors import SandboxError
    from sandbox.pulls import PULL_SINK

    from ..registry import default_registry
    from ..tool import ToolError
    from ..workspace_settings import SettingsError
    from .pullbar import PullBar

    PULL_SINK.set(PullBar())  # a new --image is pulled now (LOOM_PULL): its progress on stderr
    async with default_registry(settings, catalog=False) as registry:
        try:
            if args.action == "show":
                own, eff = await registry.workspace_settings(args.workspace)
                _print({"workspace": str(args.workspace), "settings": own.set_fields(), "effective": eff}, args.json)
                return 0
            own, _eff = await registry.workspace_settings(args.workspace)
            changes = _changes(args, dict(own.env or {}))
            if isinstance(changes, str):
                return _usage(changes)
            if not changes:
                return _usage("nothing to set (see loom-worker workspace set --help)")
            done = await registry.configure_workspace(args.workspace, changes)
        except SettingsError as e:
            return _usage(str(e))
        except ToolError as e:
            return _usage(str(e))
        except (SandboxError, OSError) as e:
            print(f"loom-worker workspace: {e}", file=sys.stderr)
            return 1
        _print({"workspace": str(args.workspace), **done.as_dict()}, args.json)
        return 0


def _sync(args: argparse.Namespace, settings: Settings) -> int:
    from .. import aio

    return aio.run(_run(args, settings))


def register(sub: Any) -> None:
    p = sub.add_parser("workspace", help="Show or change one workspace's sandbox settings.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (("show", "Show its own and the effective settings."), ("set", "Change its settings.")):
        q = actions.add_parser(
            name,
            help=text,
            epilog="Exit status: 0; 1 the sandbox or the settings file failed; 2 usage error (an unknown "
            "workspace, a value that does not validate).",
        )
        q.add_argument("--workspace", "-w", required=True, type=path_arg, help="The workspace directory.")
        q.add_argument("--json", action="store_true", help="Print JSON.")
        q.set_defaults(func=_sync)
        if name != "set":
            continue
        q.add_argument("--image", help="Sandbox image (any image with /bin/sh).")
        q.add_argument("--runtime", help="runc, or runsc for gVisor.")
        q.add_argument("--cpus", type=float, help="CPU limit.")
        q.add_argument("--memory", help="Memory limit, e.g. 2g.")
        q.add_argument("--pids", type=int, help="Process limit.")
        q.add_argument("--idle-ttl", dest="idle_ttl", type=int, help="Seconds without calls before it exits.")
        q.add_argument("--tmp-size", dest="tmp_size", help="Size of /tmp (a tmpfs, counted in memory), e.g. 2g.")
        q.add_argument("--home-size", dest="home_size", help="Size of $HOME (a tmpfs, counted in memory), e.g. 2g.")
        q.add_argument(
            "--agents",
            metavar="LIST",
            help="Agent CLIs of the host's agents store (loom-worker agent install NAME), comma-separated "
            "(claude,codex,opencode): mounted read-only at /opt/loom/agents/<name>, on PATH; 'none' for none.",
        )
        q.add_argument("--env", action="append", metavar="KEY=VALUE", help="Set a variable (repeatable).")
        q.add_argument("--ca-bundle", dest="ca_bundle", help="PEM file on the host: the sandbox's trust store.")
        q.add_argument(
            "--egress",
            metavar="LIST",
            help="Hosts the sandbox may reach, comma-separated: pypi.org, *.example.com, host:8443, presets "
            "pypi,npm,debian,github, !denied.host; 'none' for no network. Applies to new connections at once.",
        )
        q.add_argument(
            "--allow-root",
            dest="allow_root",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="Let a harness run commands as root (inspect's adduser): a writable root file system and the "
            "capabilities adduser needs, for root alone. Off by default; see docs/harness.md for the trade.",
        )
        q.add_argument(
            "--unset", action="append", metavar="NAME", help="Back to the default: a setting, or env.KEY (repeatable)."
        )
