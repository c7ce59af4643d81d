"""The host side of loom-worker: what may run, and the record of what changed.

Public API::

    import worker
    from worker import ToolRegistry, ToolResult, Tool, default_registry

    async def main() -> None:
        async with default_registry() as registry:
            result = await registry.execute("read_file", {"path": "README.md"}, workspace="/src/project")
            async for item in registry.execute_stream("shell_execute", {"command": "make"}, workspace="/src/project"):
                ...  # ToolOutput chunks as the command prints, then the ToolResult
            box = registry.sandbox("/src/project")  # the harness API (not a tool): SandboxHandle
            out = await box.exec(["python3", "-c", "print(1)"], input=b"...", user="nobody")

    worker.run(main())  # asyncio.run(main()) on uvloop: what the CLI and the service run on

``worker`` imports ``sandbox``, never the other way.

The names below are imported on first use (PEP 562), not with the package: the
``loom-worker`` command imports ``worker.cli``, and ``call`` through the local worker
must not pay for pydantic, the registry and the Docker SDK (about 0.5 s) it never uses.
"""

from __future__ import annotations

import importlib

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .aio import run
    from .harness import ExecOutput, FileWritten, SandboxHandle
    from .registry import ToolRegistry, default_registry
    from .result import ToolResult
    from .streaming import ToolOutput
    from .tool import PolicyError, Tool, ToolContext, ToolError
    from .workspace import ChangeRecorder, NullRecorder, Workspace

#: Public name -> the module that defines it.
_EXPORTS = {
    "ChangeRecorder": ".workspace",
    "ExecOutput": ".harness",
    "FileWritten": ".harness",
    "NullRecorder": ".workspace",
    "PolicyError": ".tool",
    "SandboxHandle": ".harness",
    "Tool": ".tool",
    "ToolContext": ".tool",
    "ToolError": ".tool",
    "ToolOutput": ".streaming",
    "ToolRegistry": ".registry",
    "ToolResult": ".result",
    "Workspace": ".workspace",
    "default_registry": ".registry",
    "run": ".aio",
}

__all__ = [
    "ChangeRecorder",
    "ExecOutput",
    "FileWritten",
    "NullRecorder",
    "PolicyError",
    "SandboxHandle",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "ToolRegistry",
    "ToolResult",
    "Workspace",
    "default_registry",
    "run",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'worker' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
