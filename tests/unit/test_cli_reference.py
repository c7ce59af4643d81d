"""docs/reference/cli.md is generated from the parser (``python -m worker.cli.reference``):
it fails here when stale, and when a command, an argument or an exit status lacks the
words the reference is made of."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from tests.workers import ROOT
from worker.cli import build_parser
from worker.cli.reference import commands, render

REFERENCE = ROOT / "docs/reference/cli.md"
REGENERATE = "python -m worker.docs_gen"


def test_the_reference_is_current() -> None:
    assert REFERENCE.read_text() == render(), f"docs/reference/cli.md is stale: run `{REGENERATE}`"


def test_it_does_not_depend_on_the_terminal() -> None:
    env = {**os.environ, "COLUMNS": "37", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "worker.cli.reference"], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == render()


def test_every_command_is_documented_with_its_exit_status() -> None:
    cmds = list(commands(build_parser()))
    names = {c.name for c in cmds}
    # every command `loom-worker --help` lists, and their sub-commands
    assert {"loom-worker call", "loom-worker setup", "loom-worker tools search", "loom-worker daemon stop"} <= names
    assert len(cmds) >= 25
    text = REFERENCE.read_text()
    for cmd in cmds:
        assert cmd.summary, f"{cmd.name}: no help"
        assert f"## `{cmd.name}`" in text
        leaf = not any(isinstance(a, argparse._SubParsersAction) and a.required for a in cmd.parser._actions)
        if leaf:
            assert (cmd.parser.epilog or "").startswith("Exit status:"), f"{cmd.name}: no exit status (epilog)"
        for action in cmd.parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
                continue
            assert action.help, f"{cmd.name} {action.option_strings or action.dest}: no help"


def test_docs_cli_links_the_reference() -> None:
    assert "reference/cli.md" in (ROOT / "docs/cli.md").read_text()
