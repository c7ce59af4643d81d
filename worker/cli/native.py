"""The vendors' own tools on the command line (see ``docs/native-tools.md``).

``loom-worker tools --format anthropic-native|openai-native`` prints the ``tools`` entries
of a Messages / Responses API request (``register`` adds those formats to ``tools``);
``loom-worker apply-patch --workspace DIR [@FILE | -]`` applies a whole ``*** Begin Patch``
envelope (Codex's ``apply_patch``) through the registry: recorded in the changelog as one
call, undoable with ``loom-worker undo --call <id>``. Exit 0 when applied (Codex's
"Success. Updated the following files:" on stdout), 1 when refused (the reason on stderr),
2 for a usage error.

Light at import, like every command module: the registry is imported when a command runs.
"""

from __future__ import annotations

import json
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from ..settings import Settings

#: ``tools --format`` values printed here.
NATIVE_FORMATS = ("anthropic-native", "openai-native")


def print_native_tools(fmt: str) -> int:
    """Print the definitions of ``fmt`` (one of :data:`NATIVE_FORMATS`) as JSON."""
    from ..native import anthropic_tools, openai_tools

    tools = anthropic_tools() if fmt == "anthropic-native" else openai_tools()
    sys.stdout.write(json.dumps(tools, indent=2) + "\n")
    return 0


def _read_patch(source: str) -> str:
    """The patch text from ``-`` (stdin) or ``@FILE``. Raises OSError, ValueError."""
    if source == "-":
        return sys.stdin.read()
    if source.startswith("@"):
        with open(source[1:], encoding="utf-8") as f:
            return f.read()
    raise ValueError("the patch is read from standard input (-) or a file (@FILE)")


def _cmd_apply_patch(args: argparse.Namespace, settings: Settings | None) -> int:
    from pathlib import Path

    ws = Path(args.workspace).expanduser()
    if not ws.is_dir():
        print(f"loom-worker: error: --workspace {args.workspace} is not a directory", file=sys.stderr)
        return 2
    try:
        patch = _read_patch(args.patch)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        print(f"loom-worker: error: cannot read the patch: {e}", file=sys.stderr)
        return 2
    from ..native import apply_envelope
    from ..registry import default_registry

    async def run() -> Any:
        async with default_registry(settings, catalog=False) as registry:
            return await apply_envelope(registry, patch, workspace=ws.resolve(), call_id=args.call_id)

    from .. import aio

    result = aio.run(run())
    if result.success:
        sys.stdout.write(result.output)
        return 0
    print(result.error, file=sys.stderr)
    return 1


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``apply-patch``, and the native formats to ``tools --format`` (registered
    before this module, by ``tools.py`` and extended by ``catalog.py``)."""
    tools = subparsers.choices.get("tools")
    if tools is not None:
        for action in tools._actions:
            if action.dest == "format" and action.choices is not None:
                action.choices = (*action.choices, *NATIVE_FORMATS)
        listing = tools.get_default("func")

        def cmd_tools(args: argparse.Namespace, settings: Settings | None) -> int:
            if args.format in NATIVE_FORMATS:
                return print_native_tools(args.format)
            return int(listing(args, settings))

        tools.set_defaults(func=cmd_tools)
    p = subparsers.add_parser(
        "apply-patch",
        help="Apply a '*** Begin Patch' envelope (Codex's apply_patch) in a workspace, recorded and undoable.",
        description="Apply a whole V4A patch envelope ('*** Begin Patch' ... '*** End Patch', several files): "
        "all of it or nothing, as one changelog group.",
        epilog="Exit status: 0 applied; 1 refused, the reason on stderr (a hunk that does not match, a path "
        "outside the workspace), or the sandbox failed; 2 usage error.",
    )
    p.add_argument("patch", nargs="?", default="-", help="@FILE, or - for standard input (the default).")
    p.add_argument("--workspace", "-w", required=True, help="Workspace directory.")
    p.add_argument("--call-id", default=None, help="Id recorded with the call (undo --call ID).")
    p.set_defaults(func=_cmd_apply_patch)
