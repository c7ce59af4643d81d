"""The ``loom-worker`` command.

Each area contributes its subcommands from its own module, listed here in one visible
place; each module exposes ``register(subparsers)`` and sets ``func`` on its parsers.
``func(args, settings)`` returns the process exit code (0 ok, 1 tool/command failed,
2 usage error). A command that sets ``own_settings=True`` gets ``settings=None`` and
reads them itself (:func:`load_settings`) only when it needs them: ``call`` through the
local worker never does.

Nothing heavy is imported at module level here or in the command modules: ``--help``,
``tools`` and ``call`` through the local worker stay in tens of milliseconds, where
importing pydantic, the registry, the MCP SDK and the Docker SDK costs about 0.7 s.
"""

from __future__ import annotations

import importlib
import sys

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from pathlib import Path

    from ..settings import Settings

COMMAND_MODULES = (
    "worker.cli.sandboxes",  # demo, doctor, gc, stop, build-image
    "worker.cli.tools",  # call, batch, tools
    "worker.cli.changelog",  # log, diff, undo
    "worker.cli.service",  # serve, mcp
    "worker.cli.catalog",  # tools search / tools index (extends `tools`)
    "worker.cli.workspace",  # workspace set / show
    "worker.cli.egress",  # egress-log
    "worker.cli.daemon",  # daemon status / stop (the CLI's local worker)
    "worker.cli.exec",  # exec (a command, its output as it comes)
    "worker.cli.ports",  # port-forward
    "worker.cli.snapshots",  # snapshot create|list|show|delete, fork, restore
)

#: Commands whose parser is built alone when one of them is run: argparse takes about
#: 20 ms to build every command's parser, most of what a call through the local worker
#: costs. Their modules' ``register(subparsers, only=name)`` adds just that command.
ALONE = {"call": "worker.cli.tools", "batch": "worker.cli.tools", "exec": "worker.cli.exec"}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command's parser, or with ``only`` (a key of :data:`ALONE`) a parser
    that knows that one command."""
    from .parser import Parser

    parser = Parser(prog="loom-worker", description="Sandboxed tool execution for AI coding agents.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    if only is not None:
        importlib.import_module(ALONE[only]).register(sub, only=only)
        return parser
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue  # an area not built yet
        module.register(sub)
    return parser


def path_arg(value: str) -> Path:
    """``type=`` of a path option (pathlib is imported only when one is given)."""
    from pathlib import Path

    return Path(value)


def load_settings() -> Settings:
    """The ``LOOM_*`` settings. A value that does not validate is a usage error: it is
    reported naming the variable, and the process exits 2 (raises SystemExit)."""
    from pydantic import ValidationError

    from ..settings import Settings, describe_errors

    try:
        return Settings()
    except ValidationError as e:
        print(f"loom-worker: error: {describe_errors(e)}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "call":
        from .tools import parse_call_fast

        fast = parse_call_fast(argv[1:])
        if fast is not None:  # the usual forms: no argparse at all (its import and set-up: ~5 ms)
            return int(fast.func(fast, None) or 0)
    parser = build_parser(argv[0] if argv and argv[0] in ALONE else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    settings = None if getattr(args, "own_settings", False) else load_settings()
    return int(args.func(args, settings) or 0)
