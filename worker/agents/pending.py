"""What an agent run changed in its workspace's configuration, on disk before it is changed.

``agent run`` stores the provider's key as a workspace secret and widens the allowlist for
the run, and puts both back after it. A run whose worker dies (SIGKILL, a cancelled CI job, a
reboot) never gets to its ``finally``: without a record, the key would stay a secret of the
workspace, usable by any later command there through the gateway. So the run first writes
``<data>/workspaces/<hash>/agent-run.json`` (created exclusively, mode 0600, in the data
directory where the secrets store is too: never in the sandbox's reach) with what to put back
and who owns it (host pid, its start time, the boot), then changes the configuration; it
removes the record once everything is put back.

The next ``agent run`` on the workspace finds a record whose owner is gone, stops the old
agent process in the sandbox and puts the configuration back before anything else; a record
whose owner lives is another run on the same workspace, and refused.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORD = "agent-run.json"


@dataclass(frozen=True)
class Owner:
    pid: int
    start: str
    boot: str

    @staticmethod
    def me() -> Owner:
        return Owner(os.getpid(), _start_time(os.getpid()) or "", _boot_id())

    def alive(self) -> bool:
        """Whether the process that wrote the record still runs (same boot, same process:
        its start time guards against a reused pid)."""
        if self.boot != _boot_id():
            return False
        return _start_time(self.pid) == self.start


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # field 22, starttime


def path(ws_dir: Path) -> Path:
    return ws_dir / RECORD


def claim(ws_dir: Path, record: dict[str, Any]) -> dict[str, Any] | None:
    """Write ``record`` (with this process as its owner) unless one is there; returns the
    one found instead (None when written). Raises OSError."""
    ws_dir.mkdir(parents=True, exist_ok=True)
    data = json.dumps({**record, "owner": Owner.me().__dict__}, indent=2).encode()
    try:
        fd = os.open(path(ws_dir), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return load(ws_dir) or {}
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return None


def load(ws_dir: Path) -> dict[str, Any] | None:
    """The record, None when there is none; {} for one that cannot be read (a torn write:
    its owner died writing it, before changing anything)."""
    try:
        data = json.loads(path(ws_dir).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def owner_alive(record: dict[str, Any]) -> bool:
    o = record.get("owner")
    if not isinstance(o, dict):
        return False
    try:
        return Owner(int(o["pid"]), str(o["start"]), str(o["boot"])).alive()
    except (KeyError, TypeError, ValueError):
        return False


def release(ws_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path(ws_dir).unlink()
