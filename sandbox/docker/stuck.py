"""A gVisor sandbox the engine is stuck on: its runtime processes on this host, killed.

A ``docker rm -f`` of a gVisor container asks ``runsc kill`` to signal the sandbox, and
``runsc kill`` asks the sandbox's own kernel (the ``runsc-sandbox`` process, the Sentry).
A Sentry that never answers (found once in CI, after a terminal's client was killed; a
stopped one does the same) leaves ``runsc kill`` waiting forever, and the engine holds
that container's lock all the while: every inspect, kill or removal of it waits, until the
Docker daemon restarts. Killing the container's ``runsc-sandbox`` and ``runsc-gofer``
processes ends the wait (``runsc kill`` fails, the shim reaps, the removal completes):
the container was being force-removed anyway. Only processes this one can see and signal
(the worker as root on the engine's host, as the warm pool needs too); elsewhere nothing
is done and the removal fails at the engine's deadline, naming the container.

Blocking (reads ``/proc``): call it in a thread.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

#: The runtime's processes of one sandbox (the Sentry and the file proxy): their command
#: lines carry the container's id (the ``--log`` path under the shim's task directory).
_RUNTIME_PROCESSES = (b"runsc-sandbox", b"runsc-gofer")


def runtime_pids(container_id: str, proc: Path = Path("/proc")) -> list[int]:
    """The pids of ``container_id``'s gVisor runtime processes visible here (none for a
    runc container, or from another pid namespace)."""
    needle = container_id.encode()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # (gone meanwhile, or not ours to read)
            continue
        if argv and argv[0] in _RUNTIME_PROCESSES and any(needle in a for a in argv[1:]):
            found.append(int(entry.name))
    return found


def kill_runtime(container_id: str, proc: Path = Path("/proc")) -> list[int]:
    """SIGKILL ``container_id``'s gVisor runtime processes; the pids signalled."""
    killed = []
    for pid in runtime_pids(container_id, proc):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # (gone meanwhile, or not ours to signal)
            continue
        killed.append(pid)
    return killed
