"""``loom-worker shell -w DIR [-- CMD [ARG...]]``: an interactive terminal in the
workspace's sandbox, as ``docker exec -it`` gives one; ``--attach ID`` reattaches,
``--list`` lists, ``--kill ID`` ends one. See docs/terminals.md.

The terminal is the core's (:mod:`worker.terminals`): a program on a pseudo-terminal in the
sandbox (the sandbox user's login shell unless a command is given), with the sandbox's
limits, that outlives this client. Our own terminal is put in raw mode, so every key goes to
it as typed (Ctrl-C is byte 0x03, a SIGINT for the program in the sandbox's foreground);
its size follows ours. What it changes in the workspace is recorded in the changelog as
the terminal's (call id ``term-...``) each time it settles.

**Detach**: ``~.`` at the start of a line (after Enter) leaves the terminal running and
prints its id and how to reattach (``~~`` types one ``~``), as ssh's escape; ``--no-escape``
turns it off. Killing this process, or closing its window, detaches too.

**Without a terminal** (standard input a pipe or a file), as ``docker exec -i``: no raw
mode; the size is ``--size COLSxROWS`` or 80x24; the bytes of our input are typed as they
come and its end is typed as Ctrl-D (the end of input for the program reading the
terminal: a shell exits) once the terminal is quiet, and again while the program runs on
quiet; a SIGINT here is passed on as Ctrl-C's would be. The terminal in
the sandbox still echoes what is typed and ends lines with CR LF, as any terminal does:
for a plain command's output use ``loom-worker exec``.

Exit codes: the program's own; 128+N a signal N ended it; 0 detached; 129/143 this client
got SIGHUP/SIGTERM (the terminal goes on); 1 no such terminal, or too many background
processes; 125 the sandbox cannot be started or the stream to it broke; 126 refused by the
command policy; 2 usage error.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from ..settings import Settings
    from .termsession import Options

PROG = "loom-worker shell"


def _usage(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def command_argv(words: list[str]) -> list[str]:
    """The argv a terminal runs for the words after ``--``, as ``exec`` reads them: one
    word is a shell command (``sh -c``), several are a program and its arguments."""
    return ["/bin/sh", "-c", words[0]] if len(words) == 1 else list(words)


def parse_env(items: list[str] | None) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict. Raises ValueError naming the bad one."""
    env: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key or "\x00" in item:
            raise ValueError(f"--env {item!r}: use KEY=VALUE")
        env[key] = value
    return env


def options(args: argparse.Namespace, prog: str) -> Options | str:
    """The session's options from ``args`` (``shell``'s or ``exec -t``'s), or a usage
    message."""
    from .localterm import parse_size
    from .termsession import Options

    words = list(args.cmd or [])
    if words and words[0] == "--":
        words = words[1:]
    if words and (not all(words) or any("\x00" in w for w in words)):
        return "a word of the command is empty or holds a NUL byte"
    ws = os.path.realpath(os.path.expanduser(args.workspace))
    if not os.path.isdir(ws):
        return f"--workspace {args.workspace} is not a directory"
    try:
        env = parse_env(args.env)
        size = parse_size(args.size) if args.size else None
    except ValueError as e:
        return str(e)
    if args.cwd.startswith("/"):
        return f"--cwd {args.cwd}: a terminal starts in the workspace (a relative directory)"
    return Options(
        prog=prog,
        workspace=ws,
        command=command_argv(words) if words else None,
        cwd=args.cwd,
        env=env,
        size=size,
        escape=not args.no_escape,
    )


def _cmd_shell(args: argparse.Namespace, _settings: Settings | None) -> int:
    from . import termsession

    chosen = [o for o, v in (("--list", args.list), ("--kill", args.kill), ("--attach", args.attach)) if v]
    if len(chosen) > 1:
        return _usage(f"{' and '.join(chosen)} do not go together")
    opts = options(args, PROG)
    if isinstance(opts, str):
        return _usage(opts)
    if chosen and (opts.command is not None or opts.env or args.cwd != "."):
        return _usage(f"{chosen[0]} takes no command, --env or --cwd (they are a new terminal's)")
    if args.list or args.kill:
        return _listing(opts.workspace, args.kill)
    opts.attach = args.attach
    return termsession.run(opts)


# -- --list, --kill ------------------------------------------------------------------------------


def listing_lines(terminals: list[Any], now: float) -> list[str]:
    """The table ``--list`` prints: id, state, size, age, command."""
    rows = [("ID", "STATE", "SIZE", "AGE", "COMMAND")]
    for t in terminals:
        state = "running" if t.running else f"ended {t.exit_code}" if t.outcome == "exit" else f"ended ({t.outcome})"
        size = f"{t.pty[0]}x{t.pty[1]}" if t.pty else "-"
        rows.append((t.id, state, size, _age(now - t.started), t.command or "login shell"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows]


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _listing(workspace: str, kill: str | None) -> int:
    """``--list`` (exit 0) or ``--kill ID`` (0; 1 no such terminal); 125 the sandbox
    cannot be started."""
    import asyncio
    import time

    from sandbox.errors import AgentError, SandboxError

    from . import verbosity
    from .common import load_settings

    settings = load_settings()
    verbosity.configure(settings)

    async def run() -> int:
        from ..registry import default_registry

        async with default_registry(settings, catalog=False) as registry:
            handle = registry.sandbox(workspace)
            try:
                if kill is not None:
                    info = await handle.kill_terminal(kill)
                    print(f"{info.id}: ended ({info.outcome or 'killed'}, exit code {info.exit_code})")
                else:
                    for line in listing_lines(await handle.terminals(), time.time()):
                        print(line)
            except AgentError as e:
                print(f"{PROG}: {e}", file=sys.stderr)
                return 1
            except (SandboxError, NotImplementedError, OSError) as e:
                print(f"{PROG}: the sandbox is unavailable: {e}", file=sys.stderr)
                return 125
        return 0

    return asyncio.run(run())


def add_terminal_options(p: argparse.ArgumentParser) -> None:
    """``--size`` and ``--no-escape``: ``shell``'s and ``exec -t``'s."""
    p.add_argument(
        "--size",
        metavar="COLSxROWS",
        help="A fixed terminal size (default: ours, followed as it changes; 80x24 without a terminal).",
    )
    p.add_argument(
        "--no-escape",
        action="store_true",
        help="No detach escape: '~.' after Enter is typed like anything else.",
    )


def register(subparsers: Any) -> None:
    import argparse

    p = subparsers.add_parser(
        "shell",
        help="An interactive terminal in the sandbox (as docker exec -it); detach with ~. after Enter.",
        description=(
            "Open a terminal in the workspace's sandbox running CMD (default: the sandbox user's login shell), "
            "with our terminal in raw mode: every key goes to it, its size follows ours. Several words are a "
            "program and its arguments; one word is a shell command. It outlives this client: '~.' after Enter "
            "detaches (as ssh's escape; '~~' types '~'), --attach reattaches with its recent output replayed. "
            "What it changes in the workspace is recorded as the terminal's (call id term-...). Without a terminal "
            "on standard input it works as docker exec -i: input typed as it comes, its end as Ctrl-D."
        ),
        epilog="Exit status: the program's own; 128+N a signal N ended it; 0 detached (or --list/--kill done); "
        "129/143 this client got SIGHUP/SIGTERM (the terminal goes on); 1 no such terminal, or too many background "
        "processes; 125 the sandbox cannot be started or the stream to it broke; 126 refused by policy; 2 usage "
        "error.",
    )
    p.add_argument("--workspace", "-w", required=True, help="Workspace directory.")
    p.add_argument("--attach", metavar="ID", help="Reattach to terminal ID (term-...): its recent output replayed.")
    p.add_argument("--list", action="store_true", help="List the workspace's terminals (running or recently ended).")
    p.add_argument("--kill", metavar="ID", help="End terminal ID and everything it started.")
    p.add_argument("--cwd", default=".", help="Working directory, relative to the workspace (default: its root).")
    p.add_argument("--env", "-e", action="append", metavar="KEY=VALUE", help="A variable of the program (repeatable).")
    add_terminal_options(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]", help="The program (default: a shell).")
    p.set_defaults(func=_cmd_shell, own_settings=True)
