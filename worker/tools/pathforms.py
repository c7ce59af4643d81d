"""What a file tool's ``path`` names, read as the shell in the same sandbox reads it.

The lexical policy (``worker.policy.paths``) folds ``a.txt/`` into ``a.txt`` and ``link/../b``
into ``b``; the shell does not. A trailing slash says "a directory" (``cat a.txt/``: Not
a directory; ``echo > new/``: Is a directory), and ``..`` is the parent of the directory
reached (after a link: of the link's target; after a file: Not a directory; after a
missing name: No such file or directory). A path with such a form is resolved by the
agent, which walks it as the kernel does (``sandbox/agent/paths.py``), in one ``stat``;
a plain path, by far the most usual, costs nothing more.
"""

from __future__ import annotations

from sandbox.errors import PathNotFoundError

from ..policy.paths import CONTAINER_ROOT, normalize, not_the_root
from ..tool import ToolError
from ..workspace import Workspace


def odd_form(path: str, root: str) -> tuple[str, bool] | None:
    """``path`` as the agent should walk it (relative to the workspace, or under
    ``/workspace``, its segments kept) and whether it ends in a slash form (``/``, ``/.``,
    ``/..``), when its meaning can differ from the lexical one; None for a plain path
    (also for a quoted name, or an absolute path the lexical policy judges alone)."""
    if '"' in path:
        return None
    if path[:1] != "/" and ".." not in path and not path.endswith(("/", "/.")) and path != ".":
        return None  # the usual path: nothing the shell reads otherwise
    p = path
    if p.startswith("/"):
        base = root.rstrip("/")
        if base and p.startswith(base + "/"):
            p = p[len(base) + 1 :]
        elif p.startswith(CONTAINER_ROOT + "/"):
            p = p[len(CONTAINER_ROOT) + 1 :]
        else:
            return None
    comps = p.split("/")
    if all(c in ("", ".") for c in comps):
        return None  # the root: the lexical policy says so
    slash = p.endswith("/") or comps[-1] in (".", "..")
    if not slash and ".." not in comps:
        return None
    return p, slash


async def file_path(ws: Workspace, path: str, *, create: bool) -> str:
    """The workspace-relative path of the file that ``path`` names, for a tool that opens
    it as ``open(2)`` would: with ``create``, as ``O_CREAT`` (``write_file``), else to
    read it first (``read_file``, ``edit_file``).

    Raises PolicyError (the path leaves the workspace, lexically), ToolError with the
    shell's answer (``No such file or directory``, ``Is a directory``, ``Not a
    directory``), and the sandbox's errors from resolving an odd form (NotADirError,
    PathNotFoundError, PathEscapeError: the tool's error channel).
    """
    if path == "":
        raise ToolError("No such file or directory: the path is empty")
    root = str(ws.root)
    rel = normalize(path, root)  # the lexical policy first: PolicyError
    form = odd_form(path, root)
    if form is None:
        return not_the_root(rel, path)
    raw, slash = form
    if create and raw.endswith("/"):
        # open("x/", O_CREAT) is EISDIR whatever x is, once the directories before it are
        # there (a file among them: Not a directory; a missing one: No such file).
        head = raw.rstrip("/").rpartition("/")[0]
        if head:
            parent = await ws.sandbox.stat(head + "/")
            if parent.type != "dir":
                raise ToolError(f"Not a directory: {path}")
        raise ToolError(f"Is a directory: {path}")
    try:
        st = await ws.sandbox.stat(raw)
    except PathNotFoundError:
        if slash:
            raise ToolError(f"No such file or directory: {path}") from None
        head, _, name = raw.rpartition("/")
        parent = await ws.sandbox.stat(head + "/" if head else ".")
        if parent.type != "dir":
            raise ToolError(f"Not a directory: {path}") from None
        return name if parent.path == "." else f"{parent.path}/{name}"
    if slash or st.type == "dir":
        raise ToolError(f"Is a directory: {path}")
    return st.path
