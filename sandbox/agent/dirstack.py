"""The chain of open directories an iterative tree walk stands in, with a bounded number
of descriptors.

A command can make a tree far deeper than Python's recursion limit (1,000 levels) and
than PATH_MAX (a path of 5,000 levels does not fit in one string the kernel takes), and a
process may hold only RLIMIT_NOFILE descriptors (often 1,024 on a host). So the walks
(the change scan, tree removal, listing) keep their own stack instead of recursing, reach
each level by ``openat`` of one name from its parent's descriptor (O_NOFOLLOW: never
through a link), and keep open only the top ``KEEP`` levels plus every ``EVERY``-th one
below: a closed level is opened again from the nearest open one above it, one name at a
time, and must be the same directory (inode) it was; one that is not was moved or swapped
while the walk was below it, and :meth:`DirStack.fd` raises ``OSError(ESTALE)``.
"""

import errno
import os

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class DirStack(object):
    """Directories from ``base_fd`` (level 0, the caller's, never closed here) down."""

    #: Levels below the base always kept open (no walk of an ordinary tree reopens).
    KEEP = 48
    #: Below those, every EVERY-th level is kept, so reopening costs at most EVERY opens.
    EVERY = 32

    def __init__(self, base_fd):
        self._fds = [base_fd]
        self._names = [None]  # type: list
        self._inos = [None]  # type: list

    def __len__(self):
        """The number of levels below the base."""
        return len(self._fds) - 1

    def name(self):
        """The name of the top level in its parent."""
        return self._names[-1]

    def _pinned(self, i):
        return i <= self.KEEP or i % self.EVERY == 0

    def push(self, name):
        """Open directory ``name`` of the top level (never following a link) as the new
        top; returns its descriptor (owned by the stack). Raises OSError as ``openat``
        does (ENOTDIR or ELOOP: ``name`` is not a directory or is a link), or ESTALE when
        the top level must be reopened and is no longer the directory it was."""
        parent = self.fd()
        sub = os.open(name, _DIR_FLAGS, dir_fd=parent)
        try:
            ino = os.fstat(sub).st_ino
        except OSError:
            os.close(sub)
            raise
        self._fds.append(sub)
        self._names.append(name)
        self._inos.append(ino)
        below = len(self._fds) - 2
        if below > 0 and not self._pinned(below):
            os.close(self._fds[below])
            self._fds[below] = -1
        return sub

    def pop(self):
        """Close the top level (not the base)."""
        if len(self._fds) > 1:
            fd = self._fds.pop()
            self._names.pop()
            self._inos.pop()
            if fd >= 0:
                os.close(fd)

    def fd(self):
        """The top level's descriptor, reopened if it was closed. Raises OSError (ESTALE:
        a level on the way is not the directory the walk entered any more)."""
        top = len(self._fds) - 1
        if self._fds[top] >= 0:
            return self._fds[top]
        j = top
        while self._fds[j] < 0:
            j -= 1
        opened = []
        try:
            cur = self._fds[j]
            for k in range(j + 1, top + 1):
                nfd = os.open(self._names[k], _DIR_FLAGS, dir_fd=cur)
                opened.append(nfd)
                if os.fstat(nfd).st_ino != self._inos[k]:
                    raise OSError(errno.ESTALE, "directory moved during the walk", self._names[k])
                cur = nfd
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        # Keep the top and the pinned levels on the way; the others are closed again.
        for n, fd in enumerate(opened):
            k = j + 1 + n
            if k == top or self._pinned(k):
                self._fds[k] = fd
            else:
                os.close(fd)
        return self._fds[top]

    def close(self):
        """Close every level but the base."""
        while len(self._fds) > 1:
            self.pop()
