"""``loom-worker cp --workspace DIR SRC DEST``: copy one file into or out of the sandbox,
its bytes exactly, through the harness API (:mod:`worker.harness`), as ``docker cp``
copies into a container.

One of SRC and DEST is in the sandbox, written ``:PATH`` (relative: in the workspace;
absolute: anywhere the sandbox's user may read, or write: the workspace, ``/tmp``,
``$HOME``); the other is a file on this host, or ``-`` for our standard input or output.
The sandbox's user's permissions apply (a 0444 file is refused). A file written into the
workspace is recorded in its changelog (``loom-worker undo --call ID``); one written
elsewhere is the sandbox's scratch space and is not.

Exit codes: 0 copied; 1 refused or not there (the message on stderr); 2 a usage error;
125 the sandbox or the engine failed.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from ..settings import Settings


def _fail(code: int, message: str) -> int:
    print(f"loom-worker cp: {'error: ' if code == 2 else ''}{message}", file=sys.stderr)
    return code


def _cmd_cp(args: argparse.Namespace, settings: Settings) -> int:
    import os

    src, dest = args.src, args.dest
    if src.startswith(":") == dest.startswith(":"):
        return _fail(2, "one of SRC and DEST is in the sandbox (written :PATH), the other on this host (or -)")
    ws = os.path.realpath(os.path.expanduser(args.workspace))
    if not os.path.isdir(ws):
        return _fail(2, f"--workspace {args.workspace} is not a directory")
    if dest.startswith(":"):
        from ..harness import MAX_WRITE

        try:
            # One byte past the most the sandbox takes: a larger file is refused, never held.
            if src == "-":
                data = sys.stdin.buffer.read(MAX_WRITE + 1)
            else:
                with open(os.path.expanduser(src), "rb") as f:
                    data = f.read(MAX_WRITE + 1)
        except OSError as e:
            return _fail(1, f"{src}: {e.strerror or e}")
        if len(data) > MAX_WRITE:
            return _fail(1, f"{src}: larger than {MAX_WRITE} bytes, the most a file written into the sandbox may be")
        return _run(settings, ws, "in", dest[1:], data, args.call_id)
    return _run(settings, ws, "out", src[1:], dest, args.call_id)


def _run(settings: Settings, ws: str, way: str, path: str, other: Any, call_id: str | None) -> int:
    import os

    from .. import aio

    code, data = aio.run(_copy(settings, ws, way, path, other, call_id))
    if data is None:
        return code
    if other == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    try:
        with open(os.path.expanduser(other), "wb") as f:
            f.write(data)
    except OSError as e:
        return _fail(1, f"{other}: {e.strerror or e}")
    return 0


async def _copy(
    settings: Settings, ws: str, way: str, path: str, other: Any, call_id: str | None
) -> tuple[int, bytes | None]:
    """Exit code, and the bytes read (to write out) when copying out."""
    from sandbox.errors import AgentError, SandboxError

    from ..changelog.errors import ChangelogStorageError
    from ..harness import MAX_READ
    from ..registry import default_registry

    async with default_registry(settings, catalog=False) as registry:
        box = registry.sandbox(ws)
        try:
            if way == "in":
                done = await box.write_file(path, other, call_id=call_id)
                note = "recorded in the changelog" if done.recorded else "not recorded: outside the workspace"
                print(f"{done.path}: {done.size} bytes ({note})", file=sys.stderr)
                return 0, None
            return 0, await box.read_file(path, max_bytes=MAX_READ)
        except ValueError as e:
            return _fail(2, str(e)), None
        except AgentError as e:
            return _fail(1, str(e)), None
        except (SandboxError, ChangelogStorageError) as e:
            return _fail(125, f"the sandbox failed (infrastructure): {e}"), None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "cp",
        help="Copy a file into or out of the sandbox (:PATH), its bytes exactly.",
        description=(
            "Copy one file between this host (a path, or - for stdin/stdout) and the workspace's sandbox (:PATH: "
            "relative to the workspace, or absolute: anywhere its user may read or write), as its user. A file "
            "written into the workspace is recorded in the changelog; one written elsewhere is not."
        ),
        epilog="Exit status: 0 copied; 1 refused or not there; 2 usage error; 125 infrastructure failure.",
    )
    p.add_argument("--workspace", "-w", required=True, help="Workspace directory.")
    p.add_argument("--call-id", default=None, help="Id recorded with a write (changelog, undo).")
    p.add_argument("src", metavar="SRC", help=":PATH in the sandbox, a host file, or -.")
    p.add_argument("dest", metavar="DEST", help=":PATH in the sandbox, a host file, or -.")
    p.set_defaults(func=_cmd_cp)
