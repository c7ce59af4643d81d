"""The container's idle clock: requests touch the activity file (every agent of the
container, at most once a second), and the container's main agent, as its keeper, ends
the container once nobody has touched it for the idle TTL, even with no worker left."""

import os
import time

from . import state

_last_touch = 0.0


def touch():
    global _last_touch
    now = time.time()
    if now - _last_touch < 1.0:
        return
    _last_touch = now
    try:
        fd = os.open(state.ACTIVITY_FILE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            # Writable by every user, so that an agent started for another user (a
            # harness's command as root or as a user of the image) touches it too.
            os.fchmod(fd, 0o666)
        except OSError:
            pass  # not ours
        os.close(fd)
        os.utime(state.ACTIVITY_FILE, None)
    except OSError:
        pass


def keeper(ttl):
    """In the container's main agent: end the container after ``ttl`` seconds without a
    request to any agent (they all touch the activity file), even with no worker left."""
    t0 = time.time()
    while True:
        time.sleep(min(5.0, max(ttl / 10.0, 0.5)))
        try:
            last = os.stat(state.ACTIVITY_FILE).st_mtime
        except OSError:
            last = t0
        if time.time() - max(last, t0) > ttl:
            os._exit(0)
