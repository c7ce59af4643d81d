"""``loom-worker agent install|list|run``: agent CLIs in the sandbox (docs/agents.md).

Each subcommand's module exposes ``register(subparsers)``; this package only gathers them
(nothing heavy is imported here: ``--help`` stays fast).
"""

from __future__ import annotations

import importlib
from typing import Any

#: The modules of ``agent``'s subcommands, in the order ``--help`` lists them.
SUBCOMMAND_MODULES = ("worker.cli.agents.store", "worker.cli.agents.run")


def register(sub: Any) -> None:
    from ..parser import Parser

    p = sub.add_parser(
        "agent",
        help="Agent CLIs (Claude Code, Codex, OpenCode) in the sandbox: install, list, remove, run.",
        description="Install agent CLIs into the host's agents store (mounted read-only into sandboxes that ask "
        "for them) and run one in a workspace's sandbox, its provider key kept on the host.",
    )
    asub = p.add_subparsers(dest="agent_command", metavar="SUBCOMMAND", parser_class=Parser, required=True)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue  # not built yet
        module.register(asub)
