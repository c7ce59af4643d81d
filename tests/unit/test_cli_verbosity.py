"""Quiet by default: every command logs warnings and errors only, ``-v`` info, ``-vv``
debug, ``LOOM_LOG_LEVEL`` when set; the services keep their info logs.

The level decision as a unit, then real ``loom-worker`` processes on the test-only local
backend, through the local worker and in-process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port
from tests.workers import ROOT, cli, cli_env, run_dir
from worker.cli import build_parser, verbosity


@pytest.fixture(params=["worker", "in-process"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The CLI's environment as a user's: no LOOM_LOG_LEVEL; JSON log lines (stderr is a pipe)."""
    with run_dir() as run:
        e = cli_env(run, tmp_path / "data", LOOM_ALLOW_UNSAFE_LOCAL="1", LOOM_LOG_FORMAT="json")
        e.pop("LOOM_LOG_LEVEL")
        if request.param == "in-process":
            e["LOOM_CLI_DAEMON"] = "0"
        yield e


def events(stderr: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.decode().splitlines()]


# -- the decision --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "env_level", "want"),
    [
        (0, None, None),
        (0, "", None),
        (0, "ERROR", "error"),
        (1, None, "info"),
        (1, "error", "info"),
        (2, None, "debug"),
    ],
)
def test_a_flag_wins_over_the_environment(count: int, env_level: str | None, want: str | None) -> None:
    assert verbosity.level_of(count, env_level) == want


def test_leading_flags_are_split_off() -> None:
    assert verbosity.split_leading(["-v", "-vv", "call", "-v"]) == (3, ["call", "-v"])
    assert verbosity.split_leading(["--verbose", "exec", "--", "-v"]) == (1, ["exec", "--", "-v"])
    assert verbosity.split_leading(["call"]) == (0, ["call"])


def test_apply_asks_the_local_worker_for_more_only_when_it_would_log_less(monkeypatch: pytest.MonkeyPatch) -> None:
    # this process's decision is module state: put it back afterwards
    monkeypatch.setattr(verbosity, "_level", verbosity._level)
    monkeypatch.setattr(verbosity, "_asked", verbosity._asked)
    environ: dict[str, str] = {}
    assert verbosity.apply(1, environ) == "info" and environ == {}  # the worker logs info anyway
    assert verbosity.level() == "info"
    assert verbosity.apply(2, environ) == "debug" and environ == {"LOOM_LOG_LEVEL": "debug"}
    environ = {"LOOM_LOG_LEVEL": "error"}
    assert verbosity.apply(1, environ) == "info" and environ == {"LOOM_LOG_LEVEL": "info"}
    environ = {"LOOM_LOG_LEVEL": "error"}
    assert verbosity.apply(0, environ) == "error" and verbosity.level() == "error"
    assert verbosity.level("info", service=True) == "error"  # LOOM_LOG_LEVEL set: the service's too
    assert verbosity.apply(0, {}) is None and verbosity.level() == "warning"
    assert verbosity.level("info", service=True) == "info"


def test_every_command_and_subcommand_takes_the_flag() -> None:
    import argparse

    def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, f"{path} {name}")

    parsers = list(walk(build_parser(), "loom-worker"))
    assert len(parsers) > 20
    for path, parser in parsers:
        assert "-v" in parser._option_string_actions and "--verbose" in parser._option_string_actions, path
    ns = build_parser().parse_args(["-v", "tools", "search", "x", "-v"])
    assert ns.verbose_before + ns.verbose == 2


# -- real processes ------------------------------------------------------------------------------


def test_call_and_batch_are_quiet_by_default(env: dict[str, str], workspace: Path) -> None:
    p = cli(env, "call", "list_directory", "-w", str(workspace), "--backend", "local")
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    lines = b'{"tool": "list_directory"}\n{"tool": "read_file", "arguments": {"path": "nope"}}\n'
    p = cli(env, "batch", "-w", str(workspace), "--backend", "local", stdin=lines)
    assert p.returncode == 1 and len(p.stdout.splitlines()) == 2 and p.stderr == b"", p.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["call", "list_directory", "-w", "{ws}", "--backend", "local", "-v"],
        ["-v", "call", "list_directory", "-w", "{ws}", "--backend", "local"],
        ["call", "--verbose", "list_directory", "-w", "{ws}", "--backend=local"],  # not the fast path
        ["-vv", "call", "list_directory", "-w", "{ws}", "--backend", "local"],
    ],
)
def test_v_shows_each_call(env: dict[str, str], workspace: Path, argv: list[str]) -> None:
    p = cli(env, *[a.replace("{ws}", str(workspace)) for a in argv])
    assert p.returncode == 0, p.stderr
    [call] = [e for e in events(p.stderr) if e["event"] == "tool.call"]
    assert call["tool"] == "list_directory" and call["level"] == "info"


def test_loom_log_level_still_works(env: dict[str, str], workspace: Path) -> None:
    p = cli({**env, "LOOM_LOG_LEVEL": "info"}, "call", "list_directory", "-w", str(workspace), "--backend", "local")
    assert [e["tool"] for e in events(p.stderr) if e["event"] == "tool.call"] == ["list_directory"]
    # a flag wins over it
    quiet = {**env, "LOOM_LOG_LEVEL": "error"}
    p = cli(quiet, "call", "list_directory", "-w", str(workspace), "--backend", "local", "-v")
    assert [e["tool"] for e in events(p.stderr) if e["event"] == "tool.call"] == ["list_directory"]


def test_exec_is_quiet_unless_asked(env: dict[str, str], workspace: Path) -> None:
    argv = ["exec", "-w", str(workspace), "--backend", "local"]
    p = cli(env, *argv, "--", "echo", "hi")
    assert (p.returncode, p.stdout, p.stderr) == (0, b"hi\n", b"")
    p = cli(env, *argv, "-v", "--", "echo", "-v")  # after `--`, -v is the command's
    assert p.stdout == b"-v\n"
    assert [e["tool"] for e in events(p.stderr) if e["event"] == "tool.call"] == ["shell_execute"]


def test_a_warning_is_shown_by_default(tmp_path: Path) -> None:
    """Quiet is not silent: a custom tool file that does not load warns, with no flag."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "broken.yaml").write_text("name: [unclosed\n")
    with run_dir() as run:
        env = cli_env(run, tmp_path / "data", LOOM_TOOLS_DIR=str(tools), LOOM_LOG_FORMAT="json")
        env.pop("LOOM_LOG_LEVEL")
        p = cli(env, "tools", "search", "list the files")
        assert p.returncode == 0, p.stderr
        warned = events(p.stderr)
        assert warned and all(e["level"] == "warning" for e in warned), warned
        assert [e["event"] for e in warned] == ["catalog.load_error"] and "broken.yaml" in str(warned[0]["source"])


def test_an_unknown_level_is_a_usage_error(env: dict[str, str], workspace: Path) -> None:
    p = cli({**env, "LOOM_LOG_LEVEL": "loud"}, "log", "-w", str(workspace), "--backend", "local")
    assert p.returncode == 2 and b"LOOM_LOG_LEVEL" in p.stderr and b"'loud'" in p.stderr, p.stderr


def test_serve_keeps_its_info_logs(tmp_path: Path) -> None:
    """The service logs at info by default (LOOM_LOG_LEVEL unset), as documented."""
    with run_dir() as run:
        env = cli_env(run, tmp_path / "data", LOOM_LOG_FORMAT="json")
        env.pop("LOOM_LOG_LEVEL")
    port = free_port()
    argv = [sys.executable, "-m", "worker.cli", "serve", "--port", str(port), "--workspace-root", str(tmp_path)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=60)
    levels = {e["level"] for e in events(err)}
    assert "info" in levels, err
