"""The ``loom-worker`` command.

Each area contributes its subcommands from its own module, listed here in one visible
place; each module exposes ``register(subparsers)`` and sets ``func`` on its parsers.
``func(args, settings)`` returns the process exit code (0 ok, 1 tool/command failed,
2 usage error). A command that sets ``own_settings=True`` gets ``settings=None`` and
reads them itself (:func:`load_settings`) only when it needs them: ``call`` through the
local worker never does.

Logging: every command is quiet by default (warnings and errors on stderr), ``-v`` info,
``-vv`` debug (:mod:`.verbosity`, which every parser gets the flag from). :func:`main`
configures it for the commands it loads the settings for; one that sets
``own_logging=True`` (the services, and those with ``own_settings``) configures it itself
with :func:`worker.cli.verbosity.configure`.

Nothing heavy is imported at module level here or in the command modules: ``--help``,
``tools`` and ``call`` through the local worker stay in tens of milliseconds, where
importing pydantic, the registry, the MCP SDK and the Docker SDK costs about 0.7 s.
"""

from __future__ import annotations

import importlib
import sys

# In a module of their own, so that the command modules using them (``from .common
# import ...``) do not import this package back: it imports them. Re-exported here.
from .common import load_settings, path_arg

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

__all__ = ["ALONE", "COMMAND_MODULES", "build_parser", "load_settings", "main", "path_arg"]

COMMAND_MODULES = (
    "worker.cli.sandboxes",  # demo, doctor, gc, stop
    "worker.cli.setup",  # setup (what the worker needs on this engine)
    "worker.cli.tools",  # call, batch, tools
    "worker.cli.changelog",  # log, diff, undo
    "worker.cli.service",  # serve, mcp
    "worker.cli.catalog",  # tools search / tools index (extends `tools`)
    "worker.cli.workspace",  # workspace set / show
    "worker.cli.egress",  # egress-log
    "worker.cli.secrets",  # secret set / list / delete
    "worker.cli.daemon",  # daemon status / stop (the CLI's local worker)
    "worker.cli.exec",  # exec (a command, its output as it comes)
    "worker.cli.cp",  # cp (a file into or out of the sandbox)
    "worker.cli.code",  # run-code (code in a code context)
    "worker.cli.ports",  # port-forward
    "worker.cli.shell",  # shell (an interactive terminal in the sandbox)
    "worker.cli.native",  # apply-patch, tools --format anthropic-native|openai-native
    "worker.cli.snapshots",  # snapshot create|list|show|delete, fork, restore
    "worker.cli.cluster",  # cluster status / metrics / gc (a Ray cluster)
    "worker.cli.agents",  # agent install / list / run (agent CLIs in the sandbox)
    "worker.cli.handoff",  # export --branch, report (what an agent did, for the next step)
)

#: Commands whose parser is built alone when one of them is run: argparse takes about
#: 20 ms to build every command's parser, most of what a call through the local worker
#: costs. Their modules' ``register(subparsers, only=name)`` adds just that command.
ALONE = {"call": "worker.cli.tools", "batch": "worker.cli.tools", "exec": "worker.cli.exec"}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command's parser, or with ``only`` (a key of :data:`ALONE`) a parser
    that knows that one command."""
    from . import verbosity
    from .parser import Parser

    parser = Parser(prog="loom-worker", description="Sandboxed tool execution for AI coding agents.")
    verbosity.add_flag(parser, dest="verbose_before")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    if only is not None:
        importlib.import_module(ALONE[only]).register(sub, only=only)
    else:
        for name in COMMAND_MODULES:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as e:
                if e.name != name:
                    raise
                continue  # an area not built yet
            module.register(sub)
    _add_verbosity(parser)
    return parser


def _add_verbosity(parser: argparse.ArgumentParser) -> None:
    """``-v/--verbose`` on every command and sub-command (walked after they are all added,
    so no command module has to remember it)."""
    import argparse

    from . import verbosity

    seen: set[int] = set()
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for child in action.choices.values():
            if id(child) in seen:  # an alias
                continue
            seen.add(id(child))
            if "-v" not in child._option_string_actions:
                verbosity.add_flag(child)
            _add_verbosity(child)


def main(argv: Sequence[str] | None = None) -> int:
    from . import verbosity

    argv = sys.argv[1:] if argv is None else list(argv)
    before, argv = verbosity.split_leading(argv)  # `loom-worker -v call ...` takes the fast path too
    if argv and argv[0] == "call":
        from .tools import parse_call_fast

        fast = parse_call_fast(argv[1:])
        if fast is not None:  # the usual forms: no argparse at all (its import and set-up: ~5 ms)
            verbosity.apply(before + fast.verbose)
            return int(fast.func(fast, None) or 0)
    parser = build_parser(argv[0] if argv and argv[0] in ALONE else None)
    args = parser.parse_args(argv)
    verbosity.apply(before + getattr(args, "verbose_before", 0) + getattr(args, "verbose", 0))
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    settings = None if getattr(args, "own_settings", False) else load_settings()
    if settings is not None and not getattr(args, "own_logging", False):
        verbosity.configure(settings)
    try:
        return int(args.func(args, settings) or 0)
    except Exception as e:
        # A damaged changelog: one clear line, whatever command met it. (The module is
        # loaded if it raised; looked up, not imported, so other commands do not pay.)
        errors = sys.modules.get("worker.changelog.errors")
        if errors is not None and isinstance(e, errors.ChangelogDamagedError):
            print(f"loom-worker: error: {e}", file=sys.stderr)
            return 1
        raise
