"""``loom-worker call``, ``batch`` and ``tools``: the tool surface for CI pipelines.

Every change a call makes is recorded in the workspace's changelog (``settings.data_dir``)
before it happens, so ``loom-worker undo`` can revert it.

Exit codes: 0 the tool succeeded (``batch``: every call did), 1 a tool failed, 2 a usage
error (bad ``--args`` JSON, unknown tool, missing workspace directory).

``tools`` is a subparser *group*: bare ``loom-worker tools [--format ...]`` prints the
schemas, and other modules add subcommands to it (``tools search``, ``tools index``) with
:func:`tools_subparsers`.

Test-only: ``--backend local`` runs tools through ``LocalProcessBackend`` (the agent as
a host subprocess, **no isolation**). It is hidden from ``--help`` and refused unless the
environment has ``LOOM_ALLOW_UNSAFE_LOCAL=1``; it exists so CLI tests run without Docker.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .. import aio
from ..registry import ToolRegistry, default_registry
from ..result import ToolResult, json_line
from ..settings import Settings
from ..tool import SCHEMA_FORMATS

UNSAFE_LOCAL_ENV = "LOOM_ALLOW_UNSAFE_LOCAL"

#: ``dest`` of the ``tools`` group's subcommand, for modules extending it.
TOOLS_COMMAND_DEST = "tools_command"


def _ensure_logging(settings: Settings) -> None:
    """Logs go to stderr, so stdout carries only results. Configured before the registry
    is built: building it may already log (a custom tool file that does not load)."""
    from ..logging import configure_logging

    configure_logging(settings.log_format, settings.log_level, stream=sys.stderr)


def _usage(message: str) -> int:
    print(f"loom-worker: error: {message}", file=sys.stderr)
    return 2


class _Changelogs:
    """One open changelog per workspace (under ``settings.data_dir``), so CLI calls are
    recorded and can be undone with ``loom-worker undo``."""

    def __init__(self, data_dir: Path, limits: Any = None) -> None:
        self.data_dir = data_dir
        self.limits: Any = limits
        self._open: dict[Path, Any] = {}

    def recorder(self, root: Path) -> Any:
        """Raises ChangelogStorageError when the store cannot be opened."""
        from ..changelog import Changelog

        if root not in self._open:
            self._open[root] = Changelog.open(self.data_dir, root, limits=self.limits)
        return self._open[root]

    async def aclose(self) -> None:
        for cl in self._open.values():
            await cl.aclose()
        self._open.clear()


def _registry(args: argparse.Namespace, settings: Settings, changelogs: _Changelogs) -> ToolRegistry | None:
    if getattr(args, "backend", "docker") == "local":
        if os.environ.get(UNSAFE_LOCAL_ENV) != "1":
            return None
        from sandbox.local import LocalProcessBackend

        return ToolRegistry(backend=LocalProcessBackend(), recorder_factory=changelogs.recorder)
    return default_registry(settings=settings, recorder_factory=changelogs.recorder)


def _open_workspace(args: argparse.Namespace, settings: Settings) -> tuple[Path, _Changelogs, ToolRegistry] | int:
    """The workspace, its changelogs and the registry for ``call``/``batch``, or the exit
    code of a usage error (already reported on stderr)."""
    ws = _workspace(args.workspace)
    if ws is None:
        return _usage(f"--workspace {args.workspace} is not a directory")
    if getattr(args, "backend", "docker") == "local" and os.environ.get(UNSAFE_LOCAL_ENV) != "1":
        return _usage(f"--backend local needs {UNSAFE_LOCAL_ENV}=1 (tests only: no isolation)")
    _ensure_logging(settings)
    changelogs = _Changelogs(settings.data_dir, settings.changelog_limits())
    registry = _registry(args, settings, changelogs)
    if registry is None:
        return _usage(f"--backend local needs {UNSAFE_LOCAL_ENV}=1 (tests only: no isolation)")
    return ws, changelogs, registry


def _workspace(value: str) -> Path | None:
    path = Path(value).expanduser().resolve()
    return path if path.is_dir() else None


def _print(obj: dict[str, Any]) -> None:
    sys.stdout.write(json_line(obj) + "\n")
    sys.stdout.flush()


# -- call --------------------------------------------------------------------------------


def _cmd_call(args: argparse.Namespace, settings: Settings) -> int:
    try:
        arguments = json.loads(args.args)
    except json.JSONDecodeError as e:
        return _usage(f"--args is not valid JSON: {e}")
    if not isinstance(arguments, dict):
        return _usage("--args must be a JSON object")
    names = ToolRegistry().names()
    if args.tool not in names:
        _print(ToolResult.fail(f"Unknown tool '{args.tool}'. Available tools: {', '.join(names)}").to_dict())
        return 2
    opened = _open_workspace(args, settings)
    if isinstance(opened, int):
        return opened
    ws, changelogs, registry = opened

    async def run() -> ToolResult:
        try:
            async with registry:
                return await registry.execute(args.tool, arguments, ws, call_id=args.call_id)
        finally:
            await changelogs.aclose()

    result = aio.run(run())
    _print(result.to_dict())
    return 0 if result.success else 1


# -- batch -------------------------------------------------------------------------------


def _parse_line(line: str) -> tuple[Any, str, Any]:
    """``(id, tool, arguments)`` of one batch line. Raises ValueError with the reason."""
    try:
        req = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e}") from None
    if not isinstance(req, dict):
        raise ValueError("a line must be a JSON object")
    tool = req.get("tool")
    if not isinstance(tool, str):
        raise ValueError('missing "tool" (a string)')
    unknown = set(req) - {"tool", "arguments", "id"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} (allowed: tool, arguments, id)")
    return req.get("id"), tool, req.get("arguments", {})


def _cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    opened = _open_workspace(args, settings)
    if isinstance(opened, int):
        return opened
    ws, changelogs, registry = opened

    async def run() -> bool:
        try:
            return await run_lines()
        finally:
            await changelogs.aclose()

    async def run_lines() -> bool:
        all_ok = True
        async with registry:
            for n, line in enumerate(sys.stdin, 1):
                if not line.strip():
                    continue
                try:
                    call_id, tool, arguments = _parse_line(line)
                except ValueError as e:
                    result = ToolResult.fail(f"Invalid batch line {n}: {e}")
                    call_id = None
                else:
                    cid = None if call_id is None else str(call_id)
                    result = await registry.execute(tool, arguments, ws, call_id=cid)
                all_ok = all_ok and result.success
                _print({"id": call_id, **result.to_dict()})
        return all_ok

    return 0 if aio.run(run()) else 1


# -- tools -------------------------------------------------------------------------------


def _cmd_tools(args: argparse.Namespace, settings: Settings) -> int:
    schemas = ToolRegistry().all_schemas(args.format)
    sys.stdout.write(json.dumps(schemas, indent=2, ensure_ascii=False) + "\n")
    return 0


def tools_subparsers(subparsers: argparse._SubParsersAction[Any]) -> argparse._SubParsersAction[Any]:
    """The ``tools`` group's subparsers, for another module to add ``tools <cmd>`` to.

    ``subparsers`` is the top-level action passed to ``register``; this module's
    ``register`` must have run first (``worker.cli.COMMAND_MODULES`` order). Each added
    subcommand sets its own ``func`` with ``set_defaults``.
    Raises LookupError when ``tools`` is not registered.
    """
    parser = subparsers.choices.get("tools")
    group = getattr(parser, "_loom_tools_subparsers", None)
    if group is None:
        raise LookupError("the 'tools' command is not registered (worker.cli.tools.register first)")
    return group


def _add_backend(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "call",
        help="Run one tool call and print its ToolResult JSON.",
        description="Run one tool call in the workspace's sandbox. Exit 0 success, 1 tool failed, 2 usage error.",
    )
    p.add_argument("tool", help="Tool name, e.g. read_file.")
    p.add_argument("--workspace", "-w", required=True, help="Workspace directory.")
    p.add_argument("--args", "-a", default="{}", help="Arguments as a JSON object (default {}).")
    p.add_argument("--call-id", default=None, help="Id recorded with the call (changelog, logs).")
    _add_backend(p)
    p.set_defaults(func=_cmd_call)

    p = subparsers.add_parser(
        "batch",
        help="Run JSON Lines tool calls from stdin; one result per line on stdout.",
        description='Each stdin line: {"tool": ..., "arguments": {...}, "id": ...}. Results in order.',
    )
    p.add_argument("--workspace", "-w", required=True, help="Workspace directory.")
    _add_backend(p)
    p.set_defaults(func=_cmd_batch)

    p = subparsers.add_parser("tools", help="Print the tool schemas (and more with subcommands).")
    p.add_argument("--format", "-f", choices=SCHEMA_FORMATS, default="openai", help="Schema format.")
    p.set_defaults(func=_cmd_tools)
    group = p.add_subparsers(dest=TOOLS_COMMAND_DEST, metavar="SUBCOMMAND", parser_class=type(p))
    p._loom_tools_subparsers = group
