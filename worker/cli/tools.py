"""``loom-worker call``, ``batch`` and ``tools``: the tool surface for CI pipelines.

Every change a call makes is recorded in the workspace's changelog (``LOOM_DATA_DIR``)
before it happens, so ``loom-worker undo`` can revert it.

Exit codes: 0 the tool succeeded (``batch``: every call did), 1 a tool failed (also an
infrastructure failure, such as a local worker that died during the call), 2 a usage
error (bad ``--args``: not JSON, or arguments the tool's schema refuses, printed as the
``ToolResult`` that names the field; unknown tool, missing workspace directory, a
``LOOM_*`` value that does not validate). ``batch`` reports each line's result and
exits 1 when one failed, whatever the reason.

``call`` and ``batch`` run their calls in the per-user local worker
(:mod:`worker.localworker`), which keeps the registry and the sandboxes' connections warm
between invocations, and start it when none runs; ``LOOM_CLI_DAEMON=0``, or anything that
keeps it from taking a call before the call is sent, runs the call in this process
instead. Both paths run the same code (:class:`worker.localworker.calls.Calls`) and print
with the same function, so their output and exit codes are the same, byte for byte.
Nothing heavy is imported here until it is needed: through the worker, a call imports
only the standard library.

``--args`` takes a JSON object, ``@FILE`` (its content) or ``-`` / ``@-`` (standard
input), as curl's ``--data`` does: one argument of the command line may hold at most
128 KiB, and a ``write_file`` of megabytes cannot go through it.

``tools`` is a subparser *group*: bare ``loom-worker tools [--format ...]`` prints the
schemas, and other modules add subcommands to it (``tools search``, ``tools index``) with
:func:`tools_subparsers`.

Test-only: ``--backend local`` runs tools through ``LocalProcessBackend`` (the agent as
a host subprocess, **no isolation**). It is hidden from ``--help`` and refused unless the
environment has ``LOOM_ALLOW_UNSAFE_LOCAL=1``; it exists so CLI tests run without Docker.
"""

from __future__ import annotations

import json
import os
import sys

from .common import unsafe_local_refused

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every `call`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from ..localworker.calls import Calls
    from ..localworker.client import WorkerClient
    from ..settings import Settings

#: The schema formats (``worker.tool.SCHEMA_FORMATS``, which imports pydantic).
SCHEMA_FORMATS = ("openai", "anthropic", "mcp")

#: ``dest`` of the ``tools`` group's subcommand, for modules extending it.
TOOLS_COMMAND_DEST = "tools_command"


def _usage(message: str) -> int:
    print(f"loom-worker: error: {message}", file=sys.stderr)
    return 2


def _print(obj: dict[str, Any]) -> None:
    from ..jsontext import json_line

    sys.stdout.write(json_line(obj) + "\n")
    sys.stdout.flush()


def _log_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def fail_dict(error: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """``ToolResult.fail(error, data=data).to_dict()``, without importing pydantic's world
    on the worker's path (the unit tests hold the two equal)."""
    return {"success": False, "output": f"Error: {error}", "data": data, "files_changed": [], "error": error}


def read_arguments(value: str) -> dict[str, Any] | str:
    """``--args``: a JSON object given inline, as ``@FILE`` or as ``-`` / ``@-`` (standard
    input). Returns the object, or the message of a usage error."""
    from ..limits import max_request_bytes, too_large

    text: str | bytes
    limit = max_request_bytes()
    if value in ("-", "@-"):
        # At most one byte past the limit is read: a larger input is refused, never held.
        label, text = f"--args {value}", sys.stdin.buffer.read(limit + 1)
    elif value.startswith("@"):
        label = f"--args {value}"
        try:
            with open(value[1:], "rb") as f:
                text = f.read(limit + 1)
        except OSError as e:
            return f"{label}: cannot read {value[1:]}: {e.strerror}"
    else:
        label, text = "--args", value
    if len(text) > limit:
        return f"{label}: {too_large(limit)}"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            return f"{label}: not UTF-8 text (byte {e.start})"
    try:
        arguments = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        return f"{label} is not valid JSON: {e}"
    if not isinstance(arguments, dict):
        return f"{label} must be a JSON object, not {type(arguments).__name__}"
    return arguments


def _workspace(value: str) -> str | None:
    path = os.path.realpath(os.path.expanduser(value))
    return path if os.path.isdir(path) else None


class Runner:
    """Where this invocation's calls run: the local worker while it takes them, else this
    process (from the first call it could not take until the end)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._client: WorkerClient | None = None
        self._key: str | None = None
        self._in_process: Calls | None = None
        self._loop: Any = None
        self._use_worker = self._worker_wanted()
        self._tty = sys.stderr.isatty()
        self._why_not: str | None = None  # why calls run here although the worker is wanted
        self._bar: Any = None

    @staticmethod
    def _worker_wanted() -> bool:
        from ..localworker.client import switch

        return switch() is True  # not a valid bool: in-process, where the settings report it

    # -- the local worker ---------------------------------------------------------------

    def _worker(self, *, fresh: bool = False) -> WorkerClient:
        from ..localworker.client import open_worker
        from ..localworker.identity import daemon_key

        if fresh and self._client is not None:
            self._client.close()
            self._client = None
        if self._client is None:
            if self._key is None:
                self._key = daemon_key(self.backend)
            self._client = open_worker(self._key, self.backend)
        return self._client

    def _via_worker(
        self, tool: str, arguments: Any, workspace: str, call_id: str | None, check_unknown: bool
    ) -> tuple[int, dict[str, Any]] | None:
        """The call through the local worker; None when it must run in-process."""
        from ..localworker.client import RETRY_SAFE, Lost, Retry, Unavailable
        from . import verbosity

        for attempt in range(2):
            try:
                return self._worker(fresh=attempt > 0).call(
                    tool,
                    arguments,
                    workspace,
                    call_id,
                    check_unknown=check_unknown,
                    on_log=_log_line,
                    tty=self._tty,
                    log_floor=verbosity.level(),
                    on_pull=self._on_pull,
                )
            except Retry as e:  # nothing ran: once more with a fresh worker
                why = f"the local worker asked for a fresh one twice ({e})"
            except Unavailable as e:
                why = str(e)
                break
            except Lost as e:
                if self._client is not None:
                    self._client.close()
                    self._client = None  # the next call starts a fresh worker
                if tool in RETRY_SAFE:  # it only reads: run it here instead
                    why = f"the local worker was lost during a read-only call ({e}); run again here"
                    break
                return 1, fail_dict(
                    "Local worker lost (infrastructure failure, not a problem with the tool call; retry "
                    f"later): {e}. The call may or may not have taken effect; `loom-worker log` shows what "
                    "it recorded",
                    {"error_kind": "infrastructure", "exception": "LocalWorkerLost"},
                )
        self._fall_back(why)
        return None

    # -- in this process ------------------------------------------------------------------

    def _fall_back(self, why: str) -> None:
        self._use_worker = False
        if self._client is not None:
            self._client.close()
            self._client = None
        self._why_not = why

    def _calls(self) -> Calls:
        if self._in_process is None:
            import asyncio

            from ..localworker.calls import Calls
            from . import verbosity
            from .common import load_settings

            settings = load_settings()
            # Before the registry is built: building it may log (a custom tool file that
            # does not load), and stdout carries only results.
            verbosity.configure(settings)
            if self._why_not:
                from sandbox.logs import get_logger

                get_logger("worker.cli").info("cli.local_worker_unavailable", reason=self._why_not)
            try:
                import uvloop

                self._loop = asyncio.Runner(loop_factory=uvloop.new_event_loop)
            except ImportError:  # pragma: no cover - uvloop is installed wherever the worker is
                self._loop = asyncio.Runner()
            self._in_process = Calls(settings, self.backend)
        return self._in_process

    # -- both --------------------------------------------------------------------------------

    def call(
        self, tool: str, arguments: Any, workspace: str, call_id: str | None, *, check_unknown: bool = True
    ) -> tuple[int, dict[str, Any]]:
        """Run one call; its exit code and result dict. Never raises but on interrupts."""
        if self._use_worker:
            done = self._via_worker(tool, arguments, workspace, call_id, check_unknown)
            if done is not None:
                return done
        calls = self._calls()
        code, result = self._loop.run(
            _showing_pulls(
                calls.execute(tool, arguments, workspace, call_id, check_unknown=check_unknown), self._on_pull
            )
        )
        return code, result

    def _on_pull(self, event: Any) -> None:
        """Draw an image pull the call waits for (:mod:`worker.cli.pullbar`, imported only
        when a pull happens)."""
        if self._bar is None:
            from .pullbar import PullBar

            self._bar = PullBar()
        self._bar(event)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._in_process is not None:
            try:
                self._loop.run(self._in_process.aclose())
            finally:
                self._loop.close()


async def _showing_pulls(call: Any, bar: Any) -> Any:
    """Run ``call`` with ``bar`` drawing the image pulls it waits for (this process's)."""
    from sandbox.pulls import PULL_SINK

    PULL_SINK.set(bar)
    return await call


def _runner(args: argparse.Namespace) -> Runner | int:
    """The runner for ``call``/``batch``, or the exit code of a usage error."""
    backend = getattr(args, "backend", "docker")
    if refused := unsafe_local_refused(backend):
        return _usage(refused)
    return Runner(backend)


# -- call --------------------------------------------------------------------------------

#: ``call``'s options as :func:`parse_call_fast` knows them (see :func:`_register_call`;
#: the verbosity flags are :data:`worker.cli.verbosity.FLAGS`).
_CALL_OPTIONS = {
    "--workspace": "workspace",
    "-w": "workspace",
    "--args": "args",
    "-a": "args",
    "--call-id": "call_id",
    "--backend": "backend",
}


def parse_call_fast(argv: list[str]) -> argparse.Namespace | None:
    """``call``'s arguments in their usual forms (``TOOL``, ``--workspace DIR`` or
    ``--workspace=DIR``, ``-w DIR``, ``--args``, ``--call-id``, in any order), parsed
    without argparse, whose import and set-up cost about 5 ms of a 30 ms call. None for
    anything else (``--help``, an abbreviation, a missing value, an error): argparse then
    parses it, with its messages. Where this returns a result, argparse's is the same
    (tests/unit/test_cli_args.py)."""
    from types import SimpleNamespace

    from .verbosity import FLAGS

    values: dict[str, str | None] = {"tool": None, "workspace": None, "args": "{}", "call_id": None}
    values["backend"] = "docker"
    verbose = 0
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg in FLAGS:
            verbose += FLAGS[arg]
        elif arg.startswith("-") and arg != "-":
            name, eq, value = arg.partition("=")
            dest = _CALL_OPTIONS.get(name)
            if dest is None or (eq and not name.startswith("--")):
                return None
            if not eq:
                if i == len(argv) or (argv[i].startswith("-") and argv[i] != "-"):
                    return None
                value = argv[i]
                i += 1
            if dest == "backend" and value not in ("docker", "local"):  # argparse checks each one
                return None
            values[dest] = value
        elif values["tool"] is None:
            values["tool"] = arg
        else:
            return None
    if values["tool"] is None or values["workspace"] is None:
        return None
    ns: Any = SimpleNamespace(command="call", func=_cmd_call, own_settings=True, verbose=verbose, **values)
    return ns


def _cmd_call(args: argparse.Namespace, _settings: Settings | None) -> int:
    arguments = read_arguments(args.args)
    if isinstance(arguments, str):
        return _usage(arguments)
    ws = _workspace(args.workspace)
    if ws is None:
        return _usage(f"--workspace {args.workspace} is not a directory")
    runner = _runner(args)
    if isinstance(runner, int):
        return runner
    try:
        code, result = runner.call(args.tool, arguments, ws, args.call_id)
    finally:
        runner.close()
    _print(result)
    return code


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


def _bounded_lines(stream: Any) -> Any:
    """The lines of ``stream`` (binary, or text where it has no buffer) as text; a line
    over the request limit (``worker.limits``) is that limit (an int) instead, its bytes
    skipped, never held."""
    from ..limits import max_request_bytes

    limit = max_request_bytes()
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        nl = b"\n" if isinstance(line, bytes) else "\n"
        if len(line) > limit and not line.endswith(nl):
            while (rest := stream.readline(1 << 20)) and not rest.endswith(nl):
                pass
            yield limit
            continue
        yield line.decode("utf-8", "replace") if isinstance(line, bytes) else line


def _cmd_batch(args: argparse.Namespace, _settings: Settings | None) -> int:
    ws = _workspace(args.workspace)
    if ws is None:
        return _usage(f"--workspace {args.workspace} is not a directory")
    runner = _runner(args)
    if isinstance(runner, int):
        return runner
    all_ok = True
    try:
        for n, line in enumerate(_bounded_lines(getattr(sys.stdin, "buffer", sys.stdin)), 1):
            if isinstance(line, str) and not line.strip():
                continue
            try:
                if isinstance(line, int):
                    from ..limits import too_large

                    raise ValueError(too_large(line))
                call_id, tool, arguments = _parse_line(line)
            except ValueError as e:
                result = fail_dict(f"Invalid batch line {n}: {e}")
                call_id = None
            else:
                cid = None if call_id is None else str(call_id)
                _code, result = runner.call(tool, arguments, ws, cid, check_unknown=False)
            all_ok = all_ok and bool(result["success"])
            _print({"id": call_id, **result})
    finally:
        runner.close()
    return 0 if all_ok else 1


# -- tools -------------------------------------------------------------------------------


def _cmd_tools(args: argparse.Namespace, _settings: Settings | None) -> int:
    from ..registry import ToolRegistry

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
    import argparse

    p.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)


def register(subparsers: argparse._SubParsersAction[Any], only: str | None = None) -> None:
    """Add ``call``, ``batch`` and ``tools`` (with ``only``: that one command)."""
    if only in (None, "call"):
        _register_call(subparsers)
    if only in (None, "batch"):
        _register_batch(subparsers)
    if only is None:
        _register_tools(subparsers)


def _register_call(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "call",
        help="Run one tool call and print its ToolResult JSON.",
        description="Run one tool call in the workspace's sandbox and print its ToolResult as one JSON line. Every "
        "change it makes is recorded in the workspace's changelog first (loom-worker undo reverts it).",
        epilog="Exit status: 0 the tool succeeded; 1 it failed (an infrastructure failure included: "
        'data.error_kind is "infrastructure"); 2 usage error (bad --args: not JSON, or not what the tool\'s '
        "schema takes, the ToolResult naming the field; unknown tool; missing workspace; a LOOM_* value that does "
        "not validate).",
    )
    p.add_argument("tool", help="Tool name, e.g. read_file.")
    p.add_argument("--workspace", "-w", required=True, help="Workspace directory.")
    p.add_argument(
        "--args",
        "-a",
        default="{}",
        help="Arguments: a JSON object, @FILE (read from FILE) or - (read from standard input). Default {}.",
    )
    p.add_argument("--call-id", default=None, help="Id recorded with the call (changelog, logs).")
    _add_backend(p)
    p.set_defaults(func=_cmd_call, own_settings=True)


def _register_batch(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "batch",
        help="Run JSON Lines tool calls from stdin; one result per line on stdout.",
        description='Each stdin line: {"tool": ..., "arguments": {...}, "id": ...}. One result line each, '
        'in order, with its "id".',
        epilog="Exit status: 0 every call succeeded; 1 one failed (or a line was not a valid call); 2 usage error.",
    )
    p.add_argument("--workspace", "-w", required=True, help="Workspace directory.")
    _add_backend(p)
    p.set_defaults(func=_cmd_batch, own_settings=True)


def _register_tools(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "tools",
        help="Print the tool schemas (and more with subcommands).",
        description="Print every tool's schema (catalog tools included) as JSON, in a vendor's format.",
        epilog="Exit status: 0; 2 usage error.",
    )
    p.add_argument("--format", "-f", choices=SCHEMA_FORMATS, default="openai", help="Schema format.")
    p.set_defaults(func=_cmd_tools)
    group = p.add_subparsers(dest=TOOLS_COMMAND_DEST, metavar="SUBCOMMAND", parser_class=type(p))
    p._loom_tools_subparsers = group
