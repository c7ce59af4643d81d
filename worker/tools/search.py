"""``search_files`` (regex over files, ripgrep in the sandbox) and ``list_directory``."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sandbox.base import ListEntry

from ..policy.paths import normalize
from ..quoting import quote_path
from ..result import ToolResult
from ..tool import Tool, ToolArgs, ToolContext

MAX_MATCHES = 200
MAX_LIST_ENTRIES = 2000
SEARCH_TIMEOUT = 30.0


class SearchArgs(ToolArgs):
    pattern: str = Field(min_length=1, description="Regular expression to search for (always a pattern).")
    path: str = Field(".", description="Directory or file to search, relative to the workspace root.")
    file_pattern: str | None = Field(None, description="Only files matching this glob, e.g. '*.py'.")


async def search_files(args: SearchArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    rel = normalize(args.path, str(ws.root))
    res = await ws.sandbox.search(
        args.pattern,
        path=rel,
        glob=args.file_pattern or None,
        max_matches=MAX_MATCHES,
        timeout=SEARCH_TIMEOUT,
    )
    data: dict[str, Any] = {
        "matches": [{"path": quote_path(m.path), "line": m.line, "text": m.text} for m in res.matches],
        "count": len(res.matches),
        "truncated": res.truncated,
        "engine": res.engine,
    }
    if not res.matches:
        where = f" in {quote_path(rel)}" if rel != "." else ""
        only = f" (files matching {args.file_pattern})" if args.file_pattern else ""
        return ToolResult.ok(f"No matches for /{args.pattern}/{where}{only}", data)
    lines = [f"{quote_path(m.path)}:{m.line}: {m.text}" for m in res.matches]
    if res.truncated:
        lines.append(f"[more than {MAX_MATCHES} matches; showing the first {MAX_MATCHES}. Narrow the pattern or path]")
    return ToolResult.ok("\n".join(lines), data)


class ListArgs(ToolArgs):
    path: str = Field(".", description="Directory to list, relative to the workspace root.")
    depth: int = Field(2, ge=1, le=10, description="How many levels deep to list (1-10, default 2).")


def render_tree(entries: list[ListEntry], base: str) -> list[str]:
    """Indented tree lines: directories first (with a trailing ``/``), then files, by name."""
    prefix = "" if base == "." else base + "/"
    children: dict[str, list[ListEntry]] = {}
    for e in entries:
        rel = e.path[len(prefix) :] if prefix and e.path.startswith(prefix) else e.path
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        children.setdefault(parent, []).append(e)

    lines: list[str] = []

    def emit(parent: str, indent: int) -> None:
        kids = sorted(children.get(parent, []), key=lambda e: (e.type != "dir", e.path.rsplit("/", 1)[-1]))
        for e in kids:
            name = e.path.rsplit("/", 1)[-1]
            shown = quote_path(name)  # a newline in a name must not forge a line
            if e.type == "dir":
                lines.append(f"{'  ' * indent}{shown}/")
                emit(f"{parent}/{name}" if parent else name, indent + 1)
            elif e.type == "symlink":
                lines.append(f"{'  ' * indent}{shown}@")
            elif e.type == "other":
                lines.append(f"{'  ' * indent}{shown} (special file)")
            else:
                lines.append(f"{'  ' * indent}{shown}")

    emit("", 0)
    return lines


async def list_directory(args: ListArgs, ctx: ToolContext) -> ToolResult:
    ws = ctx.require_workspace()
    rel = normalize(args.path, str(ws.root))
    res = await ws.sandbox.list(rel, depth=args.depth, max_entries=MAX_LIST_ENTRIES)
    data: dict[str, Any] = {
        "path": quote_path(rel),
        "entries": [
            {"path": quote_path(e.path), "type": e.type, "size": e.size, "depth": e.depth} for e in res.entries
        ],
        "truncated": res.truncated,
    }
    header = "./" if rel == "." else quote_path(rel) + "/"
    if not res.entries:
        return ToolResult.ok(f"{header}\n(empty directory)", data)
    lines = [header] + ["  " + line for line in render_tree(res.entries, rel)]
    if res.truncated:
        lines.append(f"[listing stopped after {MAX_LIST_ENTRIES} entries; list a subdirectory or lower depth]")
    return ToolResult.ok("\n".join(lines), data)


TOOLS = [
    Tool(
        name="search_files",
        description=(
            "Search file contents with a regular expression. Returns 'path:line: text' lines, at most "
            f"{MAX_MATCHES}. Skips .git, node_modules, __pycache__ and virtualenvs. Optional path "
            "(subdirectory) and file_pattern (glob such as '*.py')."
        ),
        args_model=SearchArgs,
        fn=search_files,
        timeout=SEARCH_TIMEOUT,
        tags=("search", "read"),
    ),
    Tool(
        name="list_directory",
        description=(
            "List a workspace directory as a tree (directories first, with a trailing '/'), "
            "default 2 levels deep (at most 10). Skips .git, node_modules, __pycache__ and virtualenvs."
        ),
        args_model=ListArgs,
        fn=list_directory,
        timeout=10.0,
        tags=("file_io", "read"),
    ),
]
