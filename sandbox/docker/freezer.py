"""A waiting gVisor sandbox frozen on the host, at no CPU cost, and thawed to serve.

gVisor's kernel (the Sentry) costs CPU even when nothing runs in it: on the systrap
platform of the runsc this project installs (release 20240729) its fast-path monitor
wakes every 400 µs, forever, so each idle sandbox takes about 2.5 % of a core (20 idle
ones took 35 % of this machine's two cores; later gVisor releases park the monitor when
idle). The warm pool keeps sandboxes waiting for minutes, so when asked
(``LOOM_WARM_POOL_FREEZE``) it freezes gVisor ones in their cgroup (the kernel's freezer:
no wakeup at all until thawed, each way well under a millisecond) and thaws one at its
claim. runc sandboxes cost nothing idle and are never frozen. It is off by default: a
frozen sandbox holds the engine up (below; a ``dockerd`` restarted around frozen ones did
not come up until they were thawed).

A frozen gVisor sandbox cannot be removed: ``docker rm -f`` asks ``runsc kill``, which
asks the frozen Sentry, and waits (holding the engine's lock on that container) until
someone thaws it. So every removal of a pooled container thaws it first
(:meth:`.engine.Engine.remove`), whichever process removes it (the pool, ``gc``, a
restarted worker's reap), and so does the removal of one the engine is stuck on.

The freezer is the container's cgroup's: ``freezer.state`` under cgroup v1, ``cgroup.freeze``
under v2, found from ``/proc/<pid>/cgroup`` of a process in it. Only a worker that can
write there (root on the engine's host, as the warm pool needs anyway) freezes; elsewhere
the pool's sandboxes wait unfrozen. Blocking (file I/O on ``/proc`` and ``/sys``): call
these in a thread.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from . import memcg, stuck

CGROUP_ROOT = Path("/sys/fs/cgroup")
_V1 = ("freezer.state", "FROZEN", "THAWED")
_V2 = ("cgroup.freeze", "1", "0")


def file_of(proc_cgroup: str) -> Path | None:
    """The freezer file of the cgroup a ``/proc/<pid>/cgroup`` text names, or None."""
    v2: Path | None = None
    for controllers, rel in memcg.entries(proc_cgroup):
        if "freezer" in controllers:
            return CGROUP_ROOT / "freezer" / rel / _V1[0]
        if not controllers and rel:
            v2 = CGROUP_ROOT / rel / _V2[0]
    return v2


def of_pid(pid: object) -> Path | None:
    """The freezer file of ``pid``'s cgroup, or None (no such process here, no freezer)."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        found = file_of(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None
    return found if found is not None and found.exists() else None


def _words(path: Path) -> tuple[str, str]:
    return (_V1[1], _V1[2]) if path.name == _V1[0] else (_V2[1], _V2[2])


def freeze(path: Path) -> None:
    """Freeze the cgroup of freezer file ``path`` (the kernel finishes it on its own,
    at once for a sandbox that waits). Raises OSError (not ours to write, gone)."""
    path.write_text(_words(path)[0])


def thaw(path: Path) -> None:
    """Thaw the cgroup of freezer file ``path``. Raises OSError."""
    path.write_text(_words(path)[1])


def frozen(path: Path) -> bool:
    """Whether the cgroup of freezer file ``path`` is frozen or freezing (False: gone)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return False
    if path.name == _V1[0]:
        return text != _V1[2]
    # cgroup v2: cgroup.freeze says what was asked (cgroup.events says what is done).
    return text == _V2[1]


def thaw_runtime(container_id: str, proc: Path = Path("/proc")) -> list[Path]:
    """Thaw the cgroups of ``container_id``'s gVisor runtime processes that are frozen;
    the freezer files thawed. Never raises (what cannot be thawed here is left)."""
    thawed: list[Path] = []
    for pid in stuck.runtime_pids(container_id, proc):
        try:
            path = file_of((proc / str(pid) / "cgroup").read_text())
        except OSError:
            continue
        if path is None or path in thawed or not frozen(path):
            continue
        with contextlib.suppress(OSError):
            thaw(path)
            thawed.append(path)
    return thawed
