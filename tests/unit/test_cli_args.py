"""``loom-worker call --args``: inline JSON, ``@FILE`` and ``-`` (standard input), a 10 MB
``write_file`` that no command line could carry, usage errors (exit 2) naming the
problem; and ``call``'s argument parsing without argparse, held equal to argparse's.

Real processes with the test-only local backend, through the local worker and
in-process (the Docker tier repeats the large write on the real engine).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.workers import cli, cli_env, run_dir
from worker.cli import build_parser
from worker.cli.tools import fail_dict, parse_call_fast
from worker.result import ToolResult

#: 10 MB (write_file takes up to 10 MiB).
BIG = 10_000_000


@pytest.fixture(params=["worker", "in-process"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    with run_dir() as run:
        daemon = "1" if request.param == "worker" else "0"
        yield cli_env(run, tmp_path / "data", LOOM_ALLOW_UNSAFE_LOCAL="1", LOOM_CLI_DAEMON=daemon)


def big_content() -> str:
    """About 10 MB of text that JSON must escape (quotes, backslashes, tabs, non-ASCII)."""
    line = '0123456789abcdef ünïcödé "quoted" \\ tab\t\n'
    return line * (BIG // len(line.encode()))


def write_argv(ws: Path, args: str) -> list[str]:
    return ["call", "write_file", "-w", str(ws), "--args", args, "--backend", "local"]


@pytest.mark.parametrize("form", ["@FILE", "-", "@-"])
def test_ten_megabytes_through_file_or_stdin(env: dict[str, str], workspace: Path, tmp_path: Path, form: str) -> None:
    content = big_content()
    payload = json.dumps({"path": "big.txt", "content": content}).encode()
    assert len(payload) > 128 * 1024 * 40  # far beyond what one argument of argv may hold
    stdin = None
    if form == "@FILE":
        (tmp_path / "args.json").write_bytes(payload)
        arg = f"@{tmp_path / 'args.json'}"
    else:
        arg, stdin = form, payload
    p = cli(env, *write_argv(workspace, arg), stdin=stdin)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["success"] is True and result["files_changed"] == ["big.txt"]
    assert result["data"]["bytes_written"] == len(content.encode())
    assert (workspace / "big.txt").read_text() == content
    log = cli(env, "log", "-w", str(workspace), "--json", "--backend", "local")
    assert [json.loads(line)["path"] for line in log.stdout.decode().splitlines()] == ["big.txt"]


def test_inline_arguments_still_work(env: dict[str, str], workspace: Path) -> None:
    p = cli(env, *write_argv(workspace, '{"path": "s.txt", "content": "small"}'))
    assert p.returncode == 0 and (workspace / "s.txt").read_text() == "small"


@pytest.mark.parametrize(
    ("arg", "stdin", "message"),
    [
        ("@{tmp}/missing.json", None, "--args @{tmp}/missing.json: cannot read {tmp}/missing.json: No such file"),
        ("@{tmp}", None, "--args @{tmp}: cannot read {tmp}: Is a directory"),
        ("@{tmp}/bad.json", None, "--args @{tmp}/bad.json is not valid JSON: Expecting"),
        ("-", b'{"path": ', "--args - is not valid JSON: Expecting value"),
        ("-", b"", "--args - is not valid JSON: Expecting value"),
        ("-", b'["a list"]', "--args - must be a JSON object, not list"),
        ("@-", b'{"path": "\xff"}', "--args @-: not UTF-8 text (byte 10)"),
        ("{not json", None, "--args is not valid JSON: Expecting property name"),
        ('"a string"', None, "--args must be a JSON object, not str"),
    ],
)
def test_bad_arguments_exit_2_naming_the_problem(
    env: dict[str, str], workspace: Path, tmp_path: Path, arg: str, stdin: bytes | None, message: str
) -> None:
    (tmp_path / "bad.json").write_text('{"path": "a.txt",}')
    p = cli(env, *write_argv(workspace, arg.replace("{tmp}", str(tmp_path))), stdin=stdin)
    assert p.returncode == 2 and p.stdout == b""
    assert p.stderr.decode().startswith("loom-worker: error: " + message.replace("{tmp}", str(tmp_path)))


def test_fail_dict_is_tool_result_fail() -> None:
    for error, data in (("boom", None), ("Invalid batch line 3: x", {"error_kind": "infrastructure", "n": [1]})):
        assert fail_dict(error, data) == ToolResult.fail(error, data=data).to_dict()


# -- parsing `call` without argparse ---------------------------------------------------------


#: What both parsers must agree on (argparse leaves ``verbose`` unset when no -v is given: 0).
VIEW = ("tool", "workspace", "args", "call_id", "backend", "verbose")


def argparse_view(argv: list[str]) -> dict[str, object] | None:
    """What argparse makes of ``call ARGV`` (None when it refuses it)."""
    parser = build_parser()
    parser.exit_on_error = False
    try:
        ns = parser.parse_args(["call", *argv])
    except (SystemExit, argparse.ArgumentError):
        return None
    return {k: getattr(ns, k, 0) for k in VIEW}


def fast_view(argv: list[str]) -> dict[str, object] | None:
    ns = parse_call_fast(argv)
    return None if ns is None else {k: getattr(ns, k) for k in VIEW}


@pytest.mark.parametrize(
    "argv",
    [
        ["read_file", "-w", "/ws"],
        ["read_file", "--workspace", "/ws", "--args", '{"path": "a"}'],
        ["-w", "/ws", "read_file", "-a", "@f.json", "--call-id", "c1"],
        ["read_file", "--workspace=/ws", "--args=-", "--call-id=x=y"],
        ["read_file", "-w", "/ws", "--args", "-", "--backend", "local"],
        ["-", "-w", "/ws"],
        ["read_file", "-w", "/a", "-w", "/b"],
        ["read_file", "-w", "/ws", "-v"],
        ["-vv", "read_file", "--verbose", "-w", "/ws"],
        ["read_file", "-vvv", "-w", "/ws", "-v"],
    ],
)
def test_fast_parse_of_the_usual_forms(argv: list[str]) -> None:
    assert fast_view(argv) is not None
    assert fast_view(argv) == argparse_view(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["read_file"],  # no workspace
        ["-w", "/ws"],  # no tool
        ["read_file", "-w"],  # no value
        ["read_file", "--work", "/ws"],  # an abbreviation: argparse's business
        ["read_file", "-w/ws"],
        ["read_file", "-w=/ws"],
        ["read_file", "-w", "/ws", "--help"],
        ["read_file", "-w", "/ws", "--args", "-x"],
        ["read_file", "-w", "/ws", "--backend", "podman"],
        ["read_file", "extra", "-w", "/ws"],
        ["read_file", "-w", "/ws", "--", "x"],
    ],
)
def test_fast_parse_leaves_the_rest_to_argparse(argv: list[str]) -> None:
    assert fast_view(argv) is None


TOKENS = st.sampled_from(
    ["read_file", "-w", "--workspace", "/ws", "--workspace=/x", "-a", "--args", "-", "{}", "--args=@f", "--call-id",
     "c", "--backend", "local", "docker", "--", "-x", "--work", "=", "--call-id=", "x y", "-v", "-vv",
     "--verbose", "--verb", "-vx", "-v=1"]
)  # fmt: skip
OPTIONS = st.sampled_from(["-w", "--workspace", "-a", "--args", "--call-id", "--backend"])
VALUES = st.sampled_from(["/ws", "-", "@-", "@f.json", "{}", '{"a": "b c"}', "local", "docker", "", "=x", "-1", "-x"])


@st.composite
def call_argv(draw: st.DrawFn) -> list[str]:
    """A tool and options with values, separate or joined by '=', in any order, now and
    then with one more token anywhere."""
    parts: list[list[str]] = [[draw(st.sampled_from(["read_file", "-", "x"]))]]
    for option in draw(st.lists(OPTIONS, max_size=5)):
        value = draw(VALUES)
        parts.append([f"{option}={value}"] if draw(st.booleans()) else [option, value])
    argv = [token for part in draw(st.permutations(parts)) for token in part]
    if draw(st.integers(0, 4)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(TOKENS))
    return argv


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(call_argv(), st.lists(TOKENS, max_size=7)))
def test_fast_parse_agrees_with_argparse_wherever_it_answers(argv: list[str]) -> None:
    fast = fast_view(argv)
    if fast is not None:
        assert fast == argparse_view(argv)


def test_the_fast_path_is_taken_for_the_usual_forms(monkeypatch: pytest.MonkeyPatch, workspace: Path) -> None:
    """`call` in its usual form never builds argparse's parser."""
    import worker.cli as cli_module

    monkeypatch.setenv("LOOM_CLI_DAEMON", "0")
    monkeypatch.setenv("LOOM_ALLOW_UNSAFE_LOCAL", "1")
    monkeypatch.setenv("LOOM_DATA_DIR", str(workspace.parent / f"{workspace.name}-data"))

    def refuse(only: str | None = None) -> argparse.ArgumentParser:
        raise AssertionError("argparse was used")

    monkeypatch.setattr(cli_module, "build_parser", refuse)
    assert cli_module.main(["call", "list_directory", "-w", str(workspace), "--backend", "local"]) == 0
    assert os.path.isdir(workspace)
