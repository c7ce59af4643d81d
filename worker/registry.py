"""``ToolRegistry`` (Loom Spec 05): register tools, execute calls, hand out schemas.

:meth:`ToolRegistry.execute` is the one place a call's errors are sorted into the two
channels, and it never raises:

==================================  ==========================================================
what happened                       ToolResult
==================================  ==========================================================
unknown tool                        success=false, "Unknown tool 'x'. Available tools: ..."
arguments fail validation           success=false, "Invalid arguments for t: 'field': problem"
path / command refused by policy    success=false, "Safety violation: ..."
ToolError / AgentError              success=false, the message (e.g. "File not found: a.txt")
the call's deadline passed          success=false, "t timed out after Ns"
sandbox unavailable / lost / broken success=false, "Sandbox unavailable (infrastructure ...",
changelog storage failed            data["error_kind"] == "infrastructure"
anything else (a bug)               success=false, "Internal error ...", error_kind "internal"
==================================  ==========================================================
"""

from __future__ import annotations

import asyncio
import json
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sandbox.base import ExecControl, OutputCallback, SandboxBackend
from sandbox.errors import (
    AgentError,
    ImageNotFoundError,
    ImageUnusableError,
    PathEscapeError,
    PathNotFoundError,
    ProtocolError,
    SandboxTimeoutError,
    SandboxUnavailableError,
)
from sandbox.logs import get_logger

from .background import Background, BackgroundIndex, BackgroundLimits
from .changelog.errors import ChangelogStorageError
from .result import ToolResult
from .streaming import MAX_BUFFERED, ToolOutput, stream_call
from .tool import SCHEMA_FORMATS, Tool, ToolContext, ToolError
from .tools import BUILTIN_NAMES, builtin_tools
from .workspace import ChangeRecorder, Workspace
from .workspace_settings import (
    Caps,
    Configs,
    Configured,
    SettingsError,
    SettingsStore,
    WorkspaceSettings,
    check,
    parse,
)

if TYPE_CHECKING:
    from .calls import CallJournal

log = get_logger("worker.registry")

RecorderFactory = Callable[[Path], ChangeRecorder]

#: The tools a subtask gets when it names none it may use.
CORE_TOOLS = BUILTIN_NAMES


def _infra(kind: str, err: Exception) -> ToolResult:
    # A missing or unusable image does not go away by itself: "retry later" would only
    # make the model repeat the call. It is still the operator's problem, not the call's.
    lasting = isinstance(err, ImageNotFoundError | ImageUnusableError)
    advice = "the workspace's image must be fixed by its operator" if lasting else "retry later"
    return ToolResult.fail(
        f"{kind} (infrastructure failure, not a problem with the tool call; {advice}): {err}",
        data={"error_kind": "infrastructure", "exception": type(err).__name__},
    )


def _agent_message(err: AgentError) -> str:
    msg = str(err)
    if isinstance(err, PathEscapeError):
        return f"Safety violation: {msg}"
    if isinstance(err, PathNotFoundError) and "not found" not in msg:
        return "Path not found: " + msg.removeprefix("Not found: ")
    return msg


def _field(subtask: object, *names: str) -> Any:
    for name in names:
        value = subtask.get(name) if isinstance(subtask, Mapping) else getattr(subtask, name, None)
        if value is not None:
            return value
    return None


class ToolRegistry:
    """Tools by name, and the workspaces (sandbox + recorder) calls run in.

    ``backend`` gives each workspace directory its sandbox (``DockerBackend`` in
    production, ``LocalProcessBackend`` in unit tests); without one, file and shell
    tools fail with an infrastructure error. ``recorder_factory(root)`` builds the
    change recorder of each workspace (the changelog); the default records nothing.
    Use ``async with`` (or :meth:`aclose`) to close the backend's connections.
    """

    def __init__(
        self,
        *,
        backend: SandboxBackend | None = None,
        recorder_factory: RecorderFactory | None = None,
        tools: Iterable[Tool] | None = None,
        configs: Configs | None = None,
        background: BackgroundLimits | None = None,
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self.backend = backend
        #: Limits of background processes (``shell_execute`` with ``background``/``yield_ms``).
        self.background_limits = background or BackgroundLimits()
        #: Per-workspace settings (``default_registry`` sets them up): each workspace's
        #: sandbox is made with its own spec, re-read when its settings file changes.
        self.configs = configs
        self._recorder_factory = recorder_factory
        # A caller-supplied factory owns what it makes (it may share one changelog between
        # registries); recorders made by default_registry's own factory are closed here.
        self._recorder_shared = True
        self._workspaces: dict[Path, Workspace] = {}  # by real path: the source of truth
        # The same workspaces by the caller's own spelling of an absolute path, so a call
        # does not resolve it again (expanduser + realpath: a few lstat calls each time).
        self._by_arg: dict[str, Workspace] = {}
        self._ws_lock = asyncio.Lock()
        self._closers: list[Callable[[], Awaitable[None]]] = []
        #: The tool catalog's side of this registry (``worker.tools.catalog_tools``), if attached.
        self.catalog_tools: Any = None
        #: Makes the egress gateway (``worker.egress``) the first time a workspace that
        #: may reach the network is opened; ``default_registry`` sets it.
        self.egress_factory: Callable[[], Any] | None = None
        self.egress: Any = None
        #: Told of every egress attempt (the service's metrics), once the gateway exists.
        self.egress_observers: list[Callable[[Any], None]] = []
        self._egress_roots: set[Path] = set()
        #: The history of calls per workspace (:class:`worker.calls.CallJournal`), written
        #: after every call; ``default_registry`` sets it.
        self.journal: CallJournal | None = None
        for tool in builtin_tools() if tools is None else tools:
            self.register(tool)

    # -- tools ---------------------------------------------------------------------------

    def register(self, tool: Tool) -> None:
        """Add ``tool``. Raises ValueError ("already registered") on a duplicate name."""
        if tool.name in self._tools:
            raise ValueError(f"Tool '{tool.name}' is already registered")
        self._tools[tool.name] = tool

    def add_closer(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Have :meth:`aclose` also await ``closer()`` (e.g. the tool catalog's database)."""
        self._closers.append(closer)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Tool names in registration order."""
        return list(self._tools)

    @property
    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def all_schemas(self, fmt: str = "openai") -> list[dict[str, Any]]:
        """Every tool's definition in registration order (``fmt``: openai | anthropic | mcp).

        Raises ValueError for an unknown format.
        """
        if fmt not in SCHEMA_FORMATS:
            raise ValueError(f"unknown schema format {fmt!r} (openai, anthropic, mcp)")
        return [t.schema(fmt) for t in self._tools.values()]

    def tools_for_subtask(self, subtask: object, fmt: str = "openai") -> list[dict[str, Any]]:
        """The schemas a subtask may use, in registration order. Deterministic:

        1. the registered tools the subtask names in ``tools`` (or ``tool_names``);
           names that are not registered are ignored;
        2. if that leaves none, the core set (the six built-ins that are registered);
        3. minus every tool named in ``excluded_tools`` (or ``exclude_tools``).

        ``subtask`` may be a mapping or any object with those attributes (or None).
        """
        wanted = _field(subtask, "tools", "tool_names") if subtask is not None else None
        excluded = _field(subtask, "excluded_tools", "exclude_tools") if subtask is not None else None
        wanted_set = {str(n) for n in (wanted or [])} & set(self._tools)
        if not wanted_set:
            wanted_set = set(CORE_TOOLS) & set(self._tools)
        wanted_set -= {str(n) for n in (excluded or [])}
        return [t.schema(fmt) for name, t in self._tools.items() if name in wanted_set]

    # -- workspaces ----------------------------------------------------------------------

    async def workspace(self, path: Path | str) -> Workspace:
        """The cached :class:`Workspace` of directory ``path`` (by real path).

        An absolute ``path`` is remembered as given, so the next call with the same
        spelling skips resolving it; a relative one (or ``~``) is resolved on every call,
        since its meaning follows the working directory (or HOME). A symlink retargeted
        later keeps its first workspace until :meth:`stop` or :meth:`aclose`.

        Raises ToolError when the directory does not exist, SandboxUnavailableError when
        no backend is configured or the sandbox cannot start.
        """
        key = path if isinstance(path, str) else str(path)
        ws = self._by_arg.get(key)
        if ws is not None:
            if self.configs is not None and self.configs.store.changed(ws.root):
                return await self._reconfigure(ws.root)
            if ws.root in self._egress_roots:
                await self._serve_egress(ws.root)
            return ws
        root = Path(key).expanduser().resolve()
        ws = self._workspaces.get(root)
        if ws is not None and self.configs is not None and self.configs.store.changed(root):
            ws = await self._reconfigure(root)
        if ws is None:
            if self.backend is None:
                raise SandboxUnavailableError("No sandbox backend is configured for this registry")
            if not root.is_dir():
                raise ToolError(f"Workspace directory not found: {root}")
            async with self._ws_lock:
                ws = self._workspaces.get(root)
                if ws is None:
                    await self._apply_settings(root)
                    sandbox = await self.backend.get(root)
                    recorder = self._recorder_factory(root) if self._recorder_factory else None
                    ws = Workspace(root, sandbox, recorder, self._background(root))
                    self._workspaces[root] = ws
        if key.startswith("/") and self._workspaces.get(root) is ws:  # (not stopped meanwhile)
            self._by_arg[key] = ws
        if root in self._egress_roots:
            await self._serve_egress(root)
        return ws

    async def _serve_egress(self, root: Path) -> None:
        """Make sure the egress gateway of a workspace allowed out is served (by this
        process unless another one does). A gateway that cannot serve is logged, not
        raised: the tools work without it, the sandbox's connections fail."""
        if self._egress_gateway() is None:
            return
        try:
            await self.egress.serve(root)
        except OSError as e:
            log.warning("egress.serve_failed", workspace=str(root), error=repr(e))

    def _egress_gateway(self) -> Any:
        if self.egress is None and self.egress_factory is not None:
            self.egress = self.egress_factory()
            self.egress.observers.extend(self.egress_observers)
            self.add_closer(self.egress.aclose)
        return self.egress

    def egress_status(self, path: Path | str, *, limit: int = 100, verdict: str | None = None) -> dict[str, Any]:
        """A workspace's egress: its allowlist now, whether this process serves its
        gateway, and its newest log records (newest first). Raises ToolError (no such
        directory), SettingsError (its settings file is not valid), ValueError (no
        per-workspace settings here)."""
        from .egress.log import EgressLog

        root = self._settings_root(path)
        assert self.configs is not None
        policy = self.configs.policy(root)
        records = EgressLog(self.configs.store.data_dir).read(root, limit=limit, verdict=verdict)
        return {
            "policy": list(policy.entries),
            "enabled": bool(policy),
            "serving": bool(self.egress is not None and self.egress.serving(root)),
            "entries": records[::-1],
        }

    def _background(self, root: Path) -> Background:
        """The workspace's background processes, recorded on the host next to its
        changelog (in memory only for a registry without a data directory)."""
        from .changelog.recorder import workspace_dir

        if self.configs is not None:
            state = workspace_dir(self.configs.store.data_dir, root)
        else:
            state = Path(tempfile.gettempdir()) / "loom-worker-background" / workspace_dir(Path("/"), root).name
        return Background(BackgroundIndex(state), self.background_limits)

    async def _apply_settings(self, root: Path) -> bool:
        """Give the backend ``root``'s spec (its settings over the defaults). True when it
        changed. Raises SandboxUnavailableError for a settings file that is not valid."""
        configure = getattr(self.backend, "configure", None)
        if self.configs is None or configure is None:
            return False
        try:
            spec = self.configs.spec(root)
        except (SettingsError, OSError) as e:
            raise SandboxUnavailableError(f"The workspace's settings cannot be used: {e}") from e
        if spec.egress_dir:
            self._egress_roots.add(root)
            if self._egress_gateway() is not None:
                # The directory must exist before a container can mount it.
                await asyncio.to_thread(self.egress.prepare, root)
        else:
            self._egress_roots.discard(root)
        return bool(await configure(root, spec))

    async def _reconfigure(self, root: Path) -> Workspace:
        """The workspace's settings file changed (here or in another process): from now
        on its sandbox is made with the new spec; the changelog stays."""
        async with self._ws_lock:
            old = self._workspaces.get(root)
            if not await self._apply_settings(root) and old is not None:
                return old
            assert self.backend is not None
            sandbox = await self.backend.get(root)
            recorder: ChangeRecorder | None
            if old is not None:
                recorder = old.recorder
            else:
                recorder = self._recorder_factory(root) if self._recorder_factory else None
            ws = Workspace(root, sandbox, recorder, old.background if old is not None else self._background(root))
            self._workspaces[root] = ws
            for key in [k for k, v in self._by_arg.items() if v is old]:
                self._by_arg[key] = ws
            return ws

    async def workspace_settings(self, path: Path | str) -> tuple[WorkspaceSettings, dict[str, Any]]:
        """A workspace's own settings and the effective ones its sandbox is made with.
        Raises ToolError (no such directory), SettingsError (the file is not valid),
        ValueError when this registry has no per-workspace settings."""
        root = self._settings_root(path)
        assert self.configs is not None
        return self.configs.store.load(root), self.configs.effective(root)

    async def configure_workspace(self, path: Path | str, changes: dict[str, Any]) -> Configured:
        """Change a workspace's settings (a value of None removes that override) after
        checking every value; the sandbox is recreated with them at its next call (the
        workspace's files are kept).

        Raises SettingsError naming the refused field (nothing is stored then), ToolError
        (no such directory), ValueError when this registry has no per-workspace settings,
        DaemonUnavailableError when the engine must be asked about a runtime and does not
        answer, OSError when the settings cannot be written.
        """
        root = self._settings_root(path)
        assert self.configs is not None
        before = self.configs.store.load(root)
        new = parse(changes, before)
        await self.check_settings(new, before)
        old_spec = self.configs.spec(root, before)
        spec = self.configs.spec(root, new)
        egress_changed = self.configs.policy(root, before) != self.configs.policy(root, new)
        if new != before:
            self.configs.store.save(root, new)
        if root in self._workspaces:
            await self._reconfigure(root)
        return Configured(new, self.configs.effective(root, new), spec != old_spec, egress_changed)

    async def check_settings(self, new: WorkspaceSettings, before: WorkspaceSettings | None = None) -> None:
        """Every check of ``new`` (a workspace's settings, replacing ``before``): the
        operator's caps, the CA file, and what only the engine knows: a runtime it has, an
        image it holds or pulls now as LOOM_PULL says (one that cannot be had would fail
        every later call of the workspace, so it is refused here, naming it and the
        registry's answer). Values unchanged from ``before`` are not asked about again.

        Raises SettingsError naming the field, DaemonUnavailableError when the engine must
        be asked and does not answer, ValueError when this registry has no settings.
        """
        if self.configs is None:
            raise ValueError("this registry has no per-workspace settings (use default_registry)")
        runtimes = None
        ask = getattr(self.backend, "runtimes", None)
        if new.runtime is not None and ask is not None:
            runtimes = await ask()
        check(new, self.configs.caps, runtimes)
        ensure_image = getattr(self.backend, "ensure_image", None)  # pulls it as LOOM_PULL says
        if new.image is not None and ensure_image is not None and (before is None or new.image != before.image):
            try:
                await ensure_image(new.image)
            except ImageNotFoundError as e:  # ImagePullError too: the image, the registry and its answer
                raise SettingsError("image", str(e)) from None

    def _settings_root(self, path: Path | str) -> Path:
        if self.configs is None:
            raise ValueError("this registry has no per-workspace settings (use default_registry)")
        root = Path(path).expanduser().resolve()
        if not root.is_dir():
            raise ToolError(f"Workspace directory not found: {root}")
        return root

    async def stop(self, path: Path | str) -> bool:
        """Forget the workspace and stop its sandbox. Returns False if none was running."""
        root = Path(path).expanduser().resolve()
        ws = self._workspaces.pop(root, None)
        for key in [k for k, v in self._by_arg.items() if v is ws or v.root == root]:
            del self._by_arg[key]
        self._egress_roots.discard(root)
        if self.egress is not None:
            await self.egress.release(root)
        return await self.backend.stop(root) if self.backend is not None else False

    async def aclose(self) -> None:
        """Close every workspace's recorder (the changelog store) and the backend's streams."""
        workspaces = list(self._workspaces.values())
        self._workspaces.clear()
        self._by_arg.clear()
        closers, self._closers = self._closers, []
        for close in closers:
            await close()
        for ws in workspaces:
            closer = getattr(ws.recorder, "aclose", None)
            if closer is not None and not self._recorder_shared:
                await closer()
        if self.backend is not None:
            await self.backend.aclose()

    async def __aenter__(self) -> ToolRegistry:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- execution -----------------------------------------------------------------------

    async def execute(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | None,
        workspace: Path | str | None = None,
        *,
        call_id: str | None = None,
        subtask_id: str | None = None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ToolResult:
        """Run one tool call. Never raises (except on cancellation); see the module table.
        ``on_output`` gets a command's output as it happens (``shell_execute``), and
        ``control`` signals that command (a Ctrl-C passed on).
        A call without ``call_id`` gets a new one (``call_<16 hex>``), so that every call
        can be found, diffed and undone by its id."""
        if call_id is None:
            call_id = "call_" + secrets.token_hex(8)
        started = time.perf_counter()
        result = await self._execute(name, arguments, workspace, call_id, subtask_id, on_output, control)
        result = result.capped()
        duration_ms = (time.perf_counter() - started) * 1000.0
        kind = (result.data or {}).get("error_kind") if not result.success else None
        log.info(
            "tool.call",
            tool=name,
            workspace=str(workspace) if workspace is not None else None,
            call_id=call_id,
            subtask_id=subtask_id,
            success=result.success,
            error_kind=kind,
            error=result.error[:200] if result.error else None,
            duration_ms=round(duration_ms, 3),
        )
        if self.journal is not None and workspace is not None:
            ws = self._by_arg.get(workspace if isinstance(workspace, str) else str(workspace))
            self.journal.record(
                workspace,
                name,
                arguments,
                result,
                duration_ms,
                call_id=call_id,
                subtask_id=subtask_id,
                root=None if ws is None else ws.root,
            )
        return result

    def execute_stream(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | None,
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

    async def _execute(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | None,
        workspace: Path | str | None,
        call_id: str | None,
        subtask_id: str | None,
        on_output: OutputCallback | None = None,
        control: ExecControl | None = None,
    ) -> ToolResult:
        tool = self._tools.get(name)
        if tool is None:
            return ToolResult.fail(f"Unknown tool '{name}'. Available tools: {', '.join(self._tools)}")
        if isinstance(arguments, str):
            # Models send arguments as a JSON string in OpenAI's format.
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                return ToolResult.fail(f"Invalid arguments for {name}: not valid JSON ({e})")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, Mapping):
            return ToolResult.fail(
                f"Invalid arguments for {name}: expected a JSON object, got {type(arguments).__name__}"
            )
        deadline = tool.timeout
        try:
            args = tool.validate(dict(arguments))
            deadline = tool.deadline(args)
            async with asyncio.timeout(deadline):
                ws = None
                if workspace is not None:
                    ws = await self.workspace(workspace)
                elif tool.needs_workspace:
                    raise ToolError(f"No workspace: {name} needs a workspace directory, and none was given")
                ctx = ToolContext(
                    workspace=ws, call_id=call_id, subtask_id=subtask_id, on_output=on_output, control=control
                )
                return await tool.fn(args, ctx)
        except ToolError as e:
            return ToolResult.fail(e.message, data=e.data)
        except AgentError as e:
            return ToolResult.fail(_agent_message(e), data={"error_code": e.code})
        except SandboxTimeoutError as e:
            return _infra("Sandbox did not answer in time", e)
        except SandboxUnavailableError as e:
            return _infra("Sandbox unavailable", e)
        except ProtocolError as e:
            return _infra("Sandbox protocol error", e)
        except ChangelogStorageError as e:
            # Recorded before writing, so the workspace was not changed.
            return _infra("Changelog storage failed; nothing was changed", e)
        except TimeoutError:
            return ToolResult.fail(f"{name} timed out after {deadline:g}s", data={"timed_out": True})
        except Exception as e:  # a bug in a tool must not take the caller down
            log.exception("tool.internal_error", tool=name, call_id=call_id)
            return ToolResult.fail(
                f"Internal error in {name}: {type(e).__name__}: {e}", data={"error_kind": "internal"}
            )


def default_registry(
    settings: Any = None,
    *,
    recorder_factory: RecorderFactory | None = None,
    changelog: bool = True,
    catalog: bool | None = None,
    **settings_overrides: Any,
) -> ToolRegistry:
    """The six built-in tools on the Docker sandbox backend, configured by ``Settings``,
    recording every change in each workspace's changelog under ``settings.data_dir``
    (``changelog=False`` or an explicit ``recorder_factory`` replaces that).

    With the catalog (``catalog``, default ``settings.catalog``) it also has
    ``tool_search``, the custom YAML tools and the configured MCP servers' tools (see
    :mod:`worker.tools.catalog_tools`); the catalog database opens on the first search.

    ``settings_overrides`` are ``worker.settings.Settings`` fields (``image="..."``,
    ``runtime="runsc"``). No daemon is contacted until the first call. Use as
    ``async with default_registry() as registry:``.
    """
    from sandbox.docker import DockerBackend  # imported lazily: unit tests run without Docker
    from sandbox.spec import SandboxSpec

    from .settings import Settings

    if settings is None:
        settings = Settings(**settings_overrides)
    elif settings_overrides:
        settings = settings.model_copy(update=settings_overrides)
    backend = DockerBackend(SandboxSpec(**settings.sandbox_spec_kwargs()), base_url=settings.docker_host)
    own_recorders = False
    if recorder_factory is None and changelog:
        # Every change is recorded (Spec 11) unless the caller opts out: the changelog of
        # each workspace lives under settings.data_dir, outside the workspace.
        from .changelog import Changelog

        data_dir, limits = settings.data_dir, settings.changelog_limits()

        def recorder_factory(root: Path) -> ChangeRecorder:
            return Changelog.open(data_dir, root, limits=limits)

        own_recorders = True
    from .egress.setup import egress_parts

    egress_default, socket_dir, make_gateway = egress_parts(settings)
    configs = Configs(
        SettingsStore(settings.data_dir),
        settings.sandbox_spec_kwargs(),
        Caps.from_settings(settings),
        egress_default=egress_default,
        egress_socket_dir=socket_dir,
    )
    bg_limits = BackgroundLimits(
        max_processes=settings.max_processes,
        timeout=settings.process_timeout,
        max_timeout=settings.max_process_timeout,
        linger=settings.process_linger,
    )
    registry = ToolRegistry(backend=backend, recorder_factory=recorder_factory, configs=configs, background=bg_limits)
    from .calls import CallJournal

    journal = registry.journal = CallJournal(settings.data_dir, max_bytes=settings.call_journal_bytes)

    async def close_journal() -> None:
        journal.close()

    registry.add_closer(close_journal)
    registry.egress_factory = lambda: make_gateway(configs)
    registry._recorder_shared = not own_recorders
    if catalog if catalog is not None else settings.catalog:
        # tool_search, the custom YAML tools and the configured MCP servers' tools.
        from .tools.catalog_tools import CatalogTools, install

        install(registry, CatalogTools.from_settings(settings))
    return registry
