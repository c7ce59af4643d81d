"""shell_execute, search_files and list_directory through the sandbox (local and Docker)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker import ToolRegistry
from worker.result import MAX_OUTPUT_BYTES

# -- shell_execute ---------------------------------------------------------------------


async def test_shell_stdout_then_stderr_section(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("shell_execute", {"command": "echo out; echo err >&2"}, workspace)
    assert r.success, r.error
    assert r.output == "out\n[stderr]\nerr\n"
    assert r.data is not None
    assert set(r.data) >= {
        "exit_code",
        "stdout",
        "stderr",
        "outcome",
        "timed_out",
        "truncated",
        "duration_ms",
    }
    assert r.data["exit_code"] == 0 and r.data["outcome"] == "exit" and r.data["timed_out"] is False
    assert r.data["stdout"] == "out\n" and r.data["stderr"] == "err\n"


async def test_shell_nonzero_exit_is_failure(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("shell_execute", {"command": "echo partial; exit 3"}, workspace)
    assert not r.success and r.data is not None and r.data["exit_code"] == 3
    assert r.error is not None and "code 3" in r.error
    assert r.output.startswith("partial\n")
    assert r.data.get("error_kind") is None  # the command's failure, not infrastructure


async def test_shell_runs_in_workspace_and_cwd(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    (workspace / "sub" / "marker").write_text("m")
    r = await registry.execute("shell_execute", {"command": "ls", "cwd": "sub"}, workspace)
    assert r.success and r.output == "marker\n"
    r = await registry.execute("shell_execute", {"command": "echo hi > made.txt"}, workspace)
    assert r.success and (workspace / "made.txt").read_text() == "hi\n"


async def test_shell_cwd_missing(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("shell_execute", {"command": "true", "cwd": "nope"}, workspace)
    assert not r.success and r.error is not None and "not found" in r.error.lower()


async def test_shell_empty_command(registry: ToolRegistry, workspace: Path) -> None:
    for command in ["", "   ", "\n\t"]:
        r = await registry.execute("shell_execute", {"command": command}, workspace)
        assert not r.success and r.error == "Empty command", (command, r.error)


async def test_shell_timeout(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("shell_execute", {"command": "echo started; sleep 30", "timeout": 1}, workspace)
    assert not r.success
    assert r.error is not None and "timed out after 1s" in r.error
    assert r.data is not None and r.data["timed_out"] is True and r.data["outcome"] == "timeout"
    assert "started" in r.output


async def test_shell_blocklist_refuses_and_runs_nothing(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("shell_execute", {"command": "touch ran; rm -rf /"}, workspace)
    assert not r.success and r.error is not None and r.error.startswith("Safety violation")
    assert not (workspace / "ran").exists()


async def test_shell_output_cut_to_10kb_head_and_tail(registry: ToolRegistry, workspace: Path) -> None:
    cmd = "echo FIRST; i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done; echo LAST"
    r = await registry.execute("shell_execute", {"command": cmd}, workspace)
    assert r.success, r.error
    assert len(r.output.encode()) <= MAX_OUTPUT_BYTES
    assert r.output.startswith("FIRST\n") and r.output.rstrip().endswith("LAST")
    assert "bytes omitted" in r.output
    assert r.data is not None and r.data["truncated"] is True
    assert r.data["stdout"].count("\n") == 3002  # data keeps the whole stream (under its own cap)


async def test_shell_binary_output_is_replaced(registry: ToolRegistry, workspace: Path) -> None:
    r = await registry.execute("shell_execute", {"command": "printf 'a\\377b'"}, workspace)
    assert r.success and r.output == "a\ufffdb"


# -- search_files ----------------------------------------------------------------------


@pytest.fixture
def tree(workspace: Path) -> Path:
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("def main():\n    return 42\n")
    (workspace / "src" / "util.py").write_text("def helper():\n    pass\n")
    (workspace / "README.md").write_text("# main project\n")
    for skipped in (".git", "node_modules", "__pycache__", ".venv", "venv"):
        (workspace / skipped).mkdir()
        (workspace / skipped / "x.py").write_text("def main(): hidden\n")
    return workspace


async def test_search_lines_format(registry: ToolRegistry, tree: Path) -> None:
    r = await registry.execute("search_files", {"pattern": r"def \w+\("}, tree)
    assert r.success, r.error
    assert sorted(r.output.splitlines()) == ["src/app.py:1: def main():", "src/util.py:1: def helper():"]
    assert r.data is not None and r.data["count"] == 2 and r.data["truncated"] is False


async def test_search_file_pattern_and_path(registry: ToolRegistry, tree: Path) -> None:
    r = await registry.execute("search_files", {"pattern": "main", "file_pattern": "*.md"}, tree)
    assert r.success and r.output == "README.md:1: # main project"
    r = await registry.execute("search_files", {"pattern": "main", "path": "src"}, tree)
    assert r.success and r.output == "src/app.py:1: def main():"


async def test_search_no_matches(registry: ToolRegistry, tree: Path) -> None:
    r = await registry.execute("search_files", {"pattern": "zzz_nothing"}, tree)
    assert r.success and "No matches" in r.output and r.data is not None and r.data["matches"] == []


async def test_search_invalid_regex(registry: ToolRegistry, tree: Path) -> None:
    r = await registry.execute("search_files", {"pattern": "foo(["}, tree)
    assert not r.success and r.error is not None and "Invalid regex" in r.error


async def test_search_caps_at_200_with_note(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "many.txt").write_text("".join(f"hit {i}\n" for i in range(300)))
    r = await registry.execute("search_files", {"pattern": "hit"}, workspace)
    assert r.success and r.data is not None
    assert r.data["count"] == 200 and r.data["truncated"] is True
    assert "more than 200 matches" in r.output


async def test_search_results_are_sorted_and_the_same_every_time(registry: ToolRegistry, workspace: Path) -> None:
    """ripgrep searches with several threads and finishes files in no fixed order: the
    answer is sorted by path then line, and a capped answer keeps the first 200 in that
    order, on every run."""
    names = [f"d{i % 7}/f{i:03d}.txt" for i in range(120)]
    for name in names:
        (workspace / name).parent.mkdir(exist_ok=True)
        (workspace / name).write_text("x\nhit a\ny\nhit b\n")
    expected = sorted((n, line) for n in names for line in (2, 4))
    outputs = set()
    for _ in range(4):
        r = await registry.execute("search_files", {"pattern": "hit"}, workspace)
        assert r.success and r.data is not None and r.data["truncated"] is True
        got = [(m["path"], m["line"]) for m in r.data["matches"]]
        assert got == expected[:200]
        outputs.add(r.output)
    assert len(outputs) == 1
    r = await registry.execute("search_files", {"pattern": "hit b", "path": "d3"}, workspace)
    assert r.success and r.data is not None
    assert [m["path"] for m in r.data["matches"]] == sorted(n for n in names if n.startswith("d3/"))


async def test_search_dash_pattern_is_a_pattern(registry: ToolRegistry, workspace: Path) -> None:
    """A pattern that looks like one of ripgrep's options is searched for, never obeyed
    (each in one sandbox, one after another: only the searched file changes)."""
    script = workspace / "evil.sh"
    script.write_text('#!/bin/sh\ntouch "$(dirname "$0")/PWNED"\ncat "$1"\n')
    script.chmod(0o755)
    os.symlink("evil.sh", workspace / "x")
    for pattern in ["--pre=./evil.sh", "--pre=x", "-e", "--files"]:
        (workspace / "data.txt").write_text(f"literal {pattern} here\n")
        r = await registry.execute("search_files", {"pattern": pattern}, workspace)
        assert r.success, (pattern, r.error)
        assert not (workspace / "PWNED").exists(), pattern
        assert r.data is not None and [m["path"] for m in r.data["matches"]] == ["data.txt"], (pattern, r.data)


# -- list_directory --------------------------------------------------------------------


async def test_list_tree_dirs_first(registry: ToolRegistry, tree: Path) -> None:
    (tree / "a_file.txt").write_text("12345")
    r = await registry.execute("list_directory", {}, tree)
    assert r.success, r.error
    assert r.output.splitlines() == [
        "./",
        "  src/",
        "    app.py",
        "    util.py",
        "  README.md",
        "  a_file.txt",
    ]
    assert r.data is not None
    sizes = {e["path"]: e["size"] for e in r.data["entries"]}
    assert sizes["a_file.txt"] == 5 and sizes["src/app.py"] == len("def main():\n    return 42\n")


async def test_list_depth(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "a" / "b" / "c").mkdir(parents=True)
    (workspace / "a" / "b" / "c" / "deep.txt").write_text("")
    r = await registry.execute("list_directory", {"depth": 1}, workspace)
    assert r.success and r.output.splitlines() == ["./", "  a/"]
    r = await registry.execute("list_directory", {"path": "a", "depth": 10}, workspace)
    assert r.success and r.output.splitlines() == ["a/", "  b/", "    c/", "      deep.txt"]


async def test_list_empty_and_errors(registry: ToolRegistry, workspace: Path) -> None:
    (workspace / "empty").mkdir()
    (workspace / "f.txt").write_text("x")
    r = await registry.execute("list_directory", {"path": "empty"}, workspace)
    assert r.success and "(empty directory)" in r.output
    r = await registry.execute("list_directory", {"path": "f.txt"}, workspace)
    assert not r.success and r.error is not None and "Not a directory" in r.error
    r = await registry.execute("list_directory", {"path": "nope"}, workspace)
    assert not r.success and r.error is not None and "not found" in r.error.lower()
