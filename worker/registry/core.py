"""``ToolRegistry`` (Loom Spec 05): register tools, execute calls, hand out schemas.

It is the three jobs of the package put together behind one object: the tool table
(:mod:`.table`), the workspace pool (:mod:`.pool`) and the execution of calls
(:mod:`.execution`, the one place a call's errors are sorted into the two channels). What
it is built from is passed in; :func:`worker.registry.default_registry` builds the
production one from the settings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sandbox.base import ExecControl, OutputCallback, SandboxBackend
from sandbox.capabilities import tunnels

from ..background import BackgroundLimits
from ..result import ToolResult
from ..streaming import MAX_BUFFERED, ToolOutput, stream_call
from ..tool import Tool
from ..tools import builtin_tools
from ..workspace import Workspace
from ..workspace_settings import Configs, Configured, WorkspaceSettings
from .execution import Arguments, Execution
from .pool import RecorderFactory, WorkspacePool
from .table import ToolTable

if TYPE_CHECKING:  # annotations only: each is imported by the code that makes it
    from sandbox.tunnel import Tunnel

    from ..calls import CallJournal
    from ..egress.gateway import EgressGateway
    from ..egress.log import EgressRecord
    from ..harness import SandboxHandle
    from ..tools.catalog_tools import CatalogTools
    from .contract import HasImages, LocalRegistry, ObservesEgress, OpensTunnels, SearchesCatalog


class ToolRegistry:
    """Tools by name, and the workspaces (sandbox + recorder) calls run in.

    ``backend`` gives each workspace directory its sandbox (``DockerBackend`` in
    production, ``LocalProcessBackend`` in unit tests); without one, file and shell
    tools fail with an infrastructure error. ``recorder_factory(root)`` builds the
    change recorder of each workspace (the changelog); the default records nothing, and
    with ``own_recorders`` the recorders it made are closed with the registry. ``tools``
    replaces the built-in tools; ``catalog_tools`` adds the tool catalog's (``tool_search``,
    custom and MCP tools) and is closed with the registry. ``configs``, ``background``,
    ``egress_factory`` and ``journal``: see :class:`~.pool.WorkspacePool` and
    :class:`~.execution.Execution`. Use ``async with`` (or :meth:`aclose`) to close the
    backend's connections.
    """

    def __init__(
        self,
        *,
        backend: SandboxBackend | None = None,
        recorder_factory: RecorderFactory | None = None,
        tools: Iterable[Tool] | None = None,
        configs: Configs | None = None,
        background: BackgroundLimits | None = None,
        own_recorders: bool = False,
        egress_factory: Callable[[], EgressGateway] | None = None,
        journal: CallJournal | None = None,
        catalog_tools: CatalogTools | None = None,
    ) -> None:
        #: The tool table (:class:`~.table.ToolTable`).
        self.table = ToolTable(builtin_tools() if tools is None else tools)
        #: The workspace pool (:class:`~.pool.WorkspacePool`).
        self.pool = WorkspacePool(
            backend,
            recorder_factory=recorder_factory,
            own_recorders=own_recorders,
            configs=configs,
            background=background,
            egress_factory=egress_factory,
        )
        self._execution = Execution(self.table, self.pool, journal)
        self._closers: list[Callable[[], Awaitable[None]]] = []
        #: The tool catalog's side of this registry (``tool_search``, custom and MCP tools).
        self.catalog_tools = catalog_tools
        if catalog_tools is not None:
            catalog_tools.attach(self.table)
            self.add_closer(catalog_tools.aclose)

    # -- what it is made of ---------------------------------------------------------------

    @property
    def backend(self) -> SandboxBackend | None:
        return self.pool.backend

    @property
    def images(self) -> SandboxBackend | None:
        """The engine the image routes pull to: the backend."""
        return self.pool.backend

    @property
    def configs(self) -> Configs | None:
        """Per-workspace settings (``default_registry`` sets them up)."""
        return self.pool.configs

    @property
    def background_limits(self) -> BackgroundLimits:
        return self.pool.background_limits

    @property
    def journal(self) -> CallJournal | None:
        """The history of calls per workspace (:class:`worker.calls.CallJournal`), written
        after every call."""
        return self._execution.journal

    @journal.setter
    def journal(self, journal: CallJournal | None) -> None:
        self._execution.journal = journal

    @property
    def egress(self) -> EgressGateway | None:
        """The egress gateway, once a workspace allowed out was opened."""
        return self.pool.egress

    @property
    def egress_observers(self) -> list[Callable[[EgressRecord], None]]:
        """Told of every egress attempt (the service's metrics); add to it before the
        first workspace is opened."""
        return self.pool.egress_observers

    def add_closer(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Have :meth:`aclose` also await ``closer()`` (e.g. the call journal)."""
        self._closers.append(closer)

    # -- tools ----------------------------------------------------------------------------

    def register(self, tool: Tool) -> None:
        """Add ``tool``. Raises ValueError ("already registered") on a duplicate name."""
        self.table.register(tool)

    def unregister(self, name: str) -> Tool:
        """Remove the tool ``name`` and return it. Raises KeyError when there is none."""
        return self.table.unregister(name)

    def get(self, name: str) -> Tool | None:
        return self.table.get(name)

    def names(self) -> list[str]:
        """Tool names in registration order."""
        return self.table.names()

    @property
    def tools(self) -> list[Tool]:
        return self.table.tools

    @property
    def tools_version(self) -> int:
        """Grows by one with every registration and removal of a tool: a copy of the
        list made at another version is out of date."""
        return self.table.version

    def subscribe_tools(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after every registration and removal of a tool (see
        :meth:`ToolTable.subscribe <.table.ToolTable.subscribe>`). Returns the function
        that unsubscribes it."""
        return self.table.subscribe(callback)

    def all_schemas(self, fmt: str = "openai", *, native: bool = False) -> list[dict[str, Any]]:
        """Every tool's definition in registration order (``fmt``: openai | anthropic | mcp);
        the vendors' native tools only with ``native`` (see :meth:`ToolTable.all_schemas`).

        Raises ValueError for an unknown format.
        """
        return self.table.all_schemas(fmt, native=native)

    def tools_for_subtask(self, subtask: object, fmt: str = "openai") -> list[dict[str, Any]]:
        """The schemas a subtask may use (see :meth:`ToolTable.tools_for_subtask
        <.table.ToolTable.tools_for_subtask>`)."""
        return self.table.tools_for_subtask(subtask, fmt)

    # -- workspaces -----------------------------------------------------------------------

    async def workspace(self, path: Path | str) -> Workspace:
        """The cached :class:`Workspace` of directory ``path`` (see
        :meth:`WorkspacePool.workspace <.pool.WorkspacePool.workspace>`). Raises ToolError
        when the directory does not exist, SandboxUnavailableError when no backend is
        configured or the sandbox cannot start."""
        return await self.pool.workspace(path)

    def egress_status(self, path: Path | str, *, limit: int = 100, verdict: str | None = None) -> dict[str, Any]:
        """A workspace's egress: its allowlist, whether this process serves its gateway,
        its newest log records. Raises ToolError, SettingsError, ValueError."""
        return self.pool.egress_status(path, limit=limit, verdict=verdict)

    async def workspace_settings(self, path: Path | str) -> tuple[WorkspaceSettings, dict[str, Any]]:
        """A workspace's own settings and the effective ones. Raises ToolError,
        SettingsError, ValueError (no per-workspace settings here)."""
        return await self.pool.workspace_settings(path)

    async def configure_workspace(self, path: Path | str, changes: dict[str, Any]) -> Configured:
        """Change a workspace's settings after checking every value (see
        :meth:`WorkspacePool.configure_workspace <.pool.WorkspacePool.configure_workspace>`).
        Raises SettingsError naming the field, ToolError, ValueError,
        DaemonUnavailableError, OSError."""
        return await self.pool.configure_workspace(path, changes)

    async def check_settings(self, new: WorkspaceSettings, before: WorkspaceSettings | None = None) -> None:
        """Every check of a workspace's new settings. Raises SettingsError naming the
        field, DaemonUnavailableError, ValueError."""
        await self.pool.check_settings(new, before)

    def sandbox(self, path: Path | str) -> SandboxHandle:
        """The harness API of workspace ``path``'s sandbox (:class:`worker.harness.
        SandboxHandle`): commands with any stdin, cwd, env, user and size, and files
        anywhere the sandbox's user may read or write, as bytes. Not a tool: no model's
        tool list offers it. Nothing starts until its first call."""
        from ..harness import SandboxHandle

        return SandboxHandle(self, path)

    async def open_tunnel(self, path: Path | str, port: int) -> Tunnel:
        """A connection to ``port`` on the loopback of workspace ``path``'s sandbox (the
        port proxy's). Raises AgentError (``connection_refused``: nothing listens),
        SandboxError, ToolError (no such directory)."""
        return await tunnels((await self.workspace(path)).sandbox).open_tunnel(port)

    async def stop(self, path: Path | str) -> bool:
        """Forget the workspace and stop its sandbox. Returns False if none was running."""
        return await self.pool.stop(path)

    async def aclose(self) -> None:
        """Close what was added with :meth:`add_closer` (the catalog, the journal), the
        egress gateway, the recorders this registry owns and the backend's streams."""
        closers, self._closers = self._closers, []
        for close in closers:
            await close()
        await self.pool.aclose()

    async def __aenter__(self) -> ToolRegistry:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- execution ------------------------------------------------------------------------

    async def execute(
        self,
        name: str,
        arguments: Arguments,
        workspace: Path | str | None = None,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ToolResult:
        """Run one tool call. Never raises (except on cancellation); see
        :mod:`worker.registry.execution` for how each failure is reported. ``on_output``
        gets a command's output as it happens (``shell_execute``), and ``control``
        signals that command. A call without ``call_id`` gets a new one
        (``call_<16 hex>``), so that every call can be found, diffed and undone by its id."""
        return await self._execution.execute(
            name,
            arguments,
            workspace,
            call_id=call_id,
            subtask_id=subtask_id,
            on_output=on_output,
            control=control,
        )

    def execute_stream(
        self,
        name: str,
        arguments: Arguments,
        workspace: Path | str | None = None,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        max_buffered: int = MAX_BUFFERED,
        control: ExecControl | None = None,
    ) -> AsyncIterator[ToolOutput | ToolResult]:
        """:meth:`execute` as an async iterator: a command's output as it happens
        (:class:`~worker.streaming.ToolOutput` chunks; only ``shell_execute`` has any),
        then the :class:`ToolResult`, last. Never raises for the call (see
        :meth:`execute`). The call starts at once; a reader that stops early does not
        stop it; see :mod:`worker.streaming` for what waits in memory (``max_buffered``).
        ``control`` signals the command (see :meth:`execute`). Call it with an event
        loop running."""

        def run(on_output: OutputCallback) -> Awaitable[ToolResult]:
            return self.execute(
                name,
                arguments,
                workspace,
                call_id=call_id,
                subtask_id=subtask_id,
                on_output=on_output,
                control=control,
            )

        return stream_call(run, max_buffered=max_buffered)


def _contract(r: ToolRegistry) -> tuple[LocalRegistry, SearchesCatalog, HasImages, OpensTunnels, ObservesEgress]:
    """(Never called: mypy checks the registry against the service's contract here.)"""
    return r, r, r, r, r
