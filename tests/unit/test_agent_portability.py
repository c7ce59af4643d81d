"""The agent runs inside any image with python3 >= 3.8 and must stay stdlib-only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import sandbox

AGENT = Path(sandbox.__file__).with_name("agent.py")
SRC = AGENT.read_text()


def test_agent_parses_with_python_3_8_grammar() -> None:
    ast.parse(SRC, feature_version=(3, 8))


def test_agent_imports_only_the_standard_library() -> None:
    names = set()
    for node in ast.walk(ast.parse(SRC)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the agent is a single file: no relative imports"
            names.add((node.module or "").split(".")[0])
    assert names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)


def test_agent_uses_no_api_newer_than_3_8() -> None:
    newer = ["removeprefix", "removesuffix", "functools.cache(", "zoneinfo", "match ", "tomllib", "| None ="]
    code_lines = [line for line in SRC.splitlines() if not line.lstrip().startswith("#")]
    for token in newer:
        hits = [line for line in code_lines if token in line and "# type:" not in line]
        assert not hits, (token, hits[:3])


def test_agent_annotations_are_not_evaluated() -> None:
    """No runtime annotations (list[str] would fail on 3.8): the agent uses type comments."""
    tree = ast.parse(SRC)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            assert node.returns is None and all(a.annotation is None for a in node.args.args), node.name
        assert not isinstance(node, ast.AnnAssign), getattr(node, "lineno", "?")
