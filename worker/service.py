"""What the HTTP API and the MCP server share: workspace ids, and running one tool call
with the service's guarantees (per-workspace order, a global limit, metrics, one log line).

Workspaces of the service are directories directly under ``LOOM_WORKSPACE_ROOT``, named by
an id matching :data:`WORKSPACE_ID_PATTERN` (one path component; no ``/``, no leading dot,
so never ``.`` or ``..``). Creating and deleting those directories is the only host-side
file work the service does; everything inside a workspace goes through its sandbox.

Errors::

    ServiceError
    ├── InvalidWorkspaceId     (also ValueError)   the id breaks the pattern
    ├── WorkspaceNotFound      (also LookupError)  no such workspace directory
    ├── WorkspaceExists                            create with a name already taken
    └── Busy                                       the global concurrency limit is reached
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sandbox.base import OutputCallback
from sandbox.identity import fork_volume_of

if TYPE_CHECKING:
    from .registry.contract import ServiceRegistry
    from .workspace_settings import WorkspaceSettings
from sandbox.logs import get_logger

from .content import tool_text
from .metrics import Metrics
from .result import ToolResult, json_line
from .streaming import ToolOutput, stream_call

log = get_logger("worker.service")

WORKSPACE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_ID_RE = re.compile(WORKSPACE_ID_PATTERN)


class ServiceError(Exception):
    pass


class InvalidWorkspaceId(ServiceError, ValueError):
    pass


class WorkspaceNotFound(ServiceError, LookupError):
    pass


class WorkspaceExists(ServiceError):
    pass


class Busy(ServiceError):
    pass


@runtime_checkable
class CreatesConfigured(Protocol):
    """Workspaces that take a new workspace's own settings themselves (a cluster's: its
    node checks and stores them), instead of the registry storing them after."""

    async def create_configured(self, ws_id: str | None, settings: WorkspaceSettings) -> WorkspaceInfo:
        """Raises SettingsError naming the field (nothing is created), WorkspaceExists."""
        ...


def check_workspace_id(ws_id: str) -> str:
    """``ws_id`` if valid. Raises InvalidWorkspaceId."""
    if not isinstance(ws_id, str) or not _ID_RE.fullmatch(ws_id):
        raise InvalidWorkspaceId(
            "Invalid workspace id: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return ws_id


@dataclass(frozen=True)
class WorkspaceInfo:
    id: str
    path: str
    #: Where it runs, for a service whose workspaces are spread over a cluster (the Ray
    #: node id, and ``ready`` or ``lost``); None for a one-machine service.
    node: str | None = None
    state: str | None = None


def is_fork_link(p: Path | str) -> bool:
    """Whether ``p`` is a link to an overlay fork's mountpoint (``Snapshots.fork`` made it
    so on a host where forks are overlay volumes: ``worker.snapshots.overlay``). Blocking."""
    try:
        return fork_volume_of(os.readlink(p)) is not None and os.path.isdir(p)
    except OSError:
        return False


class Workspaces:
    """The directories under the service's workspace root (an overlay fork's: a link to
    the engine's mountpoint of its volume, :func:`is_fork_link`)."""

    def __init__(self, root: Path, *, uid: int | None = None, gid: int | None = None) -> None:
        self.root = Path(root)
        self._uid = uid
        self._gid = gid
        #: Removes an overlay fork whole (``Snapshots.remove_fork``; set by the service).
        self.fork_remover: Callable[[Path], Awaitable[None]] | None = None

    def ensure_root(self) -> None:
        """Create the root if needed. Raises OSError."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root = self.root.resolve()

    def path(self, ws_id: str) -> Path:
        """The directory of an existing workspace. Raises InvalidWorkspaceId, WorkspaceNotFound."""
        p = self.root / check_workspace_id(ws_id)
        # A symlink under the root could point anywhere on the host: never a workspace,
        # but for a fork on an overlay volume (its link to the engine's mountpoint; the
        # Docker backend checks that volume is one of ours before a sandbox mounts it).
        # One lstat (not is_symlink + is_dir): this runs on every call.
        try:
            mode = os.lstat(p).st_mode
        except OSError:
            mode = 0
        if not (stat.S_ISDIR(mode) or (stat.S_ISLNK(mode) and is_fork_link(p))):
            raise WorkspaceNotFound(f"Workspace {ws_id!r} not found")
        return p

    async def locate(self, ws_id: str) -> Path:
        """:meth:`path`, for the routes: a workspace of a cluster's service is looked up
        over the network (``worker.integrations.ray``), so the routes await it. Raises
        InvalidWorkspaceId, WorkspaceNotFound."""
        return self.path(ws_id)

    async def release(self, ws_id: str) -> None:
        """Give up what the service holds for a deleted workspace (here nothing: the
        directory is the workspace; a cluster frees its slot)."""

    def _create(self, ws_id: str | None) -> WorkspaceInfo:
        if ws_id is None:
            ws_id = "ws-" + secrets.token_hex(6)
        p = self.root / check_workspace_id(ws_id)
        try:
            p.mkdir(mode=0o755)
        except FileExistsError:
            raise WorkspaceExists(f"Workspace {ws_id!r} already exists") from None
        if self._uid is not None:
            # Sandboxes run as the workspace owner: hand the directory to the sandbox user.
            os.chown(p, self._uid, self._gid if self._gid is not None else self._uid)
        return WorkspaceInfo(ws_id, str(p))

    async def create(self, ws_id: str | None = None) -> WorkspaceInfo:
        """Create a workspace (a random id when None). Raises InvalidWorkspaceId, WorkspaceExists."""
        return await asyncio.to_thread(self._create, ws_id)

    def _list(self) -> list[WorkspaceInfo]:
        out = []
        for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
            if _ID_RE.fullmatch(entry.name) and (entry.is_dir(follow_symlinks=False) or is_fork_link(entry.path)):
                out.append(WorkspaceInfo(entry.name, os.path.join(self.root, entry.name)))
        return out

    async def list(self) -> list[WorkspaceInfo]:
        return await asyncio.to_thread(self._list)

    async def delete_files(self, ws_id: str) -> None:
        """Remove the workspace directory and everything in it (links are not followed);
        an overlay fork (a link, :func:`is_fork_link`) with :attr:`fork_remover`: its
        volume, layers, changelog and record go with its link.

        Raises InvalidWorkspaceId, WorkspaceNotFound, OSError (an overlay fork, and no
        ``fork_remover``), what ``fork_remover`` raises.
        """
        p = self.path(ws_id)
        if await asyncio.to_thread(is_fork_link, p):
            if self.fork_remover is None:
                raise OSError(f"workspace {ws_id!r} is an overlay fork, and this service cannot remove forks")
            await self.fork_remover(p)
            return
        await asyncio.to_thread(shutil.rmtree, p)


class CallRunner:
    """Runs tool calls for the service surfaces.

    Calls to one workspace run one at a time, in arrival order (asyncio locks are FIFO), so
    a client's sequence of edits is applied as sent and concurrent clients never interleave
    inside one workspace. At most ``max_concurrent`` calls are in flight (waiting or
    running) in the whole process; beyond that :meth:`slot` raises Busy (HTTP 429) rather
    than queueing without bound.
    """

    def __init__(self, registry: ServiceRegistry, metrics: Metrics, *, max_concurrent: int = 64) -> None:
        self.registry = registry
        self.metrics = metrics
        self.max_concurrent = max_concurrent
        self._inflight = 0
        self._locks: dict[Path, asyncio.Lock] = {}
        self.opened: set[Path] = set()  # workspaces whose sandbox this process has used
        self._known: tuple[int, frozenset[str]] = (-1, frozenset())

    @property
    def known_tools(self) -> frozenset[str]:
        """The names of the registry's tools now (a call of another name is counted as
        ``unknown`` in the metrics, which keeps their labels bounded). Kept by the tool
        table's version: a tool registered or removed at run time counts at once."""
        version = self.registry.tools_version
        if self._known[0] != version:
            self._known = (version, frozenset(self.registry.names()))
        return self._known[1]

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the global slots. Raises Busy when none is free."""
        self._take_slot()
        try:
            yield
        finally:
            self._inflight -= 1

    def _take_slot(self) -> None:
        if self._inflight >= self.max_concurrent:
            self.metrics.rejected.labels(reason="busy").inc()
            raise Busy(f"Too many concurrent calls (limit {self.max_concurrent}); retry later")
        self._inflight += 1

    def lock(self, workspace: Path | None) -> asyncio.Lock:
        key = workspace or Path("/")
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def forget(self, workspace: Path) -> None:
        self.opened.discard(workspace)

    async def execute(
        self,
        tool: str,
        arguments: dict[str, Any],
        workspace: Path | None,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        known_tools: frozenset[str] | None = None,
        on_output: OutputCallback | None = None,
    ) -> ToolResult:
        """One call, serialized per workspace, counted and logged. Never raises for a tool
        failure (the registry turns those into results); the caller holds a :meth:`slot`.
        ``known_tools`` defaults to :attr:`known_tools` (the registry's tools now)."""
        if workspace is not None:
            # (before the call: one that raises or is cancelled once it started the sandbox
            # leaves it to be stopped with the service all the same)
            self.opened.add(workspace)
        async with self.lock(workspace):
            start = time.perf_counter()
            result = await self.registry.execute(
                tool, arguments, workspace, call_id=call_id, subtask_id=subtask_id, on_output=on_output
            )
            seconds = time.perf_counter() - start
        known = self.known_tools if known_tools is None else known_tools
        label = tool if tool in known else "unknown"
        # The registry logs every call (workspace, tool, call id, outcome, duration);
        # the service adds only the metrics.
        self.metrics.observe(label, result, seconds)
        return result

    def execute_stream(
        self,
        tool: str,
        arguments: dict[str, Any],
        workspace: Path | None,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        known_tools: frozenset[str] | None = None,
    ) -> AsyncIterator[ToolOutput | ToolResult]:
        """:meth:`execute` with the output as it happens (see :mod:`worker.streaming`):
        the call takes a slot now (raises Busy when none is free, before anything is
        streamed) and holds it, and its place in the workspace's order, until it ends,
        even if the reader goes away first."""
        self._take_slot()

        async def run(on_output: OutputCallback) -> ToolResult:
            try:
                return await self.execute(
                    tool,
                    arguments,
                    workspace,
                    call_id=call_id,
                    subtask_id=subtask_id,
                    known_tools=known_tools,
                    on_output=on_output,
                )
            finally:
                self._inflight -= 1

        return stream_call(run)


def result_dict(result: ToolResult) -> dict[str, Any]:
    """``result`` as the JSON object the surfaces return (``ToolResult.to_dict`` without
    its deep copy: the dict is encoded right away and never mutated); ``images`` only
    when there are any."""
    out: dict[str, Any] = {
        "success": result.success,
        "output": result.output,
        "data": result.data,
        "files_changed": result.files_changed,
        "error": result.error,
    }
    if result.images:
        out["images"] = [asdict(i) for i in result.images]
    return out


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON for a response body. Never raises for a tool's output: values
    JSON cannot hold become strings, and text with lone surrogates (bytes that are not
    UTF-8 in a value no tool quoted) is escaped rather than refused."""
    return json_line(value).encode()


#: The text a model reads for one result (:func:`worker.content.tool_text`).
tool_message_content = tool_text


def parse_tool_arguments(tool: str, raw: str | dict[str, Any] | None) -> dict[str, Any] | str:
    """The arguments of an OpenAI tool call as a dict, or an error message for the model
    when the string the model produced is not a JSON object."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, or an int too long to parse
        return (
            f"Error: the arguments for {tool} are not valid JSON ({e}). "
            'Send the arguments as one JSON object, for example {"path": "src/main.py"}.'
        )
    if not isinstance(value, dict):
        return f"Error: the arguments for {tool} must be a JSON object, not {type(value).__name__}."
    return value
