"""MCP servers as a tool source: operator-configured, indexed as ``mcp:<server>:<tool>``,
callable through the registry.

Config (``$LOOM_DATA_DIR/mcp_servers.yaml`` or ``LOOM_MCP_SERVERS_FILE``, YAML or JSON)::

    servers:
      docs:                                   # streamable HTTP
        url: http://127.0.0.1:8931/mcp
        headers: {Authorization: "Bearer ..."}
      git:                                    # stdio, run INSIDE the workspace sandbox
        command: [mcp-server-git, --repository, .]

A stdio server is never started on the host. It runs in the workspace sandbox: the
caller passes ``stdio_transport``, a factory of MCP transports over a process spawned in
the sandbox (:class:`worker.catalog.sandbox_stdio.SandboxStdioTransport`). Without one a
stdio server is unavailable (:class:`MCPUnavailableError`), never run on the host. So
listing a stdio server's tools needs a workspace: ``loom-worker tools index --workspace
DIR``, or the first ``tool_search`` made with a workspace.

Errors::

    MCPSourceError            a server could not be reached, listed or called (infrastructure)
    └── MCPUnavailableError   the transport it needs is not available here

A tool that answers ``isError`` is a normal result (``success=False``), not an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import anyio
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sandbox.errors import SandboxError

from .capabilities import make_descriptor
from .index import IndexStats, ToolDescriptor
from .search import Catalog


class MCPSourceError(Exception):
    """An MCP server could not be reached, listed or called."""


class MCPUnavailableError(MCPSourceError):
    """The transport this server needs is not available (e.g. stdio without a sandbox opener)."""


class MCPServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    url: str | None = Field(None, pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = Field(None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    description: str = ""
    timeout: float = Field(30.0, gt=0, le=600)

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if (self.url is None) == (self.command is None):
            raise ValueError("exactly one of 'url' or 'command' is required")
        return self


def load_mcp_config(path: Path) -> tuple[list[MCPServerConfig], dict[str, str]]:
    """(servers, errors by server name). A missing file means no servers. Raises
    ValueError when the file itself is unreadable or malformed."""
    if not path.is_file():
        return [], {}
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML too
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path.name}: {e}") from e
    servers = doc.get("servers") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        raise ValueError(f"{path.name}: expected 'servers: {{name: {{url|command: ...}}}}'")
    out, errors = [], {}
    for name, body in servers.items():
        try:
            out.append(MCPServerConfig.model_validate({"name": name, **(body or {})}))
        except (ValidationError, TypeError) as e:
            errors[str(name)] = str(e).splitlines()[0] if isinstance(e, TypeError) else _first(e)
    return out, errors


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    return f"{'.'.join(str(x) for x in err['loc']) or 'server'}: {err['msg']}"


class TransportFactory(Protocol):
    """Makes a fresh (single-use) MCP transport for one session with a stdio server,
    running **inside the workspace sandbox**."""

    def __call__(self) -> contextlib.AbstractAsyncContextManager[Any]: ...


@dataclass
class MCPCallResult:
    success: bool
    text: str
    structured: Any
    content: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class MCPSource:
    """One configured MCP server. Each operation opens its own short session."""

    def __init__(self, config: MCPServerConfig, *, stdio_transport: TransportFactory | None = None) -> None:
        self.config = config
        self._stdio_transport = stdio_transport  # makes an mcp Transport over a sandbox process

    @property
    def name(self) -> str:
        return self.config.name

    @contextlib.asynccontextmanager
    async def _client(self) -> AsyncIterator[Any]:
        from mcp import Client  # imported here: the SDK is large and only needed for MCP sources

        if self.config.url is not None:
            target: Any = self.config.url
            if self.config.headers:
                import httpx2  # the HTTP client the mcp SDK uses
                from mcp.client.streamable_http import streamable_http_client

                http = httpx2.AsyncClient(headers=self.config.headers, timeout=self.config.timeout)
                target = streamable_http_client(self.config.url, http_client=http)
        elif self._stdio_transport is not None:
            target = self._stdio_transport()
        else:
            raise MCPUnavailableError(
                f"MCP server {self.name!r} is a stdio command; it may only run inside the workspace sandbox, "
                "which needs a long-lived process primitive the sandbox does not offer yet"
            )
        try:
            async with Client(target, read_timeout_seconds=self.config.timeout, mode="legacy") as client:
                yield client
        except MCPSourceError:
            raise
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, TimeoutError) as e:
            raise MCPSourceError(f"MCP server {self.name!r}: {type(e).__name__}: {e}{_why(target)}") from e
        except Exception as e:  # the SDK raises its own and httpx errors; translate once, here
            if type(e).__module__.startswith(("mcp", "httpx", "anyio")) or isinstance(e, ExceptionGroup):
                leaf = _leaf(e)
                raise MCPSourceError(f"MCP server {self.name!r}: {type(leaf).__name__}: {leaf}{_why(target)}") from e
            raise

    async def list_tools(self) -> list[ToolDescriptor]:
        """Descriptors of every tool the server lists. Raises MCPSourceError."""
        out: list[ToolDescriptor] = []
        async with self._client() as client:
            cursor = None
            while True:
                page = await client.list_tools(cursor=cursor)
                for t in page.tools:
                    ann = t.annotations
                    read_only = bool(ann and getattr(ann, "read_only_hint", False))
                    out.append(
                        make_descriptor(
                            source="mcp",
                            mcp_server=self.name,
                            name=t.name,
                            description=t.description or t.title or t.name,
                            input_schema=dict(t.input_schema or {}),
                            output_schema=dict(t.output_schema) if t.output_schema else None,
                            requires_approval=False if read_only else None,
                        )
                    )
                cursor = page.next_cursor
                if not cursor:
                    return out

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> MCPCallResult:
        """Call one tool. Raises MCPSourceError when the server cannot be reached."""
        async with self._client() as client:
            r = await client.call_tool(tool, arguments)
        content = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in r.content]
        text = "\n".join(c.get("text", "") for c in content if c.get("type") == "text")
        return MCPCallResult(success=not r.is_error, text=text, structured=r.structured_content, content=content)


def _leaf(e: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups, for a readable message."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


@runtime_checkable
class Diagnoses(Protocol):
    """A transport that can say how its server ended (:class:`.sandbox_stdio.SandboxStdioTransport`)."""

    def diagnostics(self) -> str: ...


def _why(target: Any) -> str:
    """What a sandbox transport knows about how its server ended (exit code, stderr)."""
    text = target.diagnostics() if isinstance(target, Diagnoses) else ""
    return f" ({text})" if text else ""


async def index_mcp_sources(catalog: Catalog, sources: list[MCPSource]) -> dict[str, IndexStats | str]:
    """Index every server concurrently; a server that fails is marked unavailable (its
    earlier tools stay searchable) and reported by name, the others still index."""

    async def one(src: MCPSource) -> IndexStats | str:
        try:
            tools = await asyncio.wait_for(src.list_tools(), src.config.timeout)
        except (MCPSourceError, SandboxError, TimeoutError) as e:
            msg = str(e) or "timed out listing tools"
            await asyncio.to_thread(catalog.index.mark_source_unavailable, "mcp", msg, mcp_server=src.name)
            return msg
        return await catalog.index_tools("mcp", tools, mcp_server=src.name, description=src.config.description)

    results = await asyncio.gather(*(one(s) for s in sources))
    return {s.name: r for s, r in zip(sources, results, strict=True)}


def describe_result(r: MCPCallResult) -> str:
    """A compact text form of a call's result for a ToolResult's output."""
    if r.text:
        return r.text
    return json.dumps(r.structured if r.structured is not None else r.content)[:10_000]
