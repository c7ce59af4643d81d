"""The host side of loom-worker: what may run, and the record of what changed.

Public API::

    from worker import ToolRegistry, ToolResult, Tool, default_registry

    async with default_registry() as registry:
        result = await registry.execute("read_file", {"path": "README.md"}, workspace="/src/project")

``worker`` imports ``sandbox``, never the other way.
"""

from .registry import ToolRegistry, default_registry
from .result import ToolResult
from .tool import PolicyError, Tool, ToolContext, ToolError
from .workspace import ChangeRecorder, NullRecorder, Workspace

__all__ = [
    "ChangeRecorder",
    "NullRecorder",
    "PolicyError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "Workspace",
    "default_registry",
]
