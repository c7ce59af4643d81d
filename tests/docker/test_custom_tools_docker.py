"""Custom YAML tools run in the real Docker sandbox with hostile parameter values passed
literally (argv, no shell; and a fixed script reading $ARG_<name>)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.catalog.custom import parse_custom_file

pytestmark = pytest.mark.docker

HOSTILE = "; rm -rf / $(id) `x` \"' && touch pwned | cat /etc/passwd $HOME \\ *"

ARGV_TOOL = """
name: show_args
description: Print the arguments as JSON
parameters:
  type: object
  properties:
    text: {type: string}
    more: {type: array, items: {type: string}}
  required: [text]
command: [python3, -c, "import json,sys;print(json.dumps(sys.argv[1:]))", --, "{text}", "{more}"]
"""

SCRIPT_TOOL = """
name: write_note
description: Write the text argument to notes.txt through a fixed shell script
parameters:
  type: object
  properties: {text: {type: string}}
  required: [text]
script: 'printf "%s" "$ARG_text" > notes.txt && id -u'
"""


async def test_metacharacters_are_passed_literally_in_docker(docker_backend: Any, workspace: Path) -> None:
    box = await docker_backend.get(workspace)
    (argv_tool,) = parse_custom_file(ARGV_TOOL, "a")
    (script_tool,) = parse_custom_file(SCRIPT_TOOL, "b")

    r = await argv_tool.run(box, {"text": HOSTILE, "more": ["$(touch pwned2)", "`id`"]})
    assert r.success, r.stderr
    assert json.loads(r.stdout) == ["--", HOSTILE, "$(touch pwned2)", "`id`"]

    r = await script_tool.run(box, {"text": HOSTILE})
    assert r.success, r.stderr
    assert (workspace / "notes.txt").read_text() == HOSTILE
    assert sorted(p.name for p in workspace.iterdir()) == ["notes.txt"]  # nothing else was created


async def test_timeout_in_docker(docker_backend: Any, workspace: Path) -> None:
    box = await docker_backend.get(workspace)
    (slow,) = parse_custom_file("name: slow\ndescription: x\ncommand: [sleep, '30']\ntimeout: 1\n", "s")
    r = await slow.run(box, {})
    assert not r.success and r.outcome == "timeout"
