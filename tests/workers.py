"""Helpers for tests of the CLI's local worker: find and stop the workers of a run
directory (only those: other people's workers on this machine are never touched)."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import time
from typing import Any

from worker.localworker.client import Lost, Unavailable, connect
from worker.localworker.rundir import WorkerFiles


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


def wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


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
        if not wait_gone(pid, timeout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
