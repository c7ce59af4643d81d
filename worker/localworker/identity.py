"""Which local worker an invocation may use: its key.

A local worker must answer exactly as the invocation would have in-process, so the key
(the socket's name) covers everything that decides how a call runs:

- **who**: uid, gid, supplementary groups (the Docker socket's group) and umask (the
  modes of the changelog files it creates);
- **which code**: the interpreter, and the size, mtime and inode of every ``.py`` file of
  the ``worker`` and ``sandbox`` packages, plus the mtimes of the site-packages directories
  (a ``pip install`` adds or removes a ``*.dist-info`` there). ``__version__`` alone is not
  enough: in an editable install it stays the same while the source changes. About 120
  ``stat`` calls, well under a millisecond;
- **which settings**: every ``LOOM_*`` variable (pydantic-settings reads them in any case)
  and the others the worker's behaviour depends on (``DOCKER_*``, ``HOME`` and the XDG
  data directory behind the default ``LOOM_DATA_DIR``, the proxy and CA variables used by
  the catalog's HTTP clients, ``PYTHON*``); plus the working directory when one of the
  path settings is relative, since it then means a different place in each directory;
- **which backend** (``docker``, or the test-only ``local``).

The environment is hashed as it is, not the validated :class:`~worker.settings.Settings`:
the client must not import pydantic (about 70 ms, twice the target of a whole call), and
equal inputs give equal settings. A worker started with settings that do not validate
fails to start, and the in-process call then reports the variable at fault.

Standard library only: this runs on every ``call``.
"""

from __future__ import annotations

import importlib.util
import os
import sys

try:  # hashlib loads OpenSSL (milliseconds on every call); blake2 is built into CPython
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - a CPython built without it
    from hashlib import blake2b

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


#: Bumped when the frames between client and worker change.
PROTOCOL = 2

#: Prefixes (upper-cased names) of the variables that go into the key.
KEY_PREFIXES = ("LOOM_", "DOCKER_", "PYTHON")
#: Other variables that go into the key.
KEY_NAMES = frozenset(
    {
        "HOME",
        "XDG_DATA_HOME",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
    }
)
#: Variables left out: the switch itself says whether a worker is used, not how it works.
KEY_EXCLUDED = frozenset({"LOOM_CLI_DAEMON"})
#: The settings that hold a path: a relative one depends on the working directory.
#: (tests/unit/test_localworker_identity.py checks this against Settings' Path fields.)
PATH_SETTINGS = frozenset(
    {
        "LOOM_DATA_DIR",
        "LOOM_TOOLS_DIR",
        "LOOM_MCP_SERVERS_FILE",
        "LOOM_WORKSPACE_ROOT",
        "LOOM_EGRESS_DIR",
        "LOOM_EGRESS_UPSTREAM_CA",
        "LOOM_WARM_POOL_DIR",
    }
)

_code: str | None = None


def settings_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` a call's behaviour depends on (names as given)."""
    out = {}
    for name, value in environ.items():
        upper = name.upper()
        if (upper.startswith(KEY_PREFIXES) or upper in KEY_NAMES) and upper not in KEY_EXCLUDED:
            out[name] = value
    return out


def cwd_matters(env: Mapping[str, str]) -> bool:
    """Whether a path setting in ``env`` is relative (so the working directory counts)."""
    return any(name.upper() in PATH_SETTINGS and not value.startswith("/") for name, value in env.items())


def _package_dirs() -> list[str]:
    dirs: list[str] = []
    for name in ("worker", "sandbox"):
        spec = importlib.util.find_spec(name)
        if spec is not None:
            dirs.extend(spec.submodule_search_locations or [])
    return dirs


def _walk(h: blake2b, top: str) -> None:
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.name == "__pycache__":
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
                continue
            if not e.name.endswith(".py"):  # an editor's swap file is no new version
                continue
            h.update(f"{e.path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode(errors="surrogateescape"))


def code_identity(*, fresh: bool = False) -> str:
    """A hash of the code this process runs (see the module docstring); computed once,
    or again with ``fresh`` (the local worker asks, to notice an upgrade under it)."""
    global _code
    if _code is None or fresh:
        # The interpreter by its real path (bin/python and bin/python3 are one) and prefix
        # (the virtual environment, whose site-packages it uses).
        exe = os.path.realpath(sys.executable)
        h = blake2b(f"{exe}\0{sys.prefix}\0{sys.version}\0{PROTOCOL}\n".encode(), digest_size=32)
        for d in _package_dirs():
            _walk(h, d)
        for p in sys.path:
            if p.endswith(("site-packages", "dist-packages")):
                try:
                    h.update(f"{p}\0{os.stat(p).st_mtime_ns}\n".encode(errors="surrogateescape"))
                except OSError:
                    pass
        _code = h.hexdigest()
    return _code


def process_identity() -> str:
    """uid, gid, groups and umask of this process."""
    mask = os.umask(0o022)
    os.umask(mask)  # reading the umask means setting it; the CLI has no other threads here
    return f"{os.getuid()}:{os.getgid()}:{','.join(map(str, sorted(os.getgroups())))}:{mask:o}"


def daemon_key(backend: str, environ: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The key of the local worker that may run this process's calls (hex, 24 chars)."""
    env = settings_env(os.environ if environ is None else environ)
    h = blake2b(digest_size=32)
    h.update(f"{PROTOCOL}\0{process_identity()}\0{code_identity()}\0{backend}\n".encode())
    for name in sorted(env):
        h.update(f"{name}={env[name]}\0".encode(errors="surrogateescape"))
    if cwd_matters(env):
        h.update(f"\ncwd={cwd if cwd is not None else os.getcwd()}".encode(errors="surrogateescape"))
    return h.hexdigest()[:24]
