"""The CLI's local worker, as real processes: the ``loom-worker`` command, the worker it
starts, another uid. The test-only local backend stands in for Docker here (the Docker
tier runs the same paths on the real engine, tests/docker/test_localworker_docker.py).

Waits poll for a state (a process gone, a file there), never assert on a duration.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers import LOOM, ROOT, alive, cli, cli_env, run_dir, statuses, this_key, wait_for, worker_dir

NOBODY = 65534


@pytest.fixture
def run() -> Iterator[str]:
    with run_dir() as d:
        yield d


@pytest.fixture
def env(run: str, tmp_path: Path) -> dict[str, str]:
    return cli_env(run, tmp_path / "data", LOOM_ALLOW_UNSAFE_LOCAL="1")


def call(env: dict[str, str], ws: Path, tool: str, args: object = None, **kw: object) -> tuple[int, dict[str, object]]:
    argv = ["call", tool, "-w", str(ws), "--backend", "local"]
    if args is not None:
        argv += ["--args", json.dumps(args)]
    p = cli(env, *argv, **kw)  # type: ignore[arg-type]
    lines = p.stdout.decode().splitlines()
    assert len(lines) == 1, (p.stdout, p.stderr)
    return p.returncode, json.loads(lines[0])


def only_worker(run: str) -> dict[str, object]:
    [status] = statuses(run).values()
    return status


def as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` as uid/gid 65534 (the system's interpreter: ours lives in /root)."""
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- started on demand, reused, private ---------------------------------------------------


def test_started_on_first_use_then_reused(env: dict[str, str], run: str, workspace: Path) -> None:
    (workspace / "a.txt").write_text("hello\n")
    assert statuses(run) == {}
    code, result = call(env, workspace, "read_file", {"path": "a.txt"})
    assert code == 0 and result["output"] == "hello\n"
    first = only_worker(run)
    assert first["calls"] == 1 and first["backend"] == "local"
    code, result = call(env, workspace, "write_file", {"path": "b.txt", "content": "x"})
    assert code == 0 and result["files_changed"] == ["b.txt"]
    again = only_worker(run)
    assert again["pid"] == first["pid"] and again["calls"] == 2


def test_socket_0600_in_a_0700_directory_of_this_user(env: dict[str, str], run: str, workspace: Path) -> None:
    call(env, workspace, "list_directory")
    directory = worker_dir(run)
    st = os.lstat(directory)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    [sock] = [p for p in Path(directory).iterdir() if p.suffix == ".sock"]
    st = os.lstat(sock)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    for other in Path(directory).iterdir():  # its lock and log too
        assert stat.S_IMODE(os.lstat(other).st_mode) & 0o077 == 0, other


def test_off_switch_starts_nothing(env: dict[str, str], run: str, workspace: Path) -> None:
    code, result = call({**env, "LOOM_CLI_DAEMON": "0"}, workspace, "list_directory")
    assert code == 0 and result["success"] is True
    assert statuses(run) == {} and not os.path.exists(worker_dir(run))


def test_other_settings_get_another_worker(env: dict[str, str], run: str, workspace: Path) -> None:
    call(env, workspace, "list_directory")
    call({**env, "LOOM_LOG_LEVEL": "error"}, workspace, "list_directory")
    workers = statuses(run)
    assert len(workers) == 2 and len({w["pid"] for w in workers.values()}) == 2


def test_concurrent_first_calls_start_one_worker(env: dict[str, str], run: str, workspace: Path) -> None:
    argv = ["call", "list_directory", "-w", str(workspace), "--backend", "local"]
    procs = [subprocess.Popen([LOOM, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    worker = only_worker(run)
    assert worker["calls"] == 3


# -- another user ----------------------------------------------------------------------------


def test_another_uid_cannot_connect(env: dict[str, str], run: str, workspace: Path) -> None:
    call(env, workspace, "list_directory")
    [sock] = [str(p) for p in Path(worker_dir(run)).iterdir() if p.suffix == ".sock"]
    os.chmod(run, 0o755)  # let uid 65534 reach the run directory itself: only ours stops it
    probe = textwrap.dedent(
        f"""
        import socket
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({sock!r})
        except OSError as e:
            print(type(e).__name__)
        else:
            print("connected")
        """
    )
    assert as_nobody(probe).stdout.strip() == "PermissionError"


def test_the_worker_hangs_up_on_another_uid_even_when_it_can_reach_the_socket(
    env: dict[str, str], run: str, workspace: Path
) -> None:
    call(env, workspace, "list_directory")
    directory = worker_dir(run)
    [sock] = [str(p) for p in Path(directory).iterdir() if p.suffix == ".sock"]
    # A misconfiguration that opens the way: the worker's own SO_PEERCRED check remains.
    os.chmod(run, 0o755)
    os.chmod(directory, 0o755)
    os.chmod(sock, 0o666)
    probe = textwrap.dedent(
        f"""
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.connect({sock!r})
        try:
            s.sendall(b'{{"op": "status", "id": 1}}\\n')
            answer = s.recv(65536)
        except (BrokenPipeError, ConnectionResetError):
            answer = b""
        print("hung up" if answer == b"" else repr(answer))
        """
    )
    r = as_nobody(probe)
    assert r.stdout.strip() == "hung up", r.stderr  # nothing answered
    assert only_worker(run)["calls"] == 1  # and it still serves its own user
    log = next(p for p in Path(directory).iterdir() if p.suffix == ".log").read_text()
    assert '"event": "local_worker.peer_refused"' in log and f'"peer_uid": {NOBODY}' in log


def test_a_socket_served_by_another_uid_is_not_used(env: dict[str, str], run: str, workspace: Path) -> None:
    """A listener of uid 65534 at the worker's name: the CLI will not talk to it and
    runs the call itself."""
    key = this_key(env, "local")
    directory = worker_dir(run)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    spot = Path(tempfile.mkdtemp(prefix="lw-theirs-", dir="/tmp"))  # beside the run directory
    os.chmod(spot, 0o777)
    listener = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            "import socket, sys, time\n"
            "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8)\n"
            "print('ready', flush=True)\n"
            "conns = []\n"
            "while True:\n    conns.append(s.accept()[0])\n",
            str(spot / "s"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        os.rename(spot / "s", os.path.join(directory, f"d-{key}.sock"))  # root puts it in place
        (workspace / "a.txt").write_text("mine\n")
        code, result = call({**env, "LOOM_LOG_LEVEL": "info"}, workspace, "read_file", {"path": "a.txt"})
        assert code == 0 and result["output"] == "mine\n"  # run in-process
        status = cli(env, "daemon", "status", "--json", "--backend", "local")
        assert f"served by uid {NOBODY}" in json.loads(status.stdout)["this"]["problem"]
    finally:
        listener.kill()
        listener.wait()
        shutil.rmtree(spot, ignore_errors=True)


# -- the run directory -----------------------------------------------------------------------


def test_an_unusable_run_directory_means_in_process(env: dict[str, str], run: str, workspace: Path) -> None:
    """$XDG_RUNTIME_DIR not ours, and /tmp's per-uid name taken by another user: the call
    runs in-process, and doctor's summary says why."""
    theirs = Path(run) / "xdg"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    tmp = Path(run) / "tmp"
    tmp.mkdir()
    squat = tmp / f"loom-worker-{os.getuid()}"
    squat.mkdir(mode=0o700)
    os.chown(squat, NOBODY, NOBODY)
    bad = {**env, "XDG_RUNTIME_DIR": str(theirs), "TMPDIR": str(tmp), "LOOM_LOG_LEVEL": "info"}
    p = cli(bad, "call", "list_directory", "-w", str(workspace), "--backend", "local")
    assert p.returncode == 0 and json.loads(p.stdout)["success"] is True
    assert b"cli.local_worker_unavailable" in p.stderr and f"belongs to uid {NOBODY}".encode() in p.stderr
    status = cli(bad, "daemon", "status", "--backend", "local")
    assert status.returncode == 1
    assert f"belongs to uid {NOBODY}" in status.stdout.decode()
    assert list(squat.iterdir()) == []  # nothing was put in the other user's directory


def test_a_symlinked_run_directory_is_refused(env: dict[str, str], run: str, workspace: Path) -> None:
    tmp = Path(run) / "tmp"
    tmp.mkdir()
    target = Path(run) / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp / f"loom-worker-{os.getuid()}").symlink_to(target)
    bad = {k: v for k, v in env.items() if k != "XDG_RUNTIME_DIR"}
    bad.update({"TMPDIR": str(tmp), "LOOM_LOG_LEVEL": "info"})
    p = cli(bad, "call", "list_directory", "-w", str(workspace), "--backend", "local")
    assert p.returncode == 0 and b"is a symbolic link" in p.stderr
    assert list(target.iterdir()) == []


# -- lifetime -----------------------------------------------------------------------------


def test_exits_when_idle(env: dict[str, str], run: str, workspace: Path) -> None:
    idle = {**env, "LOOM_CLI_DAEMON_IDLE": "1"}
    call(idle, workspace, "list_directory")
    pid = int(only_worker(run)["pid"])
    assert wait_for(lambda: not alive(pid))
    assert statuses(run) == {}
    assert not [p for p in Path(worker_dir(run)).iterdir() if p.suffix == ".sock"]  # it removed its socket
    log = next(p for p in Path(worker_dir(run)).iterdir() if p.suffix == ".log").read_text()
    assert "idle for 1 s" in log
    code, _ = call(idle, workspace, "list_directory")  # and the next call starts a new one
    assert code == 0


def test_replaced_when_the_code_changes(env: dict[str, str], run: str, workspace: Path, tmp_path: Path) -> None:
    code_dir = tmp_path / "code"
    for pkg in ("worker", "sandbox"):
        shutil.copytree(ROOT / pkg, code_dir / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    copy = {**env, "PYTHONPATH": str(code_dir)}
    call(copy, workspace, "list_directory")
    old = only_worker(run)
    # An upgrade (or an edit of an editable install) under the running worker.
    edited = code_dir / "worker" / "localworker" / "wire.py"
    edited.write_text(edited.read_text() + "\n# a new version\n")
    code, _ = call(copy, workspace, "list_directory")
    assert code == 0
    assert wait_for(lambda: not alive(int(old["pid"])))  # the old one leaves by itself
    new = only_worker(run)
    assert new["pid"] != old["pid"] and new["key"] != old["key"]
    log = (Path(worker_dir(run)) / f"d-{old['key']}.log").read_text()
    assert "the installed code changed" in log


def test_stop_and_status(env: dict[str, str], run: str, workspace: Path) -> None:
    p = cli(env, "daemon", "status", "--backend", "local")
    assert p.returncode == 0 and b"not running" in p.stdout
    call(env, workspace, "list_directory")
    pid = int(only_worker(run)["pid"])
    p = cli(env, "daemon", "status", "--backend", "local")
    assert f"running: pid {pid}".encode() in p.stdout
    p = cli(env, "daemon", "stop", "--backend", "local")
    assert p.returncode == 0 and b"asked 1" in p.stdout
    assert wait_for(lambda: not alive(pid))
    p = cli(env, "daemon", "status", "--backend", "local")
    assert b"not running" in p.stdout and b"asked to stop" in p.stdout  # why it is not running


# -- failures ---------------------------------------------------------------------------------


def test_killed_mid_call_the_call_fails_cleanly_and_the_next_one_works(
    env: dict[str, str], run: str, workspace: Path
) -> None:
    call(env, workspace, "list_directory")
    pid = int(only_worker(run)["pid"])
    argv = ["call", "shell_execute", "-w", str(workspace), "--backend", "local"]
    args = json.dumps({"command": "touch started; sleep 20"})
    client = subprocess.Popen([LOOM, *argv, "--args", args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert wait_for(lambda: (workspace / "started").exists())
    os.kill(pid, signal.SIGKILL)
    out, _err = client.communicate(timeout=120)
    assert client.returncode == 1
    result = json.loads(out)
    assert result["success"] is False and result["data"]["error_kind"] == "infrastructure"
    assert result["data"]["exception"] == "LocalWorkerLost" and "may or may not have taken effect" in result["error"]
    code, result = call(env, workspace, "write_file", {"path": "after.txt", "content": "ok"})
    assert code == 0 and (workspace / "after.txt").read_text() == "ok"
    assert int(only_worker(run)["pid"]) != pid


class FakeWorker:
    """A listener at the worker's socket that takes one request and hangs up, as a
    worker killed right after reading a call would."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(8)
        self.requests: list[dict[str, object]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b'{"t":"hello","pid":0,"key":"fake"}\n')  # as a worker greets
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                if data:
                    self.requests.append(json.loads(data))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def fake(env: dict[str, str], run: str) -> Iterator[FakeWorker]:
    key = this_key(env, "local")
    os.makedirs(worker_dir(run), mode=0o700, exist_ok=True)
    f = FakeWorker(os.path.join(worker_dir(run), f"d-{key}.sock"))
    yield f
    f.close()


def test_a_read_lost_with_its_worker_is_run_again_in_process(
    env: dict[str, str], workspace: Path, fake: FakeWorker
) -> None:
    (workspace / "a.txt").write_text("still here\n")
    code, result = call(env, workspace, "read_file", {"path": "a.txt"})
    assert code == 0 and result["output"] == "still here\n"
    assert [r["tool"] for r in fake.requests] == ["read_file"]  # it was sent, then lost


def test_a_write_lost_with_its_worker_is_not_run_again(env: dict[str, str], workspace: Path, fake: FakeWorker) -> None:
    code, result = call(env, workspace, "write_file", {"path": "w.txt", "content": "once"})
    assert code == 1 and result["data"] == {"error_kind": "infrastructure", "exception": "LocalWorkerLost"}
    assert [r["tool"] for r in fake.requests] == ["write_file"]
    assert not (workspace / "w.txt").exists()  # neither the (fake) worker nor the CLI wrote it


def test_a_client_that_goes_away_does_not_lose_the_record(env: dict[str, str], run: str, workspace: Path) -> None:
    """Ctrl-C (or a CI timeout) kills the CLI mid-command: the worker finishes the call,
    so what the command changed is in the changelog and can be undone."""
    call(env, workspace, "list_directory")
    argv = ["call", "shell_execute", "-w", str(workspace), "--backend", "local"]
    args = json.dumps({"command": "touch started; sleep 1; touch finished"})
    client = subprocess.Popen([LOOM, *argv, "--args", args], env=env)
    assert wait_for(lambda: (workspace / "started").exists())
    client.kill()
    client.wait()

    def logged() -> list[str]:
        p = cli(env, "log", "-w", str(workspace), "--json", "--backend", "local")
        return sorted(json.loads(line)["path"] for line in p.stdout.decode().splitlines())

    assert wait_for(lambda: logged() == ["finished", "started"])
    assert cli(env, "undo", "-w", str(workspace), "--all", "--backend", "local").returncode == 0
    assert not (workspace / "started").exists() and not (workspace / "finished").exists()


# -- what the client sees ------------------------------------------------------------------------


def test_logs_reach_the_clients_stderr(env: dict[str, str], workspace: Path) -> None:
    logging_env = {**env, "LOOM_LOG_LEVEL": "info", "LOOM_LOG_FORMAT": "json"}
    for daemon in ("1", "0"):
        argv = ["call", "list_directory", "-w", str(workspace), "--backend", "local"]
        p = cli({**logging_env, "LOOM_CLI_DAEMON": daemon}, *argv)
        events = [json.loads(line) for line in p.stderr.decode().splitlines()]
        [e] = [e for e in events if e["event"] == "tool.call"]
        assert e["logger"] == "worker.registry" and e["tool"] == "list_directory" and e["success"] is True
        assert e["workspace"] == str(workspace) and e["level"] == "info"


def test_files_of_workers_gone_for_a_week_are_pruned(env: dict[str, str], run: str, workspace: Path) -> None:
    directory = Path(worker_dir(run))
    directory.mkdir(mode=0o700)
    old = [directory / f"d-{'0' * 24}.{ext}" for ext in ("lock", "log", "log.1")]
    recent = directory / f"d-{'1' * 24}.log"
    for path in [*old, recent]:
        path.write_text("")
    week_ago = time.time() - 8 * 86400
    for path in old:
        os.utime(path, (week_ago, week_ago))
    call(env, workspace, "list_directory")  # starting a worker prunes
    assert not any(p.exists() for p in old) and recent.exists()


def test_a_worker_that_cannot_start_is_reported(env: dict[str, str], run: str, workspace: Path) -> None:
    bad = {**env, "LOOM_CPUS": "many"}
    p = cli(bad, "call", "list_directory", "-w", str(workspace), "--backend", "local")
    assert p.returncode == 2 and p.stderr.decode().startswith("loom-worker: error: LOOM_CPUS: ")
    p = cli(bad, "daemon", "status", "--backend", "local")
    assert b"[FAIL] local worker: not running" in p.stdout
    assert b"start_failed: the settings do not validate: LOOM_CPUS: " in p.stdout


def test_a_worker_that_stops_listening_with_a_call_queued_loses_nothing(
    env: dict[str, str], run: str, workspace: Path
) -> None:
    """A client that connected to a worker just as it stopped listening (idle, out of date)
    is reset before the worker greeted it, so it sent nothing: the call goes to a fresh
    worker, once."""
    import select

    key = this_key(env, "local")
    os.makedirs(worker_dir(run), mode=0o700, exist_ok=True)
    path = os.path.join(worker_dir(run), f"d-{key}.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(8)

    def stop_with_one_queued() -> None:
        select.select([listener], [], [], 60)  # a connection waits in the backlog, not accepted
        os.unlink(path)
        listener.close()  # ... and is reset

    closer = threading.Thread(target=stop_with_one_queued)
    closer.start()
    code, result = call(env, workspace, "write_file", {"path": "once.txt", "content": "written once"})
    closer.join(timeout=60)
    assert code == 0 and result["success"] is True, result
    assert (workspace / "once.txt").read_text() == "written once"
    assert only_worker(run)["calls"] == 1  # a real worker took it
