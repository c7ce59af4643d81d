"""The Sandbox side of a harness's calls (an evaluation framework driving the sandbox,
not the model): files anywhere in the sandbox, read and written as its user
(:meth:`~sandbox.capabilities.HarnessFiles.read_path`, :meth:`~sandbox.capabilities.HarnessFiles.write_path`), and
the agent a command runs in when it asks for another user (:meth:`HarnessMixin.as_user`).
Mixed into :class:`~sandbox.client.AgentSandbox` over its agent connection."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from . import protocol
from .answers import check_int, check_relpath, check_str
from .errors import ConflictError, InWorkspaceError, ProtocolError, UserUnsupportedError
from .results import ExecResult, PathRead, PathWrite

if TYPE_CHECKING:
    from .base import Sandbox
    from .connection import AgentConnection

#: Host deadline slack over the agent's own budget (``sandbox.client.DEADLINE_SLACK``).
_SLACK = 5.0


class HarnessMixin:
    """``read_path``, ``write_path`` and ``as_user`` over the agent (see the module doc)."""

    _io_timeout: float

    async def connection(self) -> AgentConnection:
        raise NotImplementedError

    async def _call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        raise NotImplementedError

    async def read_path(self, path: str, *, max_bytes: int) -> PathRead:
        if not path.startswith("/"):
            raise ValueError("read_path takes an absolute path")
        piece = protocol.MAX_READ_BYTES
        for _attempt in range(3):
            parts: builtins.list[bytes] = []
            offset, ident, size = 0, None, 0
            while True:
                want = max(0, min(piece, max_bytes - offset))
                r = await self._call("fs_read", {"path": path, "offset": offset, "length": want})
                raw = r.get("_raw")
                if not isinstance(raw, bytes) or len(raw) > want:
                    raise ProtocolError("agent sent an invalid file read")
                size = check_int(r.get("size"), "size")
                this = tuple(check_int(r.get(k), k, lo=-(1 << 62)) for k in ("dev", "ino", "mtime_ns", "ctime_ns"))
                if ident is not None and (size, this) != ident:
                    break  # it changed between two pieces: read it again
                ident = (size, this)
                parts.append(raw)
                offset += len(raw)
                if not raw or offset >= min(size, max_bytes):
                    return PathRead(data=b"".join(parts), size=size, truncated=size > max_bytes)
        raise ConflictError(f"Conflict: {path} kept changing while it was read", code="conflict")

    async def write_path(self, path: str, data: bytes, *, mode: int | None = None) -> PathWrite:
        if not path.startswith("/"):
            raise ValueError("write_path takes an absolute path")
        piece = protocol.MAX_RAW_REQUEST
        args: dict[str, Any] = {"path": path, "mode": mode}
        if len(data) > piece:
            args.update(more=True, total=len(data))
        conn = await self.connection()
        deadline = self._io_timeout + _SLACK
        try:
            r = await conn.request("fs_write", args, timeout=deadline, raw=data if len(data) <= piece else data[:piece])
        except InWorkspaceError as e:
            # The path is the agent's word: checked like every path it sends.
            raise InWorkspaceError(check_relpath(str(e))) from None
        token = r.get("token")
        for start in range(piece, len(data), piece):
            more = {"token": check_str(token, "token", limit=64), "last": start + piece >= len(data)}
            await conn.request("fs_append", more, timeout=deadline, raw=data[start : start + piece])
        return PathWrite(
            path=check_str(r.get("path"), "path", limit=8192), size=len(data), created=bool(r.get("created"))
        )

    async def as_user(self, user: str) -> Sandbox | ExecResult:
        """This sandbox's agent running as ``user`` (a name of the image, or
        ``uid[:gid]``): itself for the workspace owner, else one started for that user
        (kept for the next command), or, for a user the image does not have, the
        ExecResult of a command that could not start. Raises UserUnsupportedError where
        the backend or the workspace's settings do not allow that user."""
        raise UserUnsupportedError(f"{type(self).__name__} cannot run commands as another user")
