"""The catalog's capability tags, alone: ``loom-worker --help`` lists them without
importing the catalog (SQLite, the MCP SDK, pydantic)."""

from __future__ import annotations

#: The closed set of capability tags (Go Loom registry).
CAPABILITIES: tuple[str, ...] = (
    "file_io",
    "http",
    "database",
    "notification",
    "shell",
    "search",
    "transform",
    "validate",
    "generate",
    "analyze",
    "web_search",
    "code",
    "git",
    "kubernetes",
    "aws",
    "visualization",
)
