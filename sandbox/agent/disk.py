"""The workspace's disk. The bind-mounted workspace is the host's disk, where the
container's limits do not reach: tool writes must leave ``state.DISK_RESERVE`` free
(:func:`check_reserve`), and :class:`DiskWatch` stops a command that consumes more than
``state.DISK_LIMIT`` bytes or ``state.INODE_LIMIT`` files, or brings the filesystem under
its reserves."""

import os

from . import state
from .errors import Refused

DISK_POLL = 0.05
#: A command is held to the reserve only once it has itself consumed this much, so one
#: that writes nothing is not stopped because something else filled the disk.
DISK_SLACK = 16 << 20
#: The share of the filesystem's inodes no command may use up (a disk can be filled with
#: empty files too).
INODE_RESERVE = 0.01
INODE_SLACK = 10000


def _disk_avail():
    """Bytes an unprivileged writer may still use on the workspace's filesystem, or
    None when the filesystem does not say."""
    st = _statvfs()
    return None if st is None else st.f_bavail * st.f_frsize


def _statvfs():
    try:
        return os.statvfs(state.ROOT)
    except OSError:
        return None


def check_reserve(growth, path):
    if not state.DISK_RESERVE or growth <= 0:
        return
    avail = _disk_avail()
    if avail is not None and avail - growth < state.DISK_RESERVE:
        raise Refused(
            "no_space",
            "No space left for %s: writing %d more bytes would leave less than the %d bytes the "
            "sandbox keeps free on the workspace's disk (%d available)" % (path, growth, state.DISK_RESERVE, avail),
        )


class DiskWatch(object):
    """Stops a command that fills the workspace's disk: more than DISK_LIMIT bytes
    consumed since it started, or free space below DISK_RESERVE (once it has consumed
    DISK_SLACK itself). The bind-mounted workspace is the host's disk, where the
    container's limits do not reach; RLIMIT_FSIZE (the container's ``fsize`` ulimit)
    bounds any one file, this bounds a command's total. It samples ``statvfs`` every
    DISK_POLL seconds, so a command can overshoot by what it writes in one interval.
    Inodes are held the same way (INODE_LIMIT, INODE_RESERVE) where the filesystem
    counts them (f_files > 0)."""

    def __init__(self, now):
        st = _statvfs()
        self.start = None if st is None else (st.f_bavail * st.f_frsize, st.f_favail)
        self.next = now + DISK_POLL
        self.used = 0
        self.files = 0

    def exceeded(self, now):
        if now < self.next or self.start is None:
            return False
        self.next = now + DISK_POLL
        st = _statvfs()
        if st is None:
            return False
        avail = st.f_bavail * st.f_frsize
        self.used = max(self.used, self.start[0] - avail)
        if state.DISK_LIMIT and self.used > state.DISK_LIMIT:
            return True
        if state.DISK_RESERVE and avail < state.DISK_RESERVE and self.used > DISK_SLACK:
            return True
        if st.f_files <= 0:
            return False  # no inode accounting (btrfs, some network filesystems)
        self.files = max(self.files, self.start[1] - st.f_favail)
        if state.INODE_LIMIT and self.files > state.INODE_LIMIT:
            return True
        return st.f_favail < st.f_files * INODE_RESERVE and self.files > INODE_SLACK
