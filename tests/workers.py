"""Helpers for tests of the CLI's local worker: run the real ``loom-worker`` command in a
private run directory, find and stop the workers of that directory (only those: other
people's workers on this machine are never touched)."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from worker.localworker.client import Lost, Unavailable, connect
from worker.localworker.rundir import WorkerFiles

ROOT = Path(__file__).resolve().parents[1]
LOOM = str(Path(sys.executable).with_name("loom-worker"))


def worker_dir(run_dir: str) -> str:
    """The directory of the workers under ``XDG_RUNTIME_DIR=run_dir``."""
    return os.path.join(run_dir, "loom-worker")


def statuses(run_dir: str) -> dict[str, dict[str, Any]]:
    """The status of every worker answering in ``run_dir``, by key."""
    out: dict[str, dict[str, Any]] = {}
    directory = worker_dir(run_dir)
    for sock in glob.glob(os.path.join(glob.escape(directory), "d-*.sock")):
        key = os.path.basename(sock)[2:-5]
        with contextlib.suppress(Unavailable, Lost, OSError):
            client = connect(WorkerFiles(directory, key), key)
            if client is not None:
                try:
                    out[key] = client.request({"op": "status"})
                finally:
                    client.close()
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][:1] != "Z"
    return True


def wait_for(predicate: Any, timeout: float = 60.0) -> bool:
    """Poll ``predicate()`` until it is true (a synchronisation, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def stop_workers(run_dir: str, timeout: float = 20.0) -> None:
    """Ask every worker of ``run_dir`` to stop; kill the ones that do not."""
    pids = [int(s["pid"]) for s in statuses(run_dir).values()]
    directory = worker_dir(run_dir)
    for sock in glob.glob(os.path.join(glob.escape(directory), "d-*.sock")):
        key = os.path.basename(sock)[2:-5]
        with contextlib.suppress(Unavailable, Lost, OSError):
            client = connect(WorkerFiles(directory, key), key)
            if client is not None:
                try:
                    client.request({"op": "shutdown"})
                finally:
                    client.close()
    for pid in pids:
        if not wait_for(lambda pid=pid: not alive(pid), timeout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def run_dir() -> Iterator[str]:
    """A private ``XDG_RUNTIME_DIR`` (short: a socket's path holds 107 bytes) whose
    workers are stopped afterwards."""
    d = tempfile.mkdtemp(prefix="lw-", dir="/tmp")
    try:
        yield d
    finally:
        stop_workers(d)
        shutil.rmtree(d, ignore_errors=True)


def cli_env(run: str, data: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI call with the local worker on, in run directory ``run``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "XDG_RUNTIME_DIR": run,
            "LOOM_DATA_DIR": str(data),
            "LOOM_LOG_LEVEL": "warning",
            "LOOM_CLI_DAEMON": "1",
        }
    )
    env.update(extra)
    return env


def cli(
    env: dict[str, str], *argv: str, stdin: bytes | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[bytes]:
    """Run ``loom-worker ARGV`` and return what it did (stdout and stderr as bytes)."""
    return subprocess.run([LOOM, *argv], env=env, input=stdin, capture_output=True, timeout=timeout, cwd=str(ROOT))


def this_key(env: dict[str, str], backend: str = "docker") -> str:
    """The key of the worker a CLI with ``env`` uses (asked of the CLI itself)."""
    p = cli(env, "daemon", "status", "--json", "--backend", backend)
    return str(json.loads(p.stdout)["this"]["key"])


def remove_sandboxes_under(root: Path) -> list[str]:
    """Remove every sandbox (running or not) whose workspace lies under ``root``: what a
    test's CLI or service runs left behind, which belongs to their own data directory's
    owner and so escapes the suite's closing ``gc`` (a sandbox outlives its worker until its
    idle TTL, by design). Returns the names removed."""
    from sandbox.docker.config import LABEL_WS

    out = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label={LABEL_WS}",
            "--format",
            f'{{{{.Names}}}}\t{{{{.Label "{LABEL_WS}"}}}}',
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    prefix = str(root).rstrip("/") + "/"
    names = [n for n, _, ws in (line.partition("\t") for line in out.splitlines()) if (ws + "/").startswith(prefix)]
    if names:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, check=False)
    return names
