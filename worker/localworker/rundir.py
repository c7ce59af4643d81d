"""The private directory of one user's local workers, and the files of each worker in it.

``$XDG_RUNTIME_DIR/loom-worker`` when ``$XDG_RUNTIME_DIR`` is set, absolute and ours
(owned by this uid, no access for group or others, not a link: what systemd-logind makes
at ``/run/user/<uid>``), else ``$TMPDIR/loom-worker-<uid>`` (``/tmp/loom-worker-<uid>``).
Either is created with mode 0700 and then checked with ``lstat``, never followed: in a
shared ``/tmp`` another user could have made that name first, a directory of theirs or a
link to one, and a socket there would let them answer our calls. A directory that fails
the check is not used at all (the CLI then runs calls in-process and ``loom-worker
doctor`` says why), and it is never "repaired": chmod-ing what another user owns would
not make it ours. This is tmux's rule for ``/tmp/tmux-<uid>``.

Per worker (``d-<key>``): ``.sock`` (mode 0600), ``.lock`` (taken by whoever starts it)
and ``.log`` (the worker's own log, for ``doctor``).

Standard library only: this runs on every ``call``.
"""

from __future__ import annotations

import os
import stat

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


#: sun_path holds 108 bytes, the terminating NUL included.
MAX_SOCKET_PATH = 107


class RunDirError(Exception):
    """This user's run directory cannot be used; the message says why."""


class WorkerFiles:
    """The files of the local worker with ``key`` in run directory ``dir``. (A plain
    class: ``dataclasses`` imports ``inspect``, milliseconds on every call.)"""

    __slots__ = ("dir", "key")

    def __init__(self, dir: str, key: str) -> None:
        self.dir = dir
        self.key = key

    @property
    def socket(self) -> str:
        return f"{self.dir}/d-{self.key}.sock"

    @property
    def lock(self) -> str:
        return f"{self.dir}/d-{self.key}.lock"

    @property
    def log(self) -> str:
        return f"{self.dir}/d-{self.key}.log"


def check_private_dir(path: str, uid: int) -> None:
    """Raise RunDirError unless ``path`` (not followed) is a directory owned by ``uid``
    that no other user may enter."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise RunDirError(f"{path}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise RunDirError(f"{path} is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirError(f"{path} is not a directory")
    if st.st_uid != uid:
        raise RunDirError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {uid})")
    if st.st_mode & 0o077:
        raise RunDirError(f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):04o}, 0700 is needed)")


def _ensure(path: str, uid: int) -> str:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise RunDirError(f"cannot create {path}: {e.strerror}") from None
    check_private_dir(path, uid)
    return path


def run_dir(environ: Mapping[str, str] | None = None) -> tuple[str, list[str]]:
    """This user's run directory, created if needed, and notes on choices made (an
    ``$XDG_RUNTIME_DIR`` that was not used, and why). Raises RunDirError."""
    env = os.environ if environ is None else environ
    uid = os.getuid()
    notes: list[str] = []
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg:
        try:
            if not xdg.startswith("/"):
                raise RunDirError(f"XDG_RUNTIME_DIR={xdg} is not absolute")
            check_private_dir(xdg, uid)
            return _ensure(f"{xdg.rstrip('/')}/loom-worker", uid), notes
        except RunDirError as e:
            notes.append(f"XDG_RUNTIME_DIR not used: {e}")
    tmp = env.get("TMPDIR", "") or "/tmp"
    if not tmp.startswith("/"):
        tmp = "/tmp"
    return _ensure(f"{tmp.rstrip('/')}/loom-worker-{uid}", uid), notes


def worker_files(key: str, environ: Mapping[str, str] | None = None) -> WorkerFiles:
    """The files of the worker with ``key``. Raises RunDirError (also when the socket's
    path would not fit in a unix socket address)."""
    d, _notes = run_dir(environ)
    files = WorkerFiles(d, key)
    if len(files.socket.encode()) > MAX_SOCKET_PATH:
        raise RunDirError(f"{files.socket} is too long for a unix socket ({MAX_SOCKET_PATH} bytes at most)")
    return files
