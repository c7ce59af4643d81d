"""``loom-worker exec`` and ``loom-worker port-forward`` as real processes, through the
local worker and in-process (the same bytes and exit codes both ways), on the test-only
local backend; tests/docker/test_stream_ports.py runs them on the real engine.

Waits poll for a state (a line read, a file there), never assert on a duration.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.workers import ROOT, cli_env, run_dir, statuses
from worker.cli.exec import MAX_TIMEOUT, shell_words
from worker.cli.ports import parse_spec
from worker.localworker.calls import exec_exit_code

CLI = [sys.executable, "-m", "worker.cli"]


@pytest.fixture(params=["worker", "in-process"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    with run_dir() as run:
        e = cli_env(run, tmp_path / "data", LOOM_ALLOW_UNSAFE_LOCAL="1")
        if request.param == "in-process":
            e["LOOM_CLI_DAEMON"] = "0"
        e.pop("LOOM_LOG_LEVEL")  # exec's own default: only warnings on our stderr
        yield e


def run_exec(env: dict[str, str], ws: Path, *words: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    argv = [*CLI, "exec", "-w", str(ws), "--backend", "local", *words]
    return subprocess.run(argv, env=env, capture_output=True, timeout=timeout, cwd=str(ROOT))


def test_output_is_streamed_as_it_comes(env: dict[str, str], workspace: Path) -> None:
    argv = [*CLI, "exec", "-w", str(workspace), "--backend", "local", "--"]
    argv += ["sh", "-c", "echo first; sleep 2; touch slept; echo second"]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))
    assert p.stdout is not None
    first = p.stdout.readline()
    slept_when_first_arrived = (workspace / "slept").exists()
    rest, err = p.communicate(timeout=120)
    assert first == b"first\n" and slept_when_first_arrived is False  # the order of events
    assert rest == b"second\n" and err == b"" and p.returncode == 0


def test_bytes_and_exit_codes(env: dict[str, str], workspace: Path) -> None:
    p = run_exec(env, workspace, "--", "sh", "-c", r"printf 'o\377\n'; printf 'e\200' >&2; exit 3")
    assert (p.returncode, p.stdout, p.stderr) == (3, b"o\xff\n", b"e\x80")
    assert run_exec(env, workspace, "--", "true").returncode == 0
    assert run_exec(env, workspace, "--", "false").returncode == 1
    p = run_exec(env, workspace, "--timeout", "1", "--", "sleep", "30")
    assert p.returncode == 124 and p.stderr == b"loom-worker exec: Command timed out after 1s and was killed\n"
    p = run_exec(env, workspace, "--", "kill -9 $$")  # the shell itself killed: 128 + 9
    assert p.returncode == 137 and p.stderr == b"loom-worker exec: Command was killed by signal 9\n"
    p = run_exec(env, workspace, "--", "kill -15 $$")
    assert p.returncode == 143
    p = run_exec(env, workspace, "--", "no-such-program-here")
    assert p.returncode == 127 and b"not found" in p.stderr


def test_words_are_argv_and_one_word_is_a_shell_command(env: dict[str, str], workspace: Path) -> None:
    p = run_exec(env, workspace, "--", "printf", "%s|", "$HOME", "a b", "*")
    assert p.stdout == b"$HOME|a b|*|"  # no shell read them
    p = run_exec(env, workspace, "--", "echo $((6 * 7)) && echo ok")
    assert p.stdout == b"42\nok\n"


def test_usage_errors_exit_2_naming_the_problem(env: dict[str, str], workspace: Path, tmp_path: Path) -> None:
    for words, needle in [
        ((), b"no command given"),
        (("--timeout", "0", "--", "true"), b"--timeout"),
        (("--timeout", "301", "--", "true"), b"at most 300"),
        (("-t", "60", "--", "true"), b"-t is --tty"),  # the short option's old meaning, said
        (("-t", "--user", "nobody", "--", "true"), b"--user"),
        (("--cwd", "nope", "--", "true"), b"nope"),
    ]:
        p = run_exec(env, workspace, *words)
        assert p.returncode == 2 and needle in p.stderr and p.stdout == b"", (words, p.stderr)
    p = subprocess.run(
        [*CLI, "exec", "-w", str(tmp_path / "missing"), "--backend", "local", "--", "true"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == 2 and b"not a directory" in p.stderr


def test_an_infrastructure_failure_exits_125(env: dict[str, str], workspace: Path, tmp_path: Path) -> None:
    no_engine = {**env, "LOOM_DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    p = subprocess.run(
        [*CLI, "exec", "-w", str(workspace), "--", "true"], env=no_engine, capture_output=True, timeout=120
    )
    assert p.returncode == 125 and b"loom-worker exec: Sandbox unavailable (infrastructure" in p.stderr, p.stderr
    assert p.stdout == b""


def test_changes_are_recorded_and_undone(env: dict[str, str], workspace: Path) -> None:
    (workspace / "a.txt").write_text("before\n")
    p = run_exec(env, workspace, "--call-id", "exec-1", "--", "sh", "-c", "echo after > a.txt; echo new > b.txt")
    assert p.returncode == 0
    log = subprocess.run([*CLI, "log", "-w", str(workspace)], env=env, capture_output=True, text=True, timeout=60)
    assert "a.txt" in log.stdout and "b.txt" in log.stdout and "exec-1" in log.stdout, log.stdout
    undo = subprocess.run(
        [*CLI, "undo", "-w", str(workspace), "--call", "exec-1", "--backend", "local"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert undo.returncode == 0, undo.stderr
    assert (workspace / "a.txt").read_text() == "before\n" and not (workspace / "b.txt").exists()


def test_ctrl_c_is_passed_to_the_command(env: dict[str, str], workspace: Path) -> None:
    script = "trap 'echo got INT; exit 130' INT; echo ready; sleep 30 & wait"
    argv = [*CLI, "exec", "-w", str(workspace), "--backend", "local", "--", script]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    p.send_signal(signal.SIGINT)
    out, _err = p.communicate(timeout=60)
    assert out == b"got INT\n" and p.returncode == 130


def test_the_worker_path_was_taken(env: dict[str, str], workspace: Path) -> None:
    run_exec(env, workspace, "--", "true")
    workers = statuses(env["XDG_RUNTIME_DIR"])
    if env["LOOM_CLI_DAEMON"] == "1":
        assert len(workers) == 1 and next(iter(workers.values()))["calls"] >= 1
    else:
        assert workers == {}


# -- pieces -------------------------------------------------------------------------------------


def test_exit_codes_of_results() -> None:
    def r(**data: Any) -> dict[str, Any]:
        return {"success": False, "data": data, "error": "x"}

    assert exec_exit_code({"success": True, "data": {"exit_code": 0, "outcome": "exit"}}) == 0
    assert exec_exit_code(r(outcome="exit", exit_code=9)) == 9
    assert exec_exit_code(r(outcome="timeout")) == 124
    assert exec_exit_code(r(outcome="signal", signal=15)) == 143
    assert [exec_exit_code(r(outcome=o)) for o in ("oom", "output_limit", "disk_limit")] == [137] * 3
    assert exec_exit_code(r(error_kind="infrastructure")) == 125
    assert exec_exit_code({"success": False, "data": None, "error": "Safety violation: no"}) == 126
    assert exec_exit_code({"success": False, "data": None, "error": "Invalid arguments"}) == 2


def test_the_timeout_cap_is_shell_executes() -> None:
    from worker.tools.shell import MAX_TIMEOUT as TOOL_MAX

    assert MAX_TIMEOUT == TOOL_MAX


def test_shell_words() -> None:
    assert shell_words(["make test && make lint"]) == "make test && make lint"
    assert shell_words(["echo", "a b", "$X"]) == "echo 'a b' '$X'"


def test_port_specs() -> None:
    assert parse_spec("8000") == (8000, 8000)
    assert parse_spec("9000:8000") == (9000, 8000)
    assert parse_spec(":8000") == (0, 8000)
    for bad in ("", "x", "0", "70000", "1:2:3", "-1:80"):
        with pytest.raises(ValueError):
            parse_spec(bad)


# -- port-forward ---------------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[int]:
    """An HTTP server on this host's loopback: with the local backend, that is "the
    sandbox's loopback"."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("hello from the sandbox\n")

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, directory=str(tmp_path / "site"), **kw)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def _get(port: int, path: str = "/index.html") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        out = b""
        while data := s.recv(65536):
            out += data
    return out


def test_port_forward_from_the_host(env: dict[str, str], workspace: Path, served: int) -> None:
    argv = [*CLI, "port-forward", "-w", str(workspace), "--backend", "local", f":{served}"]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))
    try:
        assert p.stdout is not None
        line = p.stdout.readline().decode()
        assert line.startswith("Forwarding from 127.0.0.1:") and line.endswith(f" -> {served}\n"), line
        port = int(line.split(":")[1].split()[0])
        reply = _get(port)
        assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"hello from the sandbox\n")
        replies = []
        threads = [threading.Thread(target=lambda: replies.append(_get(port))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(replies) == 8 and all(r.endswith(b"sandbox\n") for r in replies)
    finally:
        p.send_signal(signal.SIGINT)
        _out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err


def test_port_forward_refusals(env: dict[str, str], workspace: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    argv = [*CLI, "port-forward", "-w", str(workspace), "--backend", "local", f":{closed}"]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))
    try:
        assert p.stdout is not None
        port = int(p.stdout.readline().decode().split(":")[1].split()[0])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            c.settimeout(30)
            try:
                assert c.recv(10) == b""  # closed: nothing listens there in the sandbox
            except ConnectionResetError:
                pass
    finally:
        p.send_signal(signal.SIGTERM)
        _out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and f"port {closed}" in err.decode()
    for args, needle in [(["70000"], "1-65535"), (["x"], "not [HOST_PORT:]SANDBOX_PORT")]:
        q = subprocess.run(
            [*CLI, "port-forward", "-w", str(workspace), "--backend", "local", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert q.returncode == 2 and needle in q.stderr
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        q = subprocess.run(
            [*CLI, "port-forward", "-w", str(workspace), "--backend", "local", f"{busy.getsockname()[1]}:80"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert q.returncode == 1 and "cannot listen" in q.stderr
    finally:
        busy.close()


def test_port_forward_warns_beyond_loopback(env: dict[str, str], workspace: Path, served: int) -> None:
    argv = [*CLI, "port-forward", "-w", str(workspace), "--backend", "local", "--address", "0.0.0.0", f":{served}"]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))
    try:
        assert p.stdout is not None and p.stdout.readline().startswith(b"Forwarding from 0.0.0.0:")
    finally:
        p.send_signal(signal.SIGINT)
        _out, err = p.communicate(timeout=60)
    assert b"not loopback" in err and p.returncode == 0


def test_log_lines_only_on_stderr_and_only_when_asked(env: dict[str, str], workspace: Path) -> None:
    # With LOOM_LOG_LEVEL set, exec logs as the user asked, on stderr only.
    loud = {**env, "LOOM_LOG_LEVEL": "info", "LOOM_LOG_FORMAT": "json"}
    p = run_exec(loud, workspace, "--", "echo", "out")
    assert p.stdout == b"out\n"
    events = [json.loads(line) for line in p.stderr.decode().splitlines()]
    assert any(e.get("event") == "tool.call" for e in events)
