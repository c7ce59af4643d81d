"""Turn by turn undo: each of an agent's own tool calls becomes its own changelog group.

An agent CLI runs as one background process of the workspace (``agent run``), so by
default everything it changes is one group under its process id. The agent's own hooks
split that: after each tool call, a hook in the sandbox (``loom-turn.py``, run by loom's own runtime Python)
sends one JSON line ``{"tool": "Edit", "summary": "src/a.py"}`` to a unix socket this
worker serves (:class:`TurnChannel`), and waits for the answer. The worker records what
changed since the last scan as one group (call id ``<process id>.t<N>``, tool = the agent's
tool name, command = the summary), and only then answers, so the agent's next tool call
cannot leak into it. What changes after the last turn stays under the process id.

Where the socket lives: the egress gateway's per-workspace directory, already mounted
read-only into the sandbox (at :data:`sandbox.spec.EGRESS_MOUNT`) of every workspace that
may reach the network, which an agent's workspace always does (its provider's API host).
Connecting to a unix socket on a read-only bind mount works under runc, and under gVisor
with ``--host-uds=open`` (what the gateway needs too). A workspace without egress has no
such directory: :meth:`TurnChannel.open` then serves nothing and the session is one group.

The requests come from the sandbox and are not trusted: one line of at most
:data:`MAX_LINE` bytes, control characters stripped, the tool name and summary cut to
:data:`MAX_TOOL` / :data:`MAX_SUMMARY` characters; requests are served one at a time, at
most :data:`MAX_CONNECTIONS` connections at once, at most :data:`MAX_TURNS` turns a
session (after that the changes stay under the process id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.logs import get_logger
from sandbox.spec import EGRESS_MOUNT

from ..unixsockets import bind_for_any_uid, connect_in
from .hooks import HOOK_TIMEOUT, agent_args, hook_files  # (re-exported: the agreed interface)

log = get_logger("worker.agents.turns")

MAX_LINE = 4096
MAX_TOOL = 64
MAX_SUMMARY = 200
MAX_CONNECTIONS = 8
MAX_TURNS = 10_000
#: A connection that sends nothing for this long is closed (its slot is freed).
IDLE = 60.0
_PROCESS_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069]+")


@dataclass(frozen=True)
class TurnRequest:
    """One turn as the hook reports it (cleaned)."""

    tool: str
    summary: str


def _clean(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else ""
    return _CONTROL.sub(" ", text).strip()[:limit]


def parse_request(line: bytes) -> TurnRequest:
    """One request line from the sandbox, cleaned: control characters become spaces, the
    tool name is cut to MAX_TOOL characters (default ``tool``), the summary to MAX_SUMMARY.
    Raises ValueError for a line over MAX_LINE bytes or not a JSON object."""
    if len(line) > MAX_LINE:
        raise ValueError(f"request over {MAX_LINE} bytes")
    try:
        data = json.loads(line.decode("utf-8", "replace"))
    except ValueError as e:
        raise ValueError("request is not JSON") from e
    if not isinstance(data, dict):
        raise ValueError("request is not a JSON object")
    return TurnRequest(_clean(data.get("tool"), MAX_TOOL) or "tool", _clean(data.get("summary"), MAX_SUMMARY))


class TurnChannel:
    """The socket one agent process (``process_id``) reports its turns on."""

    def __init__(self, workspace: Any, process_id: str, host_dir: Path | None) -> None:
        if not _PROCESS_ID.fullmatch(process_id):
            raise ValueError(f"not a process id: {process_id!r}")
        self.workspace = workspace
        self.process_id = process_id
        self.name = f"turn-{process_id}.sock"
        self.host_dir = host_dir
        #: The socket's path inside the sandbox (None: no turns, one group per session).
        self.sandbox_path = f"{EGRESS_MOUNT}/{self.name}" if host_dir is not None else None
        #: Turns recorded so far.
        self.turns = 0
        self._lock = asyncio.Lock()
        self._conns: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, workspace: Any, process_id: str, host_dir: Path | None = None) -> AsyncIterator[TurnChannel]:
        """Serve the turns of ``process_id`` (a background process of ``workspace``, a
        :class:`worker.workspace.Workspace`, started after this with :meth:`env` in its
        environment) on ``host_dir/turn-<process id>.sock``: ``host_dir`` is the egress
        gateway's socket directory of the workspace (``ToolRegistry.pool.turn_dir``), None
        when it has none (nothing is served). The socket is removed on exit.
        Raises ValueError (a bad process id), OSError (the socket cannot be bound)."""
        ch = cls(workspace, process_id, host_dir)
        if host_dir is not None:
            sock = await asyncio.to_thread(bind_for_any_uid, host_dir, ch.name, 16)
            ch._server = await asyncio.start_unix_server(ch._accept, sock=sock, limit=MAX_LINE + 2)
        try:
            yield ch
        finally:
            await ch._close()

    def env(self) -> dict[str, str]:
        """The variables the agent's process needs ({} when nothing is served)."""
        return {"LOOM_TURN_SOCKET": self.sandbox_path} if self.sandbox_path else {}

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            with contextlib.suppress(OSError):
                await self._server.wait_closed()
            self._server = None
        if self.host_dir is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.host_dir / self.name)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._conns) >= MAX_CONNECTIONS or task is None:
            writer.close()
            return
        self._conns.add(task)
        try:
            await self._serve(reader, writer)
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                line = await asyncio.wait_for(reader.readline(), IDLE)
            except ValueError:  # a line over the reader's limit: the connection is dropped
                return
            if not line:
                return
            answer = await self.record(line)
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()

    async def record(self, line: bytes) -> dict[str, Any]:
        """Record one request line as a turn; the answer to send back. A request that is
        not valid, or past MAX_TURNS, records nothing. Recording errors are answered and
        logged, not raised (the hook must never break the agent)."""
        try:
            req = parse_request(line)
        except ValueError as e:
            return {"ok": False, "error": str(e)}
        t0 = time.perf_counter()
        async with self._lock:
            if self.turns >= MAX_TURNS:
                return {"ok": False, "error": f"over {MAX_TURNS} turns: the rest is one group"}
            self.turns += 1
            n = self.turns
            turn = {"call_id": f"{self.process_id}.t{n}", "tool": req.tool, "command": req.summary}
            try:
                changed = await self.workspace.settle_background(prefer=self.process_id, turn=turn)
            except Exception as e:  # the recorder's and the sandbox's errors alike: logged, answered
                log.warning("turns.record_failed", process=self.process_id, turn=n, error=repr(e))
                return {"ok": False, "group": n, "error": "the turn could not be recorded"}
        log.debug(
            "turns.recorded", process=self.process_id, turn=n, tool=req.tool, changed=len(changed),
            ms=round(1000 * (time.perf_counter() - t0), 1),
        )  # fmt: skip
        return {"ok": True, "group": n, "changed": len(changed)}


_SUMMARY_KEYS = ("file_path", "notebook_path", "path", "command", "cmd", "input")
_PATCH_FILES = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.*)$", re.M)


def hook_request(hook: Any) -> bytes:
    """The turn request line for an agent's hook input (its JSON as Claude Code and Codex
    send it: ``tool_name``, ``tool_input``, ``hook_event_name``), as the hook script in
    :mod:`.hooks` makes it: the tool's name, and its file or command as the summary (for
    a patch, the files it names); before a tool, what changed since the last one."""
    if not isinstance(hook, dict):
        hook = {}
    ti = hook.get("tool_input")
    what: Any = ""
    if isinstance(ti, dict):
        what = next((ti[k] for k in _SUMMARY_KEYS if ti.get(k)), "")
    if isinstance(what, list):
        what = " ".join(str(w) for w in what)
    if not isinstance(what, str):
        what = json.dumps(what)
    if what.startswith("*** Begin Patch"):
        what = " ".join(_PATCH_FILES.findall(what)) or what
    tool = str(hook.get("tool_name") or "tool")[:MAX_TOOL]
    if hook.get("hook_event_name") == "PreToolUse":
        tool, what = "apply_patch", "edits made before " + what[:180]
    return json.dumps({"tool": tool, "summary": what[:MAX_SUMMARY]}).encode() + b"\n"


async def relay_hook(socket_dir: Path, process_id: str, body: bytes) -> None:
    """Report a turn that came as an agent's HTTP hook (the egress gateway's
    ``POST /.loom/turn/<process id>``): its request to that process's socket in
    ``socket_dir``, and wait for the answer (the turn recorded). Never raises: no such
    process, a body that is not JSON, a worker that does not answer: nothing happens."""
    if not _PROCESS_ID.fullmatch(process_id):
        return
    try:
        line = hook_request(json.loads(body or b"{}"))
    except ValueError:
        return
    writer = None
    try:
        async with asyncio.timeout(HOOK_TIMEOUT):
            sock = await connect_in(socket_dir, f"turn-{process_id}.sock")
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            writer.write(line)
            await writer.drain()
            await reader.readline()
    except (OSError, TimeoutError, ValueError) as e:
        log.debug("turns.relay_failed", process=process_id, error=repr(e))
    finally:
        if writer is not None:
            writer.close()


__all__ = ["TurnChannel", "TurnRequest", "agent_args", "hook_files", "hook_request", "parse_request", "relay_hook"]
