"""Fault points: where the crash tests kill the worker, to prove what survives each step.

``LOOM_FAULT_KILL_AT=<point>`` in a worker's environment makes it SIGKILL itself when it
reaches that point (tests/faults/test_crash_points.py). Read here once, at import, and not
through the settings: it is no setting a user has, only a test's way into the middle of
a call, and it costs one comparison per point when unset.

Points: ``command.started`` (the command's intent is written, the command not yet sent),
``command.ran`` (the command ended, its changes not yet scanned), ``command.recorded``
(its changes recorded, its intent not yet closed), ``write.recorded`` (a write's entry
and staging done, the file not yet in place), ``write.placed`` (the file in place, its
entry not yet settled).
"""

from __future__ import annotations

import os
import signal

_AT = os.environ.get("LOOM_FAULT_KILL_AT") or None


def point(name: str) -> None:
    """Die here (SIGKILL, no cleanup) when this is the point the test chose."""
    if _AT is not None and _AT == name:
        os.kill(os.getpid(), signal.SIGKILL)
