"""The host side of loom-worker: what may run, and the record of what changed.

Public API::

    from worker import ToolRegistry, ToolResult, Tool, default_registry

    async with default_registry() as registry:
        result = await registry.execute("read_file", {"path": "README.md"}, workspace="/src/project")
        async for item in registry.execute_stream("shell_execute", {"command": "make"}, workspace="/src/project"):
            ...  # ToolOutput chunks as the command prints, then the ToolResult

``worker`` imports ``sandbox``, never the other way.
"""

from .registry import ToolRegistry, default_registry
from .result import ToolResult
from .streaming import ToolOutput
from .tool import PolicyError, Tool, ToolContext, ToolError
from .workspace import ChangeRecorder, NullRecorder, Workspace

__all__ = [
    "ChangeRecorder",
    "NullRecorder",
    "PolicyError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "ToolRegistry",
    "ToolResult",
    "Workspace",
    "default_registry",
]
