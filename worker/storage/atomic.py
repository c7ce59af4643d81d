"""A file replaced whole, in one step: what every small file of the worker's own (settings,
secrets, the CA's key, the background processes' record, the API token, cached listings,
the sandbox's resolv.conf, Docker's daemon.json) is written with.

The bytes go to a temporary file of the writer's own beside the target (same directory:
same filesystem, so the rename is atomic; its own: writers at once never share one), which
is given its mode, flushed to disk when asked, and renamed over the target. A reader sees
the old content or the new, never a part; a crash leaves the old content and at most a
stray temporary (a dot-file named after the target).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o600, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` (a str is written as UTF-8), the file's mode ``mode``.
    ``fsync``: the content is on disk before the rename (a power cut keeps the old or the
    new file whole). Raises OSError (the temporary removed)."""
    target = Path(path)
    body = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)  # (mode 0600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if mode != 0o600:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
