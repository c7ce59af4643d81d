"""The tool catalog inside a :class:`~worker.registry.ToolRegistry` (issue 6).

A :class:`CatalogTools` given to a registry (``ToolRegistry(catalog_tools=...)``) adds to
its tool table:

- ``tool_search`` (a builtin, no workspace needed): searches the catalog and returns only
  tools this registry can run *for this call* (registered here; without a workspace,
  only tools that need none);
- each custom YAML tool, under its own name (catalog id ``custom:<name>``): run in the
  workspace sandbox (argv, parameters never interpolated into shell text), serialized
  with the workspace's other mutations and bracketed by the change recorder, so the
  changelog covers it and ``files_changed`` is filled;
- each indexed tool of a configured MCP server as ``mcp__<server>__<tool>`` (catalog id
  ``mcp:<server>:<tool>``). A streamable HTTP server is called directly; a stdio server
  is started **inside the workspace sandbox** for each call (and recorded like a shell
  command, since it can change files).

Indexing is lazy: the first ``tool_search`` indexes the registry's builtin tools, the
custom tools and the MCP servers never indexed before (HTTP ones always; stdio ones when
that call has a workspace, whose sandbox runs them). MCP tools found then are registered
on the spot. ``loom-worker tools index [--workspace DIR]`` (:meth:`CatalogTools.refresh`)
re-indexes everything.

Load problems (a bad YAML file, a bad server entry, a name clash) are logged, kept in
:attr:`CatalogTools.errors`, shown by the CLI and in the catalog's source status; they
never stop the other tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import shlex
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import jsonschema
from pydantic import BaseModel, ConfigDict

from sandbox.errors import SandboxError, SandboxLostError
from sandbox.logs import get_logger

from ..catalog import IndexReport, db_path, load_mcp_config, mcp_file, open_catalog, tools_dir
from ..catalog.custom import CustomTool, CustomToolError, StrictValidator, load_custom_tools
from ..catalog.index import ToolDescriptor
from ..catalog.mcp_source import MCPServerConfig, MCPSource, MCPSourceError, describe_result, index_mcp_sources
from ..catalog.sandbox_stdio import SandboxStdioTransport
from ..catalog.search import Catalog, InvalidQueryError
from ..catalog.tool_search import DESCRIPTION as SEARCH_DESCRIPTION
from ..catalog.tool_search import NAME as SEARCH_NAME
from ..catalog.tool_search import ToolSearchArgs, tool_search
from ..changelog.intents import release
from ..result import ToolResult
from ..tool import Tool, ToolContext, ToolError, non_finite_message

if TYPE_CHECKING:
    from ..settings import Settings
from ..workspace import Workspace, scan_token

log = get_logger("worker.catalog")

#: Added to a custom tool's / MCP server's own timeout for the registry's call deadline.
DEADLINE_SLACK = 15.0
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


class ToolTableLike(Protocol):
    """What the catalog needs of a registry's tool table: to look a tool up, to register
    one, to list them (:class:`worker.registry.ToolTable` and
    :class:`~worker.registry.ToolRegistry` are such tables). Declared here so that the
    catalog does not depend on the registry that is built with it."""

    def get(self, name: str) -> Tool | None: ...

    def register(self, tool: Tool) -> None: ...

    @property
    def tools(self) -> list[Tool]: ...


class JsonArgs(BaseModel):
    """Arguments of a tool described by a JSON Schema rather than a pydantic model."""

    model_config = ConfigDict(extra="forbid")

    values: dict[str, Any]


@dataclass(frozen=True)
class SchemaTool(Tool):
    """A tool whose parameters are a JSON Schema (custom and MCP tools). ``check``
    validates the arguments (raising ValueError with a message for the model)."""

    json_schema: dict[str, Any] = field(default_factory=dict)
    check: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        # A JSON Schema's "number" admits inf and NaN once Python's json has read
        # Infinity or 1e309; no tool means them, and a JSON client could not send them.
        bad = non_finite_message(self.name, arguments)
        if bad is not None:
            raise ToolError(bad)
        try:
            values = self.check(arguments) if self.check is not None else arguments
        except ValueError as e:
            raise ToolError(f"Invalid arguments for {self.name}: {e}") from None
        return JsonArgs(values=values)

    def parameters(self) -> dict[str, Any]:
        return copy.deepcopy(self.json_schema)


def mcp_tool_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>``, reduced to what function-calling APIs accept (64 chars)."""
    return _UNSAFE_NAME.sub("_", f"mcp__{server}__{tool}")[:64]


def _schema_checker(schema: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
        validator: jsonschema.Draft202012Validator | None = StrictValidator(schema)
    except jsonschema.SchemaError:
        validator = None  # the server's schema is broken: let the server judge the arguments

    def check(args: dict[str, Any]) -> dict[str, Any]:
        if validator is not None:
            errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
            if errors:
                where = ".".join(str(p) for p in errors[0].path) or "arguments"
                raise ValueError(f"'{where}': {errors[0].message}")
        return args

    return check


@contextlib.asynccontextmanager
async def recorded(ws: Workspace, *, tool: str, command: str, ctx: ToolContext) -> AsyncIterator[list[str]]:
    """Run the body as a workspace mutation: under the workspace's mutation lock, between
    the recorder's ``before_shell`` and ``after_shell`` (like ``Workspace.run_shell``).
    Yields the list that receives the changed paths once the body is done."""
    changed: list[str] = []
    # The workspace offers run_shell but no public "bracket anything" method; its lock is
    # what keeps a concurrent write out of this call's change set.
    async with ws.mutating():
        ws.forget(None)  # the command may change any file
        intent = {"tool": tool, "command": command, "call_id": ctx.call_id, "subtask_id": ctx.subtask_id}
        token = await ws.recorder.before_shell(ws.sandbox, intent=intent)

        async def after() -> list[str]:
            return await ws.recorder.after_shell(
                ws.sandbox, token, tool=tool, command=command, call_id=ctx.call_id, subtask_id=ctx.subtask_id
            )

        try:
            yield changed
        except (SandboxError, asyncio.CancelledError):
            # No sandbox to look at: the intent is left to the next use of the changelog,
            # which records what changed as this call's.
            st = scan_token(token)
            release(st.intent if st is not None else None)
            raise
        except Exception:
            with contextlib.suppress(Exception):  # record what a failed call changed anyway
                await after()
            raise
        changed.extend(sorted(set(await after())))


def _infra(message: str, err: Exception) -> ToolResult:
    return ToolResult.fail(
        f"{message} (infrastructure failure, not a problem with the tool call; retry later): {err}",
        data={"error_kind": "infrastructure", "exception": type(err).__name__},
    )


class CatalogTools:
    """The catalog side of one registry: which tools it added and how to index them.

    ``catalog`` is a :class:`Catalog` or a function opening one on first use (so a
    registry that never searches never creates the database); ``db_file`` (when given)
    lets :meth:`attach` register MCP tools indexed earlier without creating it.
    """

    def __init__(
        self,
        catalog: Catalog | Callable[[], Catalog],
        *,
        custom_tools: Sequence[CustomTool] = (),
        mcp_servers: Sequence[MCPServerConfig] = (),
        errors: dict[str, str] | None = None,
        db_file: Path | None = None,
    ) -> None:
        self._catalog = catalog if isinstance(catalog, Catalog) else None
        self._opener = None if isinstance(catalog, Catalog) else catalog
        self._db_file = db_file
        self.custom_tools = list(custom_tools)
        self.mcp_servers = {s.name: s for s in mcp_servers}
        self.errors: dict[str, str] = dict(errors or {})
        self.ids: dict[str, str] = {}  # registry name -> catalog id, for tools added here
        self.names: dict[str, str] = {}  # catalog id -> registry name
        self._indexed = False
        self._stdio_pending: set[str] = set()
        self._lock = asyncio.Lock()
        self._http_sources: dict[str, MCPSource] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> CatalogTools:
        """Custom tools and MCP servers from the configured files; the catalog in the data dir."""
        loaded = load_custom_tools(tools_dir(settings))
        errors = {f"custom:{f}": e for f, e in loaded.errors.items()}
        servers: list[MCPServerConfig] = []
        try:
            servers, bad = load_mcp_config(mcp_file(settings))
            errors.update({f"mcp:{n}": e for n, e in bad.items()})
        except ValueError as e:
            errors["mcp"] = str(e)
        return cls(
            lambda: open_catalog(settings),
            custom_tools=loaded.tools,
            mcp_servers=servers,
            errors=errors,
            db_file=db_path(settings),
        )

    # -- the catalog --------------------------------------------------------------------

    def catalog(self) -> Catalog:
        """The catalog, opened on first use. Raises sqlite3/OS errors when it cannot be opened."""
        if self._catalog is None:
            assert self._opener is not None
            self._catalog = self._opener()
        return self._catalog

    async def aclose(self) -> None:
        if self._catalog is not None and self._opener is not None:  # only what this object opened
            await self._catalog.aclose()
            self._catalog = None

    # -- registration -------------------------------------------------------------------

    def attach(self, registry: ToolTableLike) -> None:
        """Register ``tool_search``, the custom tools and the MCP tools indexed so far in
        ``registry`` (a registry's tool table; :class:`~worker.registry.ToolRegistry` does
        it with the ``catalog_tools`` it is given). Raises sqlite/OS errors when the
        catalog database exists and cannot be read."""
        for key, why in self.errors.items():
            log.warning("catalog.load_error", source=key, error=why)
        self._register(registry, self._search_tool(registry))
        for ct in self.custom_tools:
            self._register(registry, self._custom_tool(ct), catalog_id=f"custom:{ct.name}")
        if self._catalog is not None or (self._db_file is not None and self._db_file.is_file()):
            # A small synchronous read at setup, before any call runs.
            for name in self.mcp_servers:
                self._register_mcp(registry, self.catalog().index.tools_of("mcp", mcp_server=name))

    def _register(self, registry: ToolTableLike, tool: Tool, *, catalog_id: str | None = None) -> bool:
        existing = registry.get(tool.name)
        if existing is not None:
            if catalog_id is None or self.ids.get(tool.name) != catalog_id:
                key = catalog_id or f"builtin:{tool.name}"
                self.errors[key] = f"name {tool.name!r} is already taken by another tool; not registered"
                log.warning("catalog.name_clash", tool=tool.name, id=key)
            return False
        registry.register(tool)
        if catalog_id is not None:
            self.ids[tool.name] = catalog_id
            self.names[catalog_id] = tool.name
        return True

    def _register_mcp(self, registry: ToolTableLike, tools: Sequence[ToolDescriptor]) -> None:
        for d in tools:
            cfg = self.mcp_servers.get(d.mcp_server)
            if cfg is not None and d.id not in self.names:
                self._register(registry, self._mcp_tool(cfg, d), catalog_id=d.id)

    # -- which tools a caller may be shown ------------------------------------------------

    def allowed_ids(self, registry: ToolTableLike, *, has_workspace: bool = True) -> set[str]:
        """Catalog ids of the tools ``registry`` can run (with or without a workspace)."""
        return {
            self.ids.get(t.name, f"builtin:{t.name}") for t in registry.tools if has_workspace or not t.needs_workspace
        }

    async def search(
        self,
        registry: ToolTableLike,
        args: ToolSearchArgs,
        *,
        workspace: Workspace | None = None,
        has_workspace: bool | None = None,
    ) -> dict[str, Any]:
        """``tool_search`` output for ``args``: only tools ``registry`` can run, and
        without a workspace (``has_workspace`` defaults to ``workspace is not None``)
        only tools that need none. Raises InvalidQueryError, sqlite/OS errors."""
        await self.ensure_indexed(registry, workspace)
        with_ws = workspace is not None if has_workspace is None else has_workspace
        return await tool_search(
            self.catalog(),
            args,
            allowed_ids=self.allowed_ids(registry, has_workspace=with_ws),
            call_names=self.names,
        )

    # -- indexing -------------------------------------------------------------------------

    def _builtin_schemas(self, registry: ToolTableLike) -> list[dict[str, Any]]:
        # The vendors' native tools are left out as ``all_schemas`` leaves them out: a
        # model gets them from the vendor's own definitions, and the index must not
        # change because someone made a native call (which registers them).
        return [t.schema("openai") for t in registry.tools if t.name not in self.ids and "native" not in t.tags]

    async def _index_local(self, registry: ToolTableLike, report: IndexReport) -> None:
        catalog = self.catalog()
        report.stats["builtin"] = await catalog.index_builtin(self._builtin_schemas(registry))
        bad = {k: v for k, v in self.errors.items() if k.startswith("custom:")}
        status = "; ".join(f"{k.removeprefix('custom:')}: {v}" for k, v in bad.items())[:2000]
        mine = [t.descriptor() for t in self.custom_tools if self.ids.get(t.name) == f"custom:{t.name}"]
        report.stats["custom"] = await catalog.index_tools(
            "custom", mine, description="custom YAML tools", status_message=status
        )
        report.errors.update(bad)

    async def _index_mcp(
        self, registry: ToolTableLike, servers: Sequence[MCPServerConfig], ws: Workspace | None, report: IndexReport
    ) -> None:
        sources = []
        for cfg in servers:
            if cfg.url is not None:
                sources.append(self._http_source(cfg))
            elif ws is not None:
                sources.append(MCPSource(cfg, stdio_transport=_stdio_factory(ws, cfg)))
            else:
                report.errors[f"mcp:{cfg.name}"] = (
                    "stdio server: it runs inside a workspace sandbox, so it is indexed with a workspace "
                    "(loom-worker tools index --workspace DIR, or the first tool_search made in one)"
                )
        if not sources:
            return
        catalog = self.catalog()
        if ws is not None and any(s.config.command for s in sources):
            # Listing starts servers in the sandbox: record it like any other process there.
            ctx = ToolContext(workspace=ws)
            async with recorded(ws, tool=SEARCH_NAME, command="mcp tools/list", ctx=ctx):
                results = await index_mcp_sources(catalog, sources)
        else:
            results = await index_mcp_sources(catalog, sources)
        for name, res in results.items():
            if isinstance(res, str):
                report.errors[f"mcp:{name}"] = res
                log.warning("catalog.mcp_index_failed", server=name, error=res[:300])
            else:
                report.stats[f"mcp:{name}"] = res
                tools = await asyncio.to_thread(catalog.index.tools_of, "mcp", mcp_server=name)
                self._register_mcp(registry, tools)

    async def ensure_indexed(self, registry: ToolTableLike, ws: Workspace | None = None) -> None:
        """Index on first use: builtin and custom tools, and MCP servers never indexed
        before (stdio ones once a workspace is at hand)."""
        if self._indexed and (ws is None or not self._stdio_pending):
            return
        async with self._lock:
            report = IndexReport()
            if not self._indexed:
                await self._index_local(registry, report)
                known = {s.name for s in await self.catalog().list_sources()}
                new = [s for s in self.mcp_servers.values() if f"mcp:{s.name}" not in known]
                self._stdio_pending = {s.name for s in new if s.command is not None}
                await self._index_mcp(registry, [s for s in new if s.url is not None], None, report)
                self._indexed = True
            if ws is not None and self._stdio_pending:
                pending = [self.mcp_servers[n] for n in sorted(self._stdio_pending)]
                self._stdio_pending = set()  # tried once per process; `tools index` retries
                await self._index_mcp(registry, pending, ws, report)

    async def refresh(self, registry: ToolTableLike, ws: Workspace | None = None, *, mcp: bool = True) -> IndexReport:
        """Re-index every source (stdio MCP servers only with ``ws``) and register new MCP tools."""
        async with self._lock:
            report = IndexReport()
            report.errors.update({k: v for k, v in self.errors.items() if not k.startswith("custom:")})
            await self._index_local(registry, report)
            if mcp:
                await self._index_mcp(registry, list(self.mcp_servers.values()), ws, report)
            self._indexed = True
            self._stdio_pending = (
                set() if ws is not None else {s.name for s in self.mcp_servers.values() if s.command is not None}
            )
            return report

    # -- the tools ------------------------------------------------------------------------

    def _search_tool(self, registry: ToolTableLike) -> Tool:
        async def run(args: ToolSearchArgs, ctx: ToolContext) -> ToolResult:
            try:
                out = await self.search(
                    registry, args, workspace=ctx.workspace, has_workspace=ctx.workspace is not None
                )
            except InvalidQueryError as e:
                raise ToolError(f"INVALID_QUERY: {e}", data={"error_code": InvalidQueryError.code}) from None
            return ToolResult.ok(json.dumps(out, ensure_ascii=False), data=out)

        return Tool(
            name=SEARCH_NAME,
            description=SEARCH_DESCRIPTION,
            args_model=ToolSearchArgs,
            fn=run,
            timeout=90.0,  # a first search may index MCP servers (each bounded by its own timeout)
            needs_workspace=False,
            tags=("search",),
        )

    def _custom_tool(self, ct: CustomTool) -> Tool:
        async def run(args: JsonArgs, ctx: ToolContext) -> ToolResult:
            ws = ctx.require_workspace()
            argv, _ = ct.build(args.values)
            async with recorded(ws, tool=ct.name, command=shlex.join(argv), ctx=ctx) as changed:
                r = await ct.run(ws.sandbox, args.values)
            if r.outcome == "sandbox_lost":
                raise SandboxLostError(f"the sandbox was lost while running {ct.name}: {r.stderr.strip()}")
            data = r.to_dict()
            output = r.stdout
            if r.stderr:
                output += ("" if not output or output.endswith("\n") else "\n") + "[stderr]\n" + r.stderr
            if r.success:
                return ToolResult.ok(output or "(no output)", data, changed)
            error = (
                f"{ct.name} timed out after {ct.spec.timeout:g}s and was killed"
                if r.outcome == "timeout"
                else f"{ct.name} failed ({r.outcome}, exit code {r.exit_code})"
            )
            return ToolResult(False, f"{output}\n[{error}]" if output else f"[{error}]", data, changed, error)

        def check(values: dict[str, Any]) -> dict[str, Any]:
            try:
                return ct.validate(values)
            except CustomToolError as e:
                raise ValueError(str(e).removeprefix(f"{ct.name}: ")) from None

        return SchemaTool(
            name=ct.name,
            description=ct.spec.description,
            args_model=JsonArgs,
            fn=run,
            timeout=ct.spec.timeout + DEADLINE_SLACK,
            mutating=True,
            tags=("custom", *ct.spec.capabilities),
            json_schema=ct.schema,
            check=check,
        )

    def _http_source(self, cfg: MCPServerConfig) -> MCPSource:
        src = self._http_sources.get(cfg.name)
        if src is None:
            src = self._http_sources[cfg.name] = MCPSource(cfg)
        return src

    def _mcp_tool(self, cfg: MCPServerConfig, d: ToolDescriptor) -> Tool:
        remote = d.name
        stdio = cfg.command is not None

        async def run(args: JsonArgs, ctx: ToolContext) -> ToolResult:
            try:
                if stdio:
                    ws = ctx.require_workspace()
                    src = MCPSource(cfg, stdio_transport=_stdio_factory(ws, cfg))
                    async with recorded(ws, tool=name, command=f"mcp {cfg.name}: {remote}", ctx=ctx) as changed:
                        r = await src.call_tool(remote, args.values)
                else:
                    changed = []
                    r = await self._http_source(cfg).call_tool(remote, args.values)
            except MCPSourceError as e:
                return _infra(f"MCP server {cfg.name!r} failed", e)
            data = {"server": cfg.name, "tool": remote, **r.to_dict()}
            text = describe_result(r)
            if r.success:
                return ToolResult.ok(text or "(no output)", data, changed)
            return ToolResult.fail(
                f"{remote} (MCP server {cfg.name}) reported an error: {text}", data=data, files_changed=changed
            )

        name = mcp_tool_name(cfg.name, remote)
        schema = d.input_schema if d.input_schema.get("type") == "object" else {"type": "object", "properties": {}}
        return SchemaTool(
            name=name,
            description=d.description,
            args_model=JsonArgs,
            fn=run,
            timeout=cfg.timeout + DEADLINE_SLACK,
            mutating=stdio or d.requires_approval,
            needs_workspace=stdio,
            tags=("mcp", *d.capabilities),
            json_schema=schema,
            check=_schema_checker(schema),
        )


def _stdio_factory(ws: Workspace, cfg: MCPServerConfig) -> Callable[[], SandboxStdioTransport]:
    assert cfg.command is not None
    argv = list(cfg.command)
    return lambda: SandboxStdioTransport(ws.sandbox, argv, env=cfg.env)
