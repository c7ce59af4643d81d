"""``loom-worker secret set|list|delete``: credentials the egress gateway adds to requests
to their hosts, which a sandbox never sees (it sees ``$NAME`` = a placeholder).

    printf %s "$GITHUB_TOKEN" | loom-worker secret set -w ./proj GH_TOKEN \\
        --host api.github.com --header 'Authorization: Bearer {value}'
    loom-worker secret set -w ./proj GIT_TOKEN --host github.com --basic x-access-token --value-file ~/.tok
    loom-worker secret list -w ./proj        (or --default: the process-wide defaults)
    loom-worker secret delete -w ./proj GH_TOKEN

The value comes from stdin (a prompt that does not echo it when stdin is a terminal) or
``--value-file``, never from the command line, where the shell's history and ``ps`` would
keep it. Nothing prints it. Exit codes: 0 ok, 2 a refused argument (the message names
it), 1 the secrets file could not be written.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from .common import path_arg

if TYPE_CHECKING:
    from pathlib import Path

    from ..settings import Settings


def _usage(message: str) -> int:
    print(f"loom-worker secret: error: {message}", file=sys.stderr)
    return 2


def _root(args: argparse.Namespace) -> Path | str | None:
    """The workspace (None: the defaults), or a usage message."""
    if args.default:
        return None
    if args.workspace is None:
        return "give --workspace DIR (or --default for the process-wide defaults)"
    root = args.workspace.expanduser().resolve()
    if not root.is_dir():
        return f"--workspace {args.workspace}: not a directory"
    return root


def _read_value(args: argparse.Namespace) -> str:
    """Raises OSError (the file)."""
    if args.value_file is not None:
        text = args.value_file.expanduser().read_text(encoding="utf-8")
    elif sys.stdin.isatty():
        import getpass

        text = getpass.getpass(f"Value of {args.name} (not shown): ")
    else:
        text = sys.stdin.read()
    return text.removesuffix("\n").removesuffix("\r")


def _policy(settings: Settings, root: Path) -> Any:
    from ..egress.policy import EgressPolicy, parse_allow_env
    from ..workspace_settings import SettingsStore

    own = SettingsStore(settings.data_dir).load(root).egress
    return EgressPolicy.parse(own if own is not None else parse_allow_env(settings.egress_allow))


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from ..egress.provision import advice
    from ..egress.secrets import SecretError
    from ..egress.secretstore import SecretStore
    from ..workspace_settings import SettingsError

    root = _root(args)
    if isinstance(root, str):
        return _usage(root)
    store = SecretStore(settings.data_dir)
    try:
        if args.action == "list":  # a workspace's: its own and the defaults it gets
            store.load(root)  # (a file that does not parse is an error here, not hidden)
            secrets = store.load(None) if root is None else store.effective(root)
            if args.json:
                print(json.dumps([s.public() for s in secrets.values()], indent=2))
            for s in [] if args.json else sorted(secrets.values(), key=lambda s: s.name):
                how = f"header {s.header.text}" if s.header else f"query parameter {s.query}"
                print(f"{s.name:<20} {', '.join(s.hosts)}  ({how}; {s.scope}; ${s.name}={s.placeholder})")
            if not secrets and not args.json:
                print("no secrets", file=sys.stderr)
            return 0
        if args.action == "delete":
            if not store.delete(root, args.name):
                return _usage(f"no secret {args.name} here")
            print(f"Deleted {args.name}: no longer added to requests (the sandbox drops ${args.name} when recreated).")
            return 0
        header = args.header
        if args.basic is not None:
            if header is not None:
                return _usage("give one of --header, --basic, --query")
            header = f"Authorization: Basic {{{args.basic}:value}}"
        if (header is None) == (args.query is None):
            return _usage("say how it is used: --header 'Name: ... {value}', --basic USER or --query PARAM")
        existed = args.name in store.load(root)
        try:
            value = _read_value(args)
        except (OSError, UnicodeDecodeError) as e:
            return _usage(f"--value-file: cannot read it ({type(e).__name__})")
        secret = store.set(root, args.name, hosts=args.host, header=header, query=args.query, value=value)
        print(advice(secret, not existed, None if root is None else _policy(settings, root)))
        print(f"${secret.name} in the sandbox: {secret.placeholder}")
        return 0
    except (SecretError, SettingsError) as e:
        return _usage(str(e))
    except OSError as e:
        print(f"loom-worker secret: {e}", file=sys.stderr)
        return 1


class _NoValueOnArgv(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kw: object) -> None:
        parser.error("the value is read from stdin or --value-file, never the command line (history and ps keep it)")


def register(sub: Any) -> None:
    p = sub.add_parser("secret", help="Credentials added by the egress gateway; the sandbox sees placeholders.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (
        ("set", "Create or change a secret (value from stdin or --value-file)."),
        ("list", "The secrets (never their values)."),
        ("delete", "Delete a secret."),
    ):
        q = actions.add_parser(
            name,
            help=text,
            epilog="Exit status: 0; 1 the secrets file could not be written; 2 usage error (a refused name, "
            "host, template or value, an unknown workspace, a value given on the command line).",
        )
        where = q.add_mutually_exclusive_group()
        where.add_argument("--workspace", "-w", type=path_arg, help="The workspace directory.")
        where.add_argument("--default", action="store_true", help="The process-wide defaults (every workspace).")
        q.set_defaults(func=_run)
        if name == "list":
            q.add_argument("--json", action="store_true", help="Print JSON.")
            continue
        q.add_argument("name", metavar="NAME", help="Its name: the variable the sandbox sees ($NAME).")
        if name == "delete":
            continue
        q.add_argument(
            "--host", action="append", required=True, help="A host it is sent to, as in the egress allowlist (repeat)."
        )
        q.add_argument("--header", help="Header template: 'Authorization: Bearer {value}', 'X-API-Key: {}'.")
        q.add_argument("--basic", metavar="USER", help="HTTP Basic credentials USER:value (git over HTTPS).")
        q.add_argument("--query", metavar="PARAM", help="Or a query parameter.")
        q.add_argument("--value-file", dest="value_file", type=path_arg, help="Read the value from this file.")
        q.add_argument("--value", nargs="?", action=_NoValueOnArgv, help=argparse.SUPPRESS)
