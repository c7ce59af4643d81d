"""``loom-worker call`` / ``batch`` / ``tools``: JSON on stdout and exit codes.

Runs in-process through ``worker.cli.main`` with the test-only ``--backend local``
(enabled by LOOM_ALLOW_UNSAFE_LOCAL=1), so no Docker is needed here; the Docker tier runs
``call`` on the real sandbox.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from worker.cli import main
from worker.cli.tools import tools_subparsers


@pytest.fixture(autouse=True)
def data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("LOOM_ALLOW_UNSAFE_LOCAL", "1")
    monkeypatch.setenv("LOOM_LOG_LEVEL", "warning")
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse usage errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def call(capsys: pytest.CaptureFixture[str], ws: Path, tool: str, args: Any) -> tuple[int, dict[str, Any]]:
    code, out, _ = run(capsys, "call", tool, "--workspace", str(ws), "--args", json.dumps(args), "--backend", "local")
    lines = out.splitlines()
    assert len(lines) == 1, out  # exactly one JSON document, nothing else on stdout
    return code, json.loads(lines[0])


def test_call_success_exit_0(capsys: pytest.CaptureFixture[str], workspace: Path) -> None:
    (workspace / "a.txt").write_text("hello\n")
    code, result = call(capsys, workspace, "read_file", {"path": "a.txt"})
    assert code == 0
    assert result["success"] is True and result["output"] == "hello\n" and result["error"] is None
    assert set(result) == {"success", "output", "data", "files_changed", "error"}


def test_call_write_reports_files_changed(capsys: pytest.CaptureFixture[str], workspace: Path) -> None:
    code, result = call(capsys, workspace, "write_file", {"path": "d/n.txt", "content": "ü"})
    assert code == 0 and result["files_changed"] == ["d/n.txt"] and result["data"]["bytes_written"] == 2
    assert (workspace / "d/n.txt").read_text() == "ü"


def test_call_changes_are_in_the_changelog(capsys: pytest.CaptureFixture[str], workspace: Path, data_dir: Path) -> None:
    from worker.changelog import Changelog

    (workspace / "old.txt").write_text("before\n")
    code, _ = call(capsys, workspace, "edit_file", {"path": "old.txt", "old_str": "before", "new_str": "after"})
    assert code == 0
    code, result = call(capsys, workspace, "shell_execute", {"command": "echo x > made.txt"})
    assert code == 0 and result["files_changed"] == ["made.txt"]

    async def log() -> list[Any]:
        async with Changelog.open(data_dir, workspace) as cl:
            return await cl.log()

    entries = asyncio.run(log())
    assert [(e.tool, e.path) for e in entries] == [("edit_file", "old.txt"), ("shell_execute", "made.txt")]


def test_call_tool_failure_exit_1(capsys: pytest.CaptureFixture[str], workspace: Path) -> None:
    code, result = call(capsys, workspace, "read_file", {"path": "missing.txt"})
    assert code == 1 and result["success"] is False and "not found" in result["error"]
    code, result = call(capsys, workspace, "shell_execute", {"command": "exit 4"})
    assert code == 1 and result["data"]["exit_code"] == 4
    code, result = call(capsys, workspace, "shell_execute", {"command": "rm -rf /"})
    assert code == 1 and result["error"].startswith("Safety violation")
    code, result = call(capsys, workspace, "shell_execute", {"command": ""})  # (the tool's own check)
    assert code == 1 and result["error"] == "Empty command"


def test_call_unknown_tool_exit_2(capsys: pytest.CaptureFixture[str], workspace: Path) -> None:
    code, result = call(capsys, workspace, "format_disk", {})
    assert code == 2 and "Unknown tool" in result["error"]


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        ("read_file", {"path": "a.txt", "nope": 1}, "nope"),
        ("read_file", {"path": "a.txt", "line_range": "x"}, "line_range"),
        ("read_file", {}, "path"),
        ("shell_execute", {"command": "true", "timeout": "5"}, "timeout"),
    ],
)
def test_call_arguments_the_schema_refuses_exit_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], workspace: Path, tool: str, arguments: dict[str, Any], field: str
) -> None:
    """Bad --args are a usage error (exit 2), whether not JSON or not what the tool's schema
    takes; the printed ToolResult is the model's, naming the field."""
    code, result = call(capsys, workspace, tool, arguments)
    assert code == 2 and result["success"] is False
    assert result["error"].startswith(f"Invalid arguments for {tool}: '{field}'"), result["error"]


@pytest.mark.parametrize(
    "argv",
    [
        ["call", "read_file", "--workspace", "{ws}", "--args", "{not json", "--backend", "local"],
        ["call", "read_file", "--workspace", "{ws}", "--args", "[1, 2]", "--backend", "local"],
        ["call", "read_file", "--workspace", "{ws}/missing-dir", "--args", "{}", "--backend", "local"],
        ["call", "read_file", "--args", "{}"],  # --workspace is required
        ["call", "--workspace", "{ws}"],  # the tool is required
        ["batch"],
        ["tools", "--format", "yaml"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], workspace: Path, argv: list[str]) -> None:
    code, out, err = run(capsys, *[a.replace("{ws}", str(workspace)) for a in argv])
    assert code == 2 and out == "" and err


def test_local_backend_needs_the_env_switch(
    capsys: pytest.CaptureFixture[str], workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOOM_ALLOW_UNSAFE_LOCAL")
    code, out, err = run(capsys, "call", "list_directory", "--workspace", str(workspace), "--backend", "local")
    assert code == 2 and out == "" and "LOOM_ALLOW_UNSAFE_LOCAL" in err
    code, out, err = run(capsys, "call", "--help")
    assert "--backend" not in out  # hidden: test-only


def test_batch_in_order(capsys: pytest.CaptureFixture[str], workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [
        {"tool": "write_file", "arguments": {"path": "a.txt", "content": "1\n"}, "id": "w"},
        {"tool": "read_file", "arguments": {"path": "a.txt"}, "id": 2},
        "",
        "not json",
        {"tool": "read_file", "arguments": {"path": "missing"}},
        {"tool": "list_directory"},
        {"tool": "read_file", "args": {}},
    ]
    stdin = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code, out, _ = run(capsys, "batch", "--workspace", str(workspace), "--backend", "local")
    results = [json.loads(line) for line in out.splitlines()]
    assert code == 1  # some calls failed
    assert [r["id"] for r in results] == ["w", 2, None, None, None, None]
    assert [r["success"] for r in results] == [True, True, False, False, True, False]
    assert results[1]["output"] == "1\n"
    assert "Invalid batch line 4" in results[2]["error"]
    assert "not found" in results[3]["error"]
    assert "unknown keys" in results[5]["error"]


def test_batch_all_ok_exit_0(
    capsys: pytest.CaptureFixture[str], workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"tool": "list_directory", "id": 1}\n'))
    code, out, _ = run(capsys, "batch", "--workspace", str(workspace), "--backend", "local")
    assert code == 0 and json.loads(out)["output"].endswith("(empty directory)")


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "mcp"])
def test_tools_prints_schemas(capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    code, out, _ = run(capsys, "tools", "--format", fmt)
    assert code == 0
    schemas = json.loads(out)
    assert len(schemas) >= 6
    for s in schemas:
        params = (
            s["function"]["parameters"]
            if fmt == "openai"
            else s["input_schema" if fmt == "anthropic" else "inputSchema"]
        )
        jsonschema.Draft202012Validator.check_schema(params)
    code, default_out, _ = run(capsys, "tools")
    if fmt == "openai":
        assert default_out == out


def test_tools_group_can_be_extended() -> None:
    import argparse

    from worker.cli import tools as cli_tools

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cli_tools.register(sub)
    extra = tools_subparsers(sub).add_parser("search")
    extra.add_argument("query")
    extra.set_defaults(func=lambda args, settings: 0)
    args = parser.parse_args(["tools", "search", "read a file"])
    assert args.query == "read a file" and args.tools_command == "search"
    args = parser.parse_args(["tools", "--format", "mcp"])
    assert args.format == "mcp" and args.tools_command is None


def test_the_usage_check_takes_arguments_as_the_registry_does() -> None:
    """Arguments reach the local worker as the registry takes them (an object, a JSON
    string, nothing); the exit-2 check judges each as the registry's validation would."""
    from worker.localworker.calls import _valid
    from worker.registry import ToolRegistry

    read = ToolRegistry().get("read_file")
    assert read is not None
    assert _valid(read, {"path": "a.txt"}) and _valid(read, '{"path": "a.txt"}')
    assert not _valid(read, {"path": 3}) and not _valid(read, '{"path": 3}')
    assert not _valid(read, "{not json") and not _valid(read, ["a.txt"])
    assert not _valid(read, None) and not _valid(read, "  ")  # (no path: the field is required)
    ls = ToolRegistry().get("list_directory")
    assert ls is not None and _valid(ls, None) and _valid(ls, "")
