"""``loom-worker log``, ``diff`` and ``undo``: the workspace changelog from the command line.

``log`` reads only the changelog store; ``diff`` and ``undo`` read and write the workspace
through its sandbox (the running one, reached with the workspace's own settings; started
if needed), never from the host. Exit codes: 0 ok, 1 the undo
was refused (conflict, tampered entry) or a step failed, 2 usage error.

Test-only: ``--backend local`` (hidden, needs ``LOOM_ALLOW_UNSAFE_LOCAL=1``) uses the
no-isolation ``LocalProcessBackend`` so CLI tests run without Docker.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .common import unsafe_local_refused

if TYPE_CHECKING:  # imported when a command runs: --help and `call` must not pay for them
    from pathlib import Path

    from sandbox.base import Sandbox

    from ..changelog import Changelog, Entry, Group
    from ..settings import Settings

T = TypeVar("T")


def _usage(message: str) -> int:
    print(f"loom-worker: error: {message}", file=sys.stderr)
    return 2


def _with_sandbox(
    args: argparse.Namespace,
    settings: Settings,
    ws: Path,
    fn: Callable[[Changelog, Sandbox], Awaitable[T]],
    *,
    mutates: bool = False,
) -> T:
    """``fn(changelog, sandbox)`` with the workspace's running sandbox, reached with the
    workspace's own settings (``mutates``: as a change, which the host's guard looks at)."""
    from .. import aio
    from ..changelog import Changelog

    if getattr(args, "backend", "docker") == "local":
        if refused := unsafe_local_refused("local"):
            raise SystemExit(_usage(refused))
        from sandbox.local import LocalProcessBackend

        async def run_local() -> T:
            backend = LocalProcessBackend()
            try:
                async with Changelog.open(settings.data_dir, ws, limits=settings.changelog_limits()) as cl:
                    return await fn(cl, await backend.get(ws))
            finally:
                await backend.aclose()

        return aio.run(run_local())

    from .common import workspace_registry

    async def run() -> T:
        async with workspace_registry(settings) as registry:
            w = await registry.workspace(ws)
            async with Changelog.open(settings.data_dir, ws, limits=settings.changelog_limits()) as cl:
                if not mutates:
                    return await fn(cl, w.sandbox)
                async with w.mutating():
                    return await fn(cl, w.sandbox)

    return aio.run(run())


def _workspace(value: str) -> Path | None:
    from pathlib import Path

    path = Path(value).expanduser().resolve()
    return path if path.is_dir() else None


def _line(e: Entry) -> str:
    import datetime

    ts = datetime.datetime.fromtimestamp(e.ts).strftime("%Y-%m-%d %H:%M:%S")
    path = f"{e.path} -> {e.new_path}" if e.new_path else e.path
    if e.is_group:
        path += "/*"  # paths under it, its members
    elif e.op in ("create", "delete") and "dir" in (e.before_kind, e.after_kind):
        path += "/"  # a directory made or removed, as ls -F shows one
    flags: list[str] = [e.state] if e.state != "applied" else []
    what = e.describe()
    if what:
        flags.insert(0, what)
    if e.reverted:
        flags.append(f"reverted by {e.reverted_by}")
    if e.reverts is not None:
        flags.append(f"reverts {e.reverts}")
    if not e.restorable:
        flags.append("not restorable")
    ids = " ".join(
        x for x in (f"call={e.call_id}" if e.call_id else "", f"subtask={e.subtask_id}" if e.subtask_id else "") if x
    )
    extra = f"  [{', '.join(flags)}]" if flags else ""
    return f"{e.id:>6}  {ts}  {e.tool:<14} {e.op:<7} {path}  {ids}{extra}".rstrip()


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a positive number: {value!r}")
    return n


def _group_line(g: Group) -> str:
    """``log --groups``: which call (an agent's turn ``<process>.tN`` as ``turn N``), its
    tool and summary, how many entries and paths."""
    import datetime

    from ..quoting import quote_path

    ts = datetime.datetime.fromtimestamp(g.ts).strftime("%Y-%m-%d %H:%M:%S")
    call = g.call_id or f"entry {g.first}"
    head, _, n = call.rpartition(".t")
    name = f"turn {n} of {head}" if head and n.isdigit() else call
    what = f"{g.tool} {quote_path(g.summary)}" if g.summary else g.tool
    count = f"{len(g.entries)} entr{'y' if len(g.entries) == 1 else 'ies'}, {len(g.paths)} path(s)"
    flags = "  [reverted]" if g.reverted else ""
    return f"{g.first:>6}..{g.last:<6} {ts}  {name} ({what})  {count}{flags}"


def _cmd_log(args: argparse.Namespace, settings: Settings) -> int:
    from .. import aio
    from ..changelog import Changelog
    from ..quoting import unquote_path

    ws = _workspace(args.workspace)
    if ws is None:
        return _usage(f"--workspace {args.workspace} is not a directory")

    async def interrupted() -> int:
        async with Changelog.open(settings.data_dir, ws, limits=settings.changelog_limits()) as cl:
            return await cl.interrupted()

    if aio.run(interrupted()):
        # A worker died with a command running: record what it changed (through the
        # workspace's sandbox, as the next call would) before showing the log.
        from sandbox.errors import SandboxError

        from ..changelog import ChangelogError

        async def settle(cl: Changelog, box: Sandbox) -> object:
            return await cl.recover(box)

        try:
            _with_sandbox(args, settings, ws, settle)
        except (ChangelogError, SandboxError) as err:
            print(
                f"loom-worker log: a command was interrupted and its changes cannot be recorded now: {err}",
                file=sys.stderr,
            )
            return 1

    async def run() -> list[Entry]:
        async with Changelog.open(settings.data_dir, ws, limits=settings.changelog_limits()) as cl:
            path = None if args.path is None else unquote_path(args.path)
            origin = await cl.origin()
            if origin is not None and not args.json:  # a fork's history starts at its snapshot
                print(
                    f"# history starts at snapshot {origin['snapshot']} of {origin['workspace']} "
                    f"(its entry {origin['entry']})"
                )
            return await cl.log(path=path, call_id=args.call, subtask_id=args.subtask, limit=args.limit)

    if args.groups:
        if args.path is not None or args.call is not None or args.subtask is not None:
            return _usage("--groups takes no --path, --call or --subtask")

        async def groups() -> list[Group]:
            async with Changelog.open(settings.data_dir, ws, limits=settings.changelog_limits()) as cl:
                return await cl.groups(limit=args.limit)

        for g in aio.run(groups()):
            print(g.model_dump_json() if args.json else _group_line(g))
        return 0

    for found in aio.run(run()):
        shown = found.shown()  # odd file names quoted, as git shows them
        print(json.dumps(shown.model_dump(), ensure_ascii=False) if args.json else _line(shown))
    return 0


def _cmd_diff(args: argparse.Namespace, settings: Settings) -> int:
    from sandbox.errors import SandboxError

    from ..changelog import ChangelogError
    from ..quoting import unquote_path
    from ..result import safe_text

    ws = _workspace(args.workspace)
    if ws is None:
        return _usage(f"--workspace {args.workspace} is not a directory")

    if args.format == "patch":
        return _diff_patch(args, settings, ws)

    async def run(cl: Changelog, box: Sandbox) -> str:
        if args.summary:
            return (await cl.summary()).shown().model_dump_json(indent=2) + "\n"
        return safe_text(await cl.diff(box, None if args.path is None else unquote_path(args.path)))

    try:
        sys.stdout.write(_with_sandbox(args, settings, ws, run))
    except (ChangelogError, SandboxError) as e:
        print(f"loom-worker diff: {e}", file=sys.stderr)
        return 1
    return 0


def _diff_patch(args: argparse.Namespace, settings: Settings, ws: Path) -> int:
    """``diff --format patch``: the session as one ``git am``-able mail (worker.handoff)."""
    from sandbox.errors import SandboxError

    from ..changelog import ChangelogError
    from ..handoff import HandoffError
    from ..handoff.export import parse_identity
    from ..handoff.patch import DEFAULT_AUTHOR, make_patch

    if args.path is not None or args.summary:
        return _usage("--format patch takes neither a path nor --summary")
    author = args.author or DEFAULT_AUTHOR
    try:
        parse_identity(author)
    except ValueError as e:
        return _usage(f"--author: {e}")

    async def run(cl: Changelog, box: Sandbox) -> tuple[str, list[str]]:
        text, changes = await make_patch(cl, box, message=args.message, author=author)
        return text, changes.skipped

    try:
        text, skipped = _with_sandbox(args, settings, ws, run)
    except (HandoffError, ChangelogError, SandboxError) as e:
        print(f"loom-worker diff: {e}", file=sys.stderr)
        return 1
    for s in skipped:
        print(f"loom-worker diff: not in the patch: {s}", file=sys.stderr)
    sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    sys.stdout.flush()
    return 0


def _cmd_undo(args: argparse.Namespace, settings: Settings) -> int:
    from sandbox.errors import SandboxError

    from ..changelog import ChangelogError, UndoConflictError, UndoRefusedError

    ws = _workspace(args.workspace)
    if ws is None:
        return _usage(f"--workspace {args.workspace} is not a directory")

    async def run(cl: Changelog, box: Sandbox) -> Any:
        return await cl.undo(
            box,
            entry=args.entry,
            call_id=args.call,
            subtask_id=args.subtask,
            to=args.to,
            all=args.all,
            last=args.last,
            dry_run=args.dry_run,
            force=args.force,
        )

    try:
        result = _with_sandbox(args, settings, ws, run, mutates=not args.dry_run)
    except UndoConflictError as e:
        print(f"loom-worker undo: {e}", file=sys.stderr)
        return 1
    except (UndoRefusedError, ChangelogError, SandboxError) as e:
        print(f"loom-worker undo: {e}", file=sys.stderr)
        return 1
    result = result.shown()
    if args.json:
        print(result.model_dump_json())
    else:
        if result.dry_run:
            sys.stdout.write(result.diff)
        for s in result.steps:
            tail = f" (undo entry {s.undo_entry_id})" if s.undo_entry_id else ""
            tail += f": {s.message}" if s.message else ""
            print(f"entry {s.entry_id} {s.path}: {s.status}{tail}", file=sys.stderr)
            for p in s.paths:  # each path that cannot be put back, one a line
                print(f"  not restorable: {p}", file=sys.stderr)
    return 1 if result.failed and any(s.status == "failed" for s in result.failed) else 0


def _cmd_repair(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from ..changelog.repair import repair

    ws = _workspace(args.workspace)
    if ws is None:
        return _usage(f"--workspace {args.workspace} is not a directory")
    try:
        report = asyncio.run(asyncio.to_thread(repair, settings.data_dir, ws, force=args.force))
    except OSError as e:
        print(f"loom-worker repair: {e}", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line)
    return 0


def register(sub: Any) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--workspace", "-w", required=True, help="The workspace directory.")
        p.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)

    p = sub.add_parser(
        "log",
        help="List the workspace's recorded changes.",
        epilog="Exit status: 0; 1 the changelog is damaged, or a command a dead worker left running could not be "
        "recorded; 2 usage error.",
    )
    common(p)
    p.add_argument("--path", help="Only entries for this workspace-relative path.")
    p.add_argument("--call", help="Only entries of this call id.")
    p.add_argument("--subtask", help="Only entries of this subtask id.")
    p.add_argument("--limit", type=int, help="Only the last N entries (with --groups: groups).")
    p.add_argument(
        "--groups", action="store_true", help="One line per group (a call, an agent's turn) with its tool name."
    )
    p.add_argument("--json", action="store_true", help="One JSON object per line.")
    p.set_defaults(func=_cmd_log)

    p = sub.add_parser(
        "diff",
        help="Cumulative unified diff of the recorded changes.",
        epilog="Exit status: 0; 1 the changelog or the sandbox failed; 2 usage error.",
    )
    common(p)
    p.add_argument("path", nargs="?", help="Only this workspace-relative path.")
    p.add_argument("--summary", action="store_true", help="Created/modified/deleted/renamed paths as JSON.")
    p.add_argument(
        "--format",
        choices=("unified", "patch"),
        default="unified",
        help="unified (default): the cumulative diff to read; patch: one mail-format patch of the whole session "
        "that `git am` and `git apply` take (binary files, modes, renames, symlinks).",
    )
    p.add_argument(
        "--message", "-m", metavar="M", help="With --format patch: the commit message (first line: subject)."
    )
    p.add_argument("--author", metavar="'NAME <MAIL>'", help="With --format patch: the From: of the patch.")
    p.set_defaults(func=_cmd_diff)

    p = sub.add_parser(
        "undo",
        help="Revert recorded changes, newest first.",
        epilog="Exit status: 0 reverted (or nothing to do); 1 refused (a file changed since: --force; a tampered "
        "entry), a step failed, or the sandbox failed; 2 usage error.",
    )
    common(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--entry", type=int, metavar="N", help="One entry.")
    which.add_argument("--call", metavar="ID", help="Every entry of a call id.")
    which.add_argument("--subtask", metavar="S", help="Every entry of a subtask.")
    which.add_argument("--to", type=int, metavar="N", help="Everything after entry N (0 = everything).")
    which.add_argument("--all", action="store_true", help="Everything.")
    which.add_argument(
        "--last", type=_positive, metavar="N", help="The last N groups not yet reverted (calls, an agent's turns)."
    )
    p.add_argument("--dry-run", action="store_true", help="Print the diff it would apply; change nothing.")
    p.add_argument("--force", action="store_true", help="Overwrite files that changed since the entry.")
    p.add_argument("--json", action="store_true", help="Print the result as JSON.")
    p.set_defaults(func=_cmd_undo)

    p = sub.add_parser(
        "repair",
        help="Make a damaged changelog whole again, keeping what is readable.",
        description="Moves the damaged database aside (kept as changelog.sqlite3.damaged-<time>) and writes a new "
        "one with every row still readable; says what was kept and what was lost. A healthy changelog is left "
        "alone (--force repairs it anyway).",
        epilog="Exit status: 0 repaired or healthy; 1 the files could not be moved or written; 2 usage error.",
    )
    p.add_argument("--workspace", "-w", required=True, help="The workspace directory.")
    p.add_argument("--force", action="store_true", help="Rewrite the changelog even when it opens.")
    p.set_defaults(func=_cmd_repair)
