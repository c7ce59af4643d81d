"""The ``loom-worker`` command.

Each area contributes its subcommands from its own module, listed here in one visible
place; each module exposes ``register(subparsers)`` and sets ``func`` on its parsers.
``func(args, settings)`` returns the process exit code (0 ok, 1 tool/command failed,
2 usage error).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..settings import Settings

COMMAND_MODULES = (
    "worker.cli.sandboxes",  # demo, doctor, gc, stop, build-image
    "worker.cli.tools",  # call, batch, tools
    "worker.cli.changelog",  # log, diff, undo
    "worker.cli.service",  # serve, mcp
    "worker.cli.catalog",  # tools search / tools index (extends `tools`)
    "worker.cli.workspace",  # workspace set / show
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # usage errors exit 2, as argparse does, but on stderr only
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="loom-worker", description="Sandboxed tool execution for AI coding agents.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue  # an area not built yet
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    settings = Settings()
    return int(args.func(args, settings) or 0)
