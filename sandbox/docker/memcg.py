"""How many times the kernel's OOM killer fired in a container's memory cgroup, read on
the host.

Under runc the agent reads its own cgroup's count and tells an OOM kill from any other
SIGKILL. Under gVisor it cannot: the sandbox's cgroup files are gVisor's own, and the
host's memory cgroup holds gVisor's processes. On the ptrace platform the host's OOM
killer takes the whole sandbox (the engine reports ``OOMKilled``); on systrap it takes the
stub process that maps the command's memory, gVisor ends that task with exit status 1 and
no message, and the sandbox lives on. So the worker reads the container's count on the
host, before and after each command, and a count that rose during a command that failed
makes the command's outcome ``oom``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _files(pid: int) -> list[Path]:
    """The files that carry ``oom_kill`` for the memory cgroup of ``pid`` (v1 and v2)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return []  # not our pid namespace (a worker in a container), or gone
    return files_of(text)


def entries(proc_cgroup: str) -> list[tuple[list[str], str]]:
    """The ``(controllers, path relative to the hierarchy's root)`` of each line of a
    ``/proc/<pid>/cgroup`` text; cgroup v2's line has no controllers (also used by
    :mod:`.freezer`)."""
    found = []
    for line in proc_cgroup.splitlines():
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        found.append(([c for c in controllers.split(",") if c], path.lstrip("/")))
    return found


def files_of(proc_cgroup: str) -> list[Path]:
    """The ``oom_kill`` files named by the text of a ``/proc/<pid>/cgroup``."""
    found: list[Path] = []
    for controllers, rel in entries(proc_cgroup):
        if "memory" in controllers:
            found.append(CGROUP_ROOT / "memory" / rel / "memory.oom_control")
        elif not controllers:
            found.append(CGROUP_ROOT / rel / "memory.events")
    return found


def _read(path: Path) -> int | None:
    try:
        # A kernel pseudo-file of a few lines: a memory read, never a wait on a disk, so
        # it is read on the event loop.
        for line in path.read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def oom_counter(pid: object) -> Callable[[], int | None] | None:
    """A reader of the OOM-kill count of ``pid``'s memory cgroup, or None when there is
    none to read here (no such process in this pid namespace, no memory controller, a
    kernel without the ``oom_kill`` field). Never raises."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    for path in _files(pid):
        if _read(path) is not None:
            return lambda path=path: _read(path)  # type: ignore[misc]
    return None
