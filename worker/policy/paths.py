"""The lexical path policy: a fast first filter on the host.

It turns what a model sends (``"src/a.py"``, ``"./x/../y"``, the host's absolute path of
a file in the workspace, or the container's ``/workspace/...``) into one normalized
workspace-relative path, and refuses what can be seen to leave the workspace without
looking at the disk: ``..`` past the root, absolute paths elsewhere, NUL bytes.

It is *not* the security boundary. Symlinks (to outside, dangling, swapped mid-call) can
only be judged where the files are, and that authoritative check is done component by
component by the in-container agent (``sandbox/agent/paths.py``), which refuses with
``PathEscapeError``.
"""

from __future__ import annotations

import posixpath
from pathlib import PurePosixPath

from ..quoting import unquote_path
from ..tool import PolicyError, ToolError

#: Where the workspace is mounted inside the sandbox container.
CONTAINER_ROOT = "/workspace"

MAX_PATH_CHARS = 4096


def _inside(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` when it is ``root`` or below it (whole components)."""
    p, r = PurePosixPath(path), PurePosixPath(root)
    if p == r:
        return "."
    try:
        return p.relative_to(r).as_posix()
    except ValueError:
        return None


def normalize(path: str, workspace_root: str | None = None) -> str:
    """The workspace-relative, normalized form of ``path`` (``"."`` for the root).

    ``workspace_root`` is the host directory of the workspace (a real path); an absolute
    path below it, or below ``/workspace``, is accepted and made relative.

    Raises PolicyError ("Safety violation: ...") for a path that leaves the workspace.
    """
    if path and '"' not in path and "\x00" not in path and len(path) <= MAX_PATH_CHARS and path[0] != "/":
        # The usual path (on every file tool's call): plain names only, already normal.
        framed = f"/{path}/"
        if "//" not in framed and "/./" not in framed and "/../" not in framed and not path.isspace():
            return path
    path = unquote_path(path)
    if "\x00" in path:
        raise PolicyError("Path contains a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise PolicyError(f"Path is longer than {MAX_PATH_CHARS} characters")
    if path.strip() == "":
        return "."
    if path.startswith("/"):
        # Normalize first so "/workspace/../etc" is judged as "/etc", and so a sibling
        # directory sharing a prefix ("/ws-abc" vs "/ws-abcd") is never taken as inside.
        absolute = posixpath.normpath(path)
        if absolute.startswith("//"):
            absolute = "/" + absolute.lstrip("/")
        rel = None
        if workspace_root is not None:
            rel = _inside(absolute, posixpath.normpath(workspace_root))
        if rel is None:
            rel = _inside(absolute, CONTAINER_ROOT)
        if rel is None:
            raise PolicyError(f"Path '{path}' is outside the workspace")
        return rel
    parts: list[str] = []
    for comp in path.split("/"):
        if comp.startswith('"'):  # one quoted name, as list_directory shows it: dir/"bad\377"
            comp = unquote_path(comp)
            if "/" in comp or "\x00" in comp:
                raise PolicyError(f"Path '{path}' has a quoted name holding '/' or NUL")
        if comp in ("", "."):
            continue
        if comp == "..":
            if not parts:
                raise PolicyError(f"Path '{path}' escapes the workspace")
            parts.pop()
        else:
            parts.append(comp)
    return "/".join(parts) if parts else "."


def require_file_path(path: str, workspace_root: str | None = None) -> str:
    """Like :func:`normalize`, but the result must name something below the root.

    Raises PolicyError for a path that leaves the workspace, ToolError ("Not a file")
    for the workspace root itself.
    """
    return not_the_root(normalize(path, workspace_root), path)


def not_the_root(rel: str, path: str) -> str:
    """``rel`` (``path`` normalized), which must not be the workspace's root. Raises
    ToolError ("Not a file") for the root."""
    if rel == ".":
        raise ToolError(f"Not a file: '{path}' is a directory (the workspace's root)")
    return rel
