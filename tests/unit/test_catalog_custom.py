"""Custom YAML tools: loading (per-file errors), argv building, running in a sandbox with
shell metacharacters passed literally (local backend; the Docker run is in tests/docker)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.catalog.custom import CustomToolError, load_custom_tools, parse_custom_file
from worker.catalog.search import Catalog

HOSTILE = "; rm -rf / $(id) `x` \"' && echo pwned > /tmp/p | cat {path} $HOME \\ \n*"

ECHO_ARGS = """
name: echo_args
description: Print each argument on its own line as JSON
parameters:
  type: object
  properties:
    text: {type: string, description: Any text}
    n: {type: integer}
    flag: {type: boolean}
    items: {type: array, items: {type: string}}
  required: [text]
command:
  [python3, -c, "import json,sys;print(json.dumps(sys.argv[1:]))", --, "{text}", "n={n}", "{flag}", "{items}"]
capabilities: [transform]
"""

SCRIPT_TOOL = """
tools:
  - name: env_echo
    description: Print the text argument through a fixed shell script
    parameters:
      type: object
      properties: {text: {type: string}}
      required: [text]
    script: 'printf "%s" "$ARG_text"'
"""


def write_tools(d: Path) -> None:
    (d / "a_echo.yaml").write_text(ECHO_ARGS)
    (d / "b_script.yaml").write_text(SCRIPT_TOOL)
    (d / "c_broken.yaml").write_text("name: [unclosed\n")
    (d / "d_badschema.yaml").write_text(
        "name: bad\ndescription: x\nparameters: {type: object, properties: {p: {type: 7}}}\ncommand: [ls]\n"
    )
    (d / "e_both.yaml").write_text("name: both\ndescription: x\ncommand: [a]\nscript: b\n")
    (d / "f_undeclared.yaml").write_text("name: und\ndescription: x\ncommand: [echo, '{nope}']\n")
    (d / "g_dup.yml").write_text(ECHO_ARGS)
    (d / "h_extra.yaml").write_text("name: ex\ndescription: x\ncommand: [a]\nshell: true\n")


def test_load_reports_errors_per_file(tmp_path: Path) -> None:
    write_tools(tmp_path)
    report = load_custom_tools(tmp_path)
    assert [t.name for t in report.tools] == ["echo_args", "env_echo"]
    assert set(report.errors) == {
        "c_broken.yaml",
        "d_badschema.yaml",
        "e_both.yaml",
        "f_undeclared.yaml",
        "g_dup.yml",
        "h_extra.yaml",
    }
    assert "invalid YAML" in report.errors["c_broken.yaml"]
    assert "JSON Schema" in report.errors["d_badschema.yaml"]
    assert "exactly one of" in report.errors["e_both.yaml"]
    assert "{nope}" in report.errors["f_undeclared.yaml"]
    assert "already defined in a_echo.yaml" in report.errors["g_dup.yml"]
    assert "shell" in report.errors["h_extra.yaml"]
    assert load_custom_tools(tmp_path / "missing").tools == []


def test_argv_is_built_without_any_shell() -> None:
    (tool,) = parse_custom_file(ECHO_ARGS, "x")
    argv, env = tool.build({"text": HOSTILE, "n": 3, "flag": True, "items": ["a b", "{text}"]})
    assert argv[3:] == ["--", HOSTILE, "n=3", "true", "a b", "{text}"] and env == {}
    # An omitted optional parameter drops its element.
    argv, _ = tool.build({"text": "{n}"})
    assert argv[3:] == ["--", "{n}"]


@pytest.mark.parametrize(
    "args",
    [{}, {"text": 5}, {"text": "x", "extra": 1}, {"text": "a\x00b"}, {"text": "x", "n": "3"}],
)
def test_bad_arguments_are_the_models_problem(args: dict[str, Any]) -> None:
    (tool,) = parse_custom_file(ECHO_ARGS, "x")
    with pytest.raises(CustomToolError):
        tool.build(args)


async def test_custom_tools_index_and_search(tmp_path: Path) -> None:
    write_tools(tmp_path)
    report = load_custom_tools(tmp_path)
    c = Catalog.open(":memory:")
    await c.index_tools("custom", [t.descriptor() for t in report.tools])
    top = (await c.search("print arguments as json")).results[0].tool
    assert top.id == "custom:echo_args" and top.requires_approval and "transform" in top.capabilities
    assert top.input_schema["additionalProperties"] is False
    await c.aclose()


async def test_run_passes_metacharacters_literally(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    (echo,) = parse_custom_file(ECHO_ARGS, "x")
    (script,) = parse_custom_file(SCRIPT_TOOL, "y")
    r = await echo.run(box, {"text": HOSTILE, "items": ["$(id)", "`x`"]})
    assert r.success, r.stderr
    assert json.loads(r.stdout) == ["--", HOSTILE, "$(id)", "`x`"]
    r = await script.run(box, {"text": HOSTILE})
    assert r.success and r.stdout == HOSTILE
    assert not (workspace / "pwned").exists() and list(workspace.iterdir()) == []


async def test_run_reports_failure_and_timeout(local_backend: Any, workspace: Path) -> None:
    box = await local_backend.get(workspace)
    (fail,) = parse_custom_file(
        "name: fail\ndescription: x\nparameters: {type: object, properties: {code: {type: integer}}}\n"
        "script: 'exit $ARG_code'\n",
        "f",
    )
    r = await fail.run(box, {"code": 3})
    assert not r.success and r.exit_code == 3 and r.outcome == "exit"
    (slow,) = parse_custom_file("name: slow\ndescription: x\ncommand: [sleep, '5']\ntimeout: 0.5\n", "s")
    r = await slow.run(box, {})
    assert not r.success and r.outcome == "timeout"
