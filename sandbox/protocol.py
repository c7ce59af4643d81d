"""Wire format between the host and the in-container agent (the package ``sandbox/agent/``).

Newline-delimited JSON; bytes are base64, or raw after a line that announces them
(``"raw": N``: a tunnel's, a large read's or write's, a command's stdin and output).
The host starts the agent with :data:`BOOTSTRAP` as ``python3 -c`` program, then writes
the agent (the bundle of its package, see ``sandbox.bundle``) and one config line, so
the agent always matches the worker version and no host path is mounted for it.

Over a ``docker exec`` attach with ``tty=False`` the engine multiplexes stdout and stderr
into frames with an 8-byte header; :class:`Demuxer` undoes that.
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from typing import Any

from . import bundle

#: The ``python3 -c`` program that loads the agent from stdin: a length-prefixed program
#: (the bundle's loader, which reads the package's sources after it). It uses the same
#: buffered stdin object the agent reads requests from, so no byte is lost between them.
BOOTSTRAP = (
    "import sys;r=sys.stdin.buffer;n=int(r.readline());"
    "exec(compile(r.read(n),'loom-agent','exec'),{'__name__':'__loom_agent__'})"
)

#: Largest response line the host accepts (a 16 MiB read, base64-encoded, plus slack).
MAX_RESPONSE_BYTES = 32 << 20
#: Largest file content one read returns / one write sends.
MAX_READ_BYTES = 16 << 20
MAX_WRITE_BYTES = 64 << 20
#: The most of each output stream a command's answer may keep (the agent's
#: ``command.MAX_CAPTURE``): the largest cap a caller may set.
MAX_EXEC_OUTPUT = 16 << 20
#: Largest raw payload after an answer's line (a read's data, a command's two streams
#: with their markers; the agent's ``channel.RAW_ANSWER``).
MAX_RAW_ANSWER = 33 << 20
#: Largest raw payload after a request's line (a write's content, a command's stdin); a
#: larger file is sent in pieces of this size.
MAX_RAW_REQUEST = MAX_WRITE_BYTES


def env_problem(env: dict[str, str] | None) -> str | None:
    """Why ``env`` cannot be a process's variables on top of the sandbox's, or None: a
    name that is empty or holds ``=`` or NUL, a value that holds NUL. (The agent drops
    such an entry, since an environment cannot hold it; a caller is told instead.)"""
    for name, value in (env or {}).items():
        if not name or "=" in name or "\x00" in name:
            return f"{name[:80]!r} is not a variable name (no '=' or NUL, not empty)"
        if "\x00" in value:
            return f"the value of {name[:80]} holds a NUL byte"
    return None


_bundle: list[bytes] = []
_bundle_lock = threading.Lock()


def agent_bundle() -> bytes:
    """The agent exactly as shipped with this worker version: what a freshly started
    :data:`BOOTSTRAP` reads before the config line (the bundle's loader, length-prefixed,
    then the package's sources and their compiled code). Built from ``sandbox/agent/`` at
    first use (the compile takes tens of milliseconds: :func:`bundle_built` says whether a
    call would block for it), once per process whichever thread asks first.

    Raises OSError, SyntaxError (see ``bundle.build``).
    """
    if not _bundle:
        with _bundle_lock:
            if not _bundle:
                loader, rest = bundle.build()
                _bundle.append(b"%d\n" % len(loader) + loader + rest)
    return _bundle[0]


def bundle_built() -> bool:
    """Whether :func:`agent_bundle` answers at once (it was built already)."""
    return bool(_bundle)


def prebuild_bundle() -> None:
    """Start building :func:`agent_bundle` in a thread of the running loop's default
    executor, unless built: its compile (tens of ms) then overlaps the first container's
    start instead of delaying the first agent's hello (``AgentConnection.start`` waits for
    it if need be). A failure is raised again where the bundle is needed."""
    if not _bundle:
        fut = asyncio.get_running_loop().run_in_executor(None, agent_bundle)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())


def boot_payload(config: dict[str, Any]) -> bytes:
    """What to write to a freshly started bootstrap: the agent, then its config."""
    return agent_bundle() + encode(config)


#: Compact separators; one instance, since ``json.dumps`` builds a new encoder for every
#: call that passes options.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode(obj: dict[str, Any]) -> bytes:
    return _ENCODER.encode(obj).encode() + b"\n"


class Demuxer:
    """Splits Docker's multiplexed attach stream into stdout bytes and stderr bytes.

    Each frame is an 8-byte header (stream: 1 stdout, 2 stderr; big-endian payload size)
    and the payload. A chunk that holds whole frames (the usual case: one response, one
    frame) is sliced without being copied into a buffer first; a frame split across
    chunks waits in the buffer until it is complete, without re-scanning what is there.
    """

    _HEADER = struct.Struct(">BxxxL")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need = 0  # bytes the buffered partial frame needs before it can be parsed

    def feed(self, data: bytes | memoryview) -> tuple[bytes, bytes]:
        """Returns the (stdout, stderr) payload bytes completed by ``data``.

        Nothing returned or kept refers to ``data``, so it may be a view of a buffer that
        is reused for the next read.
        """
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return b"", b""
            data = bytes(buf)
            buf.clear()
        n = len(data)
        pos = 0
        out: list[bytes] = []
        err: list[bytes] = []
        unpack = self._HEADER.unpack_from
        while n - pos >= 8:
            stream, size = unpack(data, pos)
            end = pos + 8 + size
            if end > n:
                break
            (err if stream == 2 else out).append(bytes(data[pos + 8 : end]))  # a copy, not a view
            pos = end
        if pos < n:
            buf += memoryview(data)[pos:]
            self._need = 8 + unpack(data, pos)[1] if n - pos >= 8 else 8
        return _join(out), _join(err)


def _join(parts: list[bytes]) -> bytes:
    if not parts:
        return b""
    return parts[0] if len(parts) == 1 else b"".join(parts)
