"""Wire format between the host and the in-container agent (see ``sandbox/agent.py``).

Newline-delimited JSON; bytes are base64. The host starts the agent with :data:`BOOTSTRAP`
as ``python3 -c`` program, then writes the agent's source (length-prefixed) and one config
line, so the agent always matches the worker version and no host path is mounted for it.

Over a ``docker exec`` attach with ``tty=False`` the engine multiplexes stdout and stderr
into frames with an 8-byte header; :class:`Demuxer` undoes that.
"""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path
from typing import Any

#: The ``python3 -c`` program that loads the agent from stdin. It uses the same buffered
#: stdin object the agent reads requests from, so no byte is lost between the two.
BOOTSTRAP = (
    "import sys;r=sys.stdin.buffer;n=int(r.readline());"
    "exec(compile(r.read(n),'loom-agent','exec'),{'__name__':'__loom_agent__'})"
)

#: Largest response line the host accepts (a 16 MiB read, base64-encoded, plus slack).
MAX_RESPONSE_BYTES = 32 << 20
#: Largest file content one read returns / one write sends.
MAX_READ_BYTES = 16 << 20
MAX_WRITE_BYTES = 64 << 20


@functools.cache
def agent_source() -> bytes:
    """The agent program, exactly as shipped with this worker version."""
    return Path(__file__).with_name("agent.py").read_bytes()


def boot_payload(config: dict[str, Any]) -> bytes:
    """What to write to a freshly started bootstrap: the agent source, then its config."""
    src = agent_source()
    return b"%d\n" % len(src) + src + encode(config)


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


class Demuxer:
    """Splits Docker's multiplexed attach stream into stdout bytes and stderr bytes."""

    _HEADER = struct.Struct(">BxxxL")

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """Returns the (stdout, stderr) payload bytes completed by ``data``."""
        self._buf += data
        out = bytearray()
        err = bytearray()
        while len(self._buf) >= 8:
            stream, size = self._HEADER.unpack_from(self._buf)
            if len(self._buf) < 8 + size:
                break
            payload = bytes(self._buf[8 : 8 + size])
            del self._buf[: 8 + size]
            if stream == 2:
                err += payload
            else:
                out += payload
        return bytes(out), bytes(err)
