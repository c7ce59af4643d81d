"""``loom-worker run-code --workspace DIR [--language python] [--context ID] [-c CODE | FILE]
[--images DIR]``: run code in a code context of the workspace's sandbox (a kernel whose
state lasts between runs: ``x = 1`` now, ``x + 1`` in the next call), through the harness
API (:mod:`worker.kernels`).

What comes out: what the code prints, on our stdout and stderr as it comes; then each
result (a ``display()``, the last expression's value) as its text on stdout, an image
(PNG, JPEG, SVG, PDF) saved into the ``--images`` directory and named there
(``[image/png 640x480: DIR/call_x-1.png]``); the traceback of an exception on stderr, and
what happened when it was more than that (a timeout, a kernel that died) after it.
``--json``: the events as the HTTP route streams them instead, one JSON object a line.

Files the code writes in the workspace are recorded in its changelog under the call id
(``loom-worker undo --call ID``).

Exit codes: 0 it ran; 1 the code raised; 124 it timed out (interrupted, or restarted when
that did not stop it); 137 its kernel died (out of memory, ``os._exit``); 2 a usage
error (a bad option, an unknown context, too many background processes); 125 the context
or the sandbox cannot start (an image without a kernel: the message says what to add; no
engine, no image, the sandbox lost).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from ..kernels import Execution, Result
    from ..settings import Settings

_EXT = {"png": "png", "jpeg": "jpg", "svg": "svg", "pdf": "pdf"}
_MIME = {"png": "image/png", "jpeg": "image/jpeg", "svg": "image/svg+xml", "pdf": "application/pdf"}


def _fail(code: int, message: str) -> int:
    print(f"loom-worker run-code: {'error: ' if code == 2 else ''}{message}", file=sys.stderr)
    return code


def exit_code(ex: Execution) -> int:
    """0 ok, 1 the code raised, 124 a timeout, 130 interrupted otherwise, 137 a dead kernel."""
    if ex.outcome == "ok":
        return 0
    if ex.outcome == "error":
        return 1
    if ex.outcome == "kernel_died":
        return 137
    return 124 if "timed out" in ex.message else 130


def _cmd_run_code(args: argparse.Namespace, settings: Settings) -> int:
    import os

    if (args.code is None) == (args.file is None):
        return _fail(2, "give the code with -c CODE or as a FILE (- for standard input), one of them")
    if args.code is not None:
        code = args.code
    else:
        try:
            if args.file == "-":
                code = sys.stdin.read()
            else:
                with open(os.path.expanduser(args.file), encoding="utf-8") as f:
                    code = f.read()
        except (OSError, UnicodeDecodeError) as e:
            return _fail(2, f"{args.file}: {getattr(e, 'strerror', None) or e}")
    ws = os.path.realpath(os.path.expanduser(args.workspace))
    if not os.path.isdir(ws):
        return _fail(2, f"--workspace {args.workspace} is not a directory")
    images = None
    if args.images is not None:
        images = os.path.realpath(os.path.expanduser(args.images))
        try:
            os.makedirs(images, exist_ok=True)
        except OSError as e:
            return _fail(2, f"--images {args.images}: {e.strerror or e}")
    from .. import aio

    return int(aio.run(_run(settings, ws, code, args, images)))


async def _run(settings: Settings, ws: str, code: str, args: argparse.Namespace, images: str | None) -> int:
    import secrets

    from sandbox.errors import AgentError, KernelUnavailableError, SandboxError

    from ..changelog.errors import ChangelogStorageError
    from ..jsontext import json_line
    from ..kernels import Execution, OutputMessage, Result
    from ..registry import default_registry

    shown = 0
    call_id = args.call_id or "call_" + secrets.token_hex(8)
    async with default_registry(settings, catalog=False) as registry:
        box = registry.sandbox(ws)
        try:
            async for ev in box.run_code_stream(
                code, args.context, args.language, args.timeout, call_id, tool="cli.run_code"
            ):
                if args.json:
                    sys.stdout.write(json_line(ev.to_dict()) + "\n")
                    sys.stdout.flush()
                    if isinstance(ev, Execution):
                        return exit_code(ev)
                elif isinstance(ev, OutputMessage):
                    stream = sys.stdout if ev.kind == "stdout" else sys.stderr
                    stream.write(ev.text)
                    stream.flush()
                elif isinstance(ev, Result):
                    shown += 1
                    _show(ev, images, call_id, shown)
                else:
                    return _finish(ev)
        except ValueError as e:  # CodeArgumentError: a field refused
            return _fail(2, str(e))
        except KernelUnavailableError as e:  # the context cannot start: what to add says how
            return _fail(125, str(e))
        except AgentError as e:  # no such context, too many background processes
            return _fail(2, str(e))
        except (SandboxError, ChangelogStorageError) as e:
            return _fail(125, f"the sandbox failed (infrastructure): {e}")
    raise AssertionError("an execution always ends with its Execution")


def _show(r: Result, images: str | None, call_id: str, n: int) -> None:
    """One result on stdout: its images saved (or said not to be), then its text."""
    import base64
    import os

    lines: list[str] = []
    for field, ext in _EXT.items():
        value = getattr(r, field)
        if value is None:
            continue
        what = _MIME[field]
        if images is None:
            lines.append(f"[{what}: not saved (--images DIR saves it)]")
            continue
        data = value.encode() if field == "svg" else base64.b64decode(value)
        path = os.path.join(images, f"{call_id}-{n}.{ext}")
        with open(path, "wb") as f:
            f.write(data)
        size = _png_size(data) if field == "png" else None
        lines.append(f"[{what}{f' {size[0]}x{size[1]}' if size else ''}: {path}]")
    text = r.text
    if text is None and lines == [] and r.formats():
        text = f"[{', '.join(r.formats())}]"
    if text is not None and not (lines and text.startswith("<Figure")):
        lines.append(text)
    for line in lines:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _finish(ex: Execution) -> int:
    if ex.error is not None:
        sys.stderr.write(ex.error.traceback.rstrip("\n") + "\n")
    if ex.outcome not in ("ok", "error") and ex.message:
        _fail(0, ex.message)
    sys.stderr.flush()
    return exit_code(ex)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run-code",
        help="Run code in a code context (a kernel whose state lasts between runs).",
        description=(
            "Run code in a code context of the workspace's sandbox: an IPython kernel whose state (variables, "
            "imports) lasts between runs. What it prints comes as it is printed; then each result's text, its "
            "images saved into --images. Files it writes in the workspace are recorded in the changelog."
        ),
        epilog=(
            "Exit status: 0 it ran; 1 the code raised; 124 timed out; 137 its kernel died; 2 usage error (also an "
            "unknown context); 125 the context or the sandbox cannot start (an image without a kernel, no engine)."
        ),
    )
    p.add_argument("--workspace", "-w", required=True, help="Workspace directory.")
    p.add_argument("--language", default=None, help="The default context's language (python).")
    p.add_argument("--context", default=None, help="A context's id (ctx-...); default: the language's default context.")
    p.add_argument("-c", dest="code", default=None, metavar="CODE", help="The code to run.")
    p.add_argument("file", nargs="?", default=None, metavar="FILE", help="A file of code to run (- for stdin).")
    p.add_argument("--images", default=None, metavar="DIR", help="Save image results into this directory.")
    p.add_argument("--timeout", type=float, default=60.0, help="Seconds, then the kernel is interrupted (default 60).")
    p.add_argument("--call-id", default=None, help="Id recorded with its changes (changelog, undo).")
    p.add_argument("--json", action="store_true", help="The events as JSON lines (as the HTTP route streams them).")
    p.set_defaults(func=_cmd_run_code)
