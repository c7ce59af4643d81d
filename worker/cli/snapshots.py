"""``loom-worker snapshot create|list|show|delete``, ``fork`` and ``restore`` (issue 29).

``snapshot create`` prints the new snapshot's id on stdout, ``fork`` each new workspace's
directory on its own line, so a script can use them as they are. Exit codes: 0 ok, 1 the
operation failed or was refused (a limit, a full disk, live forks without ``--force``, a
step of a restore), 2 a usage error (no such directory or snapshot, a bad count).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from .common import path_arg

if TYPE_CHECKING:
    from ..settings import Settings
    from ..snapshots import Snapshot, Snapshots


def _usage(message: str) -> int:
    print(f"loom-worker: error: {message}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from .. import aio

    return aio.run(_dispatch(args, settings))


async def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    from sandbox.errors import SandboxError

    from ..changelog import ChangelogError
    from ..registry import default_registry
    from ..snapshots import SnapshotError, SnapshotNotFoundError, Snapshots

    async with default_registry(settings, catalog=False) as registry:
        snaps = Snapshots.from_settings(registry, settings)
        try:
            return int(await args.handler(args, snaps))
        except SnapshotNotFoundError as e:
            return _usage(str(e))
        except (NotADirectoryError, FileExistsError, ValueError) as e:
            return _usage(str(e))
        except (SnapshotError, ChangelogError, SandboxError, OSError) as e:
            print(f"loom-worker {args.command}: {e}", file=sys.stderr)
            return 1
        finally:
            snaps.close()


def _when(ts: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _line(s: Snapshot) -> str:
    from ..changelog.model import size_text

    forks = f"{len(s.live_forks)} fork(s)" if s.live_forks else "no forks"
    name = f" {s.name}" if s.name else ""
    gone = "  [deleted]" if s.deleted else ""
    return f"{s.id}{name}  {_when(s.created)}  {s.files} files, {size_text(s.bytes)}  {s.strategy}  {forks}{gone}"


async def _create(args: argparse.Namespace, snaps: Snapshots) -> int:
    snap = await snaps.create(args.workspace, args.name, with_scratch=args.with_scratch)
    print(snap.id)
    return 0


async def _list(args: argparse.Namespace, snaps: Snapshots) -> int:
    found = await snaps.list(args.workspace, deleted=args.all)
    for s in [await snaps.shown(s) for s in found]:
        print(s.model_dump_json() if args.json else _line(s))
    return 0


async def _show(args: argparse.Namespace, snaps: Snapshots) -> int:
    s = await snaps.shown(await snaps.get(args.snapshot, args.workspace))
    if args.json:
        print(s.model_dump_json(indent=2))
        return 0
    print(_line(s))
    print(f"workspace  {s.workspace}")
    print(f"parent     {s.parent or '-'}")
    print(f"changelog  at entry {s.changelog_entry}")
    print(f"settings   {json.dumps(s.settings, sort_keys=True) if s.settings else '(defaults)'}")
    print(f"scratch    {'yes' if s.with_scratch else 'no'}")
    for f in s.forks:
        print(f"fork       {f}{'' if f in s.live_forks else '  (gone)'}")
    for c in s.children:
        print(f"child      {c}")
    return 0


async def _delete(args: argparse.Namespace, snaps: Snapshots) -> int:
    from ..snapshots import SnapshotInUseError

    try:
        left = await snaps.delete(args.snapshot, force=args.force, workspace=args.workspace)
    except SnapshotInUseError as e:
        print(f"loom-worker snapshot: {e}", file=sys.stderr)
        return 1
    print(f"deleted {args.snapshot}", file=sys.stderr)
    for f in left:
        print(f"left live fork {f} (independent; its origin is now a deleted snapshot)", file=sys.stderr)
    return 0


async def _delete_fork(args: argparse.Namespace, snaps: Snapshots) -> int:
    for f in args.forks:
        await snaps.remove_fork(f)
        print(f"deleted fork {f}", file=sys.stderr)
    return 0


async def _fork(args: argparse.Namespace, snaps: Snapshots) -> int:
    ref = args.snapshot
    if ref is None:  # from the live workspace: a snapshot first
        ref = (await snaps.create(args.workspace, "fork-base")).id
        print(f"snapshot {ref}", file=sys.stderr)
    forks = await snaps.fork(ref, args.count, into=args.into, workspace=args.workspace)
    # An overlay fork's tree shows on the host while its sandbox runs: a user who asked for
    # directories gets them filled (the sandbox starts now, not at the first call).
    await snaps.mount_all(forks)
    for d in forks:
        print(d)
    return 0


async def _restore(args: argparse.Namespace, snaps: Snapshots) -> int:
    done = await snaps.restore(args.workspace, args.snapshot, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(done.as_dict()))
    else:
        if done.dry_run:
            sys.stdout.write(done.plan.diff)
        p = done.plan
        print(
            f"{'would restore' if done.dry_run else 'restored'} {done.snapshot}: {len(p.created)} created, "
            f"{len(p.modified)} changed, {len(p.removed)} removed",
            file=sys.stderr,
        )
        if done.call_id:
            print(f"undo with: loom-worker undo --workspace {args.workspace} --call {done.call_id}", file=sys.stderr)
        for f in p.failed:
            print(f"failed: {f}", file=sys.stderr)
    return 1 if done.plan.failed else 0


def register(sub: Any) -> None:
    p = sub.add_parser("snapshot", help="Take, list, show or delete snapshots of workspaces; delete forks.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    q = actions.add_parser(
        "create",
        help="Snapshot a workspace; prints its id.",
        epilog="Exit status: 0 taken (its id on stdout); 1 refused or failed (a limit, the disk, the sandbox), "
        "nothing kept; 2 usage error (no such workspace directory).",
    )
    q.add_argument("--workspace", "-w", required=True, type=path_arg, help="The workspace directory.")
    q.add_argument("name", nargs="?", help="A name for it.")
    q.add_argument("--with-scratch", action="store_true", help="Also keep the sandbox's /tmp and $HOME.")
    q.set_defaults(func=_run, handler=_create)
    q = actions.add_parser(
        "list",
        help="List snapshots (of one workspace with --workspace).",
        epilog="Exit status: 0; 1 the snapshot store cannot be read; 2 usage error.",
    )
    q.add_argument("--workspace", "-w", type=path_arg, help="Only this workspace's.")
    q.add_argument("--all", action="store_true", help="Deleted ones too.")
    q.add_argument("--json", action="store_true", help="One JSON object per line.")
    q.set_defaults(func=_run, handler=_list)
    for name, text in (("show", "Show a snapshot: size, files, parent, forks."), ("delete", "Delete a snapshot.")):
        q = actions.add_parser(
            name,
            help=text,
            epilog="Exit status: 0; 1 "
            + ("the store cannot be read" if name == "show" else "refused: forks of it live (--force), or it failed")
            + "; 2 usage error (no such snapshot).",
        )
        q.add_argument("snapshot", help="Its id, or its name (with --workspace).")
        q.add_argument("--workspace", "-w", type=path_arg, help="Look the name up among this workspace's.")
        if name == "show":
            q.add_argument("--json", action="store_true", help="Print JSON.")
            q.set_defaults(func=_run, handler=_show)
        else:
            q.add_argument("--force", action="store_true", help="Even with live forks (they stay).")
            q.set_defaults(func=_run, handler=_delete)

    q = actions.add_parser(
        "delete-fork",
        help="Delete forks: sandbox, files (an overlay fork's volume and layers), changelog and record.",
        epilog="Exit status: 0 every one deleted; 1 the engine refused or failed; 2 usage error (not a fork).",
    )
    q.add_argument("forks", nargs="+", type=path_arg, help="The forks' directories (as `fork` printed them).")
    q.set_defaults(func=_run, handler=_delete_fork)

    p = sub.add_parser(
        "fork",
        help="Make N independent workspaces from a snapshot; prints their directories.",
        epilog="Exit status: 0 every fork made (one directory per line on stdout); 1 failed (the disk, a limit, "
        "the sandbox), no partial fork left; 2 usage error (no such snapshot or workspace, a bad --count).",
    )
    p.add_argument("--workspace", "-w", required=True, type=path_arg, help="The workspace (its snapshot's names).")
    p.add_argument("--snapshot", help="The snapshot (id or name); none: snapshot the workspace first.")
    p.add_argument("--count", "-n", type=int, default=1, help="How many forks (1-64).")
    p.add_argument("--into", type=path_arg, help="Their parent directory (default: beside the workspace).")
    p.set_defaults(func=_run, handler=_fork)

    p = sub.add_parser(
        "restore",
        help="Put a workspace back to a snapshot (recorded: undo reverts it).",
        epilog="Exit status: 0 restored (or, with --dry-run, the diff printed); 1 some paths could not be "
        "restored (listed) or it failed; 2 usage error (no such snapshot or workspace).",
    )
    p.add_argument("--workspace", "-w", required=True, type=path_arg, help="The workspace directory.")
    p.add_argument("--snapshot", required=True, help="The snapshot (id or name).")
    p.add_argument("--dry-run", action="store_true", help="Print the diff it would apply; change nothing.")
    p.add_argument("--json", action="store_true", help="Print the result as JSON.")
    p.set_defaults(func=_run, handler=_restore)
