"""Unix sockets in a host directory that a sandbox reaches through a mount (the egress
gateway's socket, an agent's turn socket): bound and connected through
``/proc/self/fd/<directory fd>/<name>``, so a long data directory cannot exceed the
108-byte limit of a socket path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path


def bind_for_any_uid(d: Path, name: str, backlog: int) -> socket.socket:
    """A listening, non-blocking unix socket ``d/name`` (replacing a stale one) that any
    uid may connect to (a sandbox's user is not this one). Raises OSError."""
    dfd = os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(f"/proc/self/fd/{dfd}/{name}")
            os.chmod(name, 0o666, dir_fd=dfd)
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock
    finally:
        os.close(dfd)


async def connect_in(d: Path, name: str) -> socket.socket:
    """A connected, non-blocking unix socket to ``d/name``. Raises OSError."""
    dfd = os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, f"/proc/self/fd/{dfd}/{name}")
    except BaseException:
        sock.close()
        raise
    finally:
        os.close(dfd)
    return sock
