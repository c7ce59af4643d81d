"""``loom-worker export`` and ``report``: a session's result handed to the next step.

``export --branch NAME`` commits the session's changes on a new branch of the workspace's
repository with the host's git (after :mod:`worker.handoff.tamper` found nothing git
would run changed during the session); ``report`` writes Markdown (or ``--json``). The
patch is ``loom-worker diff --format patch`` (:mod:`worker.cli.changelog`).
Exit codes: 0 ok, 1 refused or failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.base import Sandbox

    from ..changelog import Changelog
    from ..settings import Settings


def _usage(message: str, command: str) -> int:
    print(f"loom-worker {command}: error: {message}", file=sys.stderr)
    return 2


def _cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    from sandbox.errors import SandboxError

    from ..changelog import ChangelogError
    from ..handoff import HandoffError, TamperedError
    from ..handoff.export import check_branch, export, parse_identity
    from ..handoff.patch import DEFAULT_AUTHOR, DEFAULT_SUBJECT, session_body
    from ..handoff.state import collect, current
    from ..handoff.tamper import tampering
    from .changelog import _with_sandbox, _workspace

    ws = _workspace(args.workspace)
    if ws is None:
        return _usage(f"--workspace {args.workspace} is not a directory", "export")
    try:
        check_branch(args.branch)
    except ValueError as e:
        return _usage(f"--branch: {e}", "export")
    try:
        who = parse_identity(args.author or DEFAULT_AUTHOR)
    except ValueError as e:
        return _usage(f"--author: {e}", "export")

    async def run(cl: Changelog, box: Sandbox) -> str:
        entries = await cl.log()
        attrs = {}
        for e in entries:
            for p in (e.path, e.new_path):
                if p and (p.endswith(".gitattributes") or p.endswith("/info/attributes")) and p not in attrs:
                    now = await current(box, p, cl.limits.max_file_bytes)
                    attrs[p] = now.data if now is not None and not isinstance(now, str) else None
        # Checked before any git runs on the host.
        found = tampering(entries, attrs)
        if found:
            raise TamperedError(found)
        changes = await collect(cl, box)
        if not changes.changes:
            raise HandoffError("the session changed nothing to commit")
        subject, _, rest = (args.message or DEFAULT_SUBJECT).strip().partition("\n")
        body = "\n\n".join(x for x in (rest.strip("\n"), session_body(entries, changes)) if x)
        message = f"{' '.join(subject.split()) or DEFAULT_SUBJECT}\n\n{body}\n" if body else f"{subject}\n"
        return await export(ws, args.branch, changes.changes, message, who)

    try:
        commit = _with_sandbox(args, settings, ws, run)
    except TamperedError as e:
        print(f"loom-worker export: refused: {e}", file=sys.stderr)
        return 1
    except (HandoffError, ChangelogError, SandboxError, OSError) as e:
        print(f"loom-worker export: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"branch": args.branch, "commit": commit}))
    else:
        print(commit)
        print(f"branch {args.branch} made at {commit[:12]}", file=sys.stderr)
    return 0


def _cmd_report(args: argparse.Namespace, settings: Settings) -> int:
    from sandbox.errors import SandboxError

    from ..changelog import ChangelogError
    from ..handoff.report import build, load_egress, load_run, markdown
    from ..handoff.state import collect
    from .changelog import _with_sandbox, _workspace

    ws = _workspace(args.workspace)
    if ws is None:
        return _usage(f"--workspace {args.workspace} is not a directory", "report")
    try:
        run_info = load_run(settings.data_dir, ws, args.run)
    except ValueError as e:
        return _usage(f"--run: {e}", "report")
    except OSError as e:
        print(f"loom-worker report: the run's record cannot be read: {e}", file=sys.stderr)
        return 1

    async def run(cl: Changelog, box: Sandbox) -> dict[str, Any]:
        changes = await collect(cl, box, strict=False)
        return build(await cl.log(), changes, load_egress(settings.data_dir, ws), run_info)

    try:
        report = _with_sandbox(args, settings, ws, run)
    except (ChangelogError, SandboxError, OSError) as e:
        print(f"loom-worker report: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else markdown(report))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="Commit the session's changes on a new branch of the workspace's repository (host git).",
        description="Makes a commit of the workspace's recorded changes on top of HEAD as the new branch NAME, "
        "with the host's git, without touching the checkout (a temporary index; HEAD, the index and the files "
        "stay as they are). Refused when the session changed git hooks, config, attributes naming a filter, or "
        "where git finds the repository.",
        epilog="Exit status: 0 made (the commit id on stdout); 1 refused (tampered repository, the branch exists, "
        "nothing to commit) or failed; 2 usage error.",
    )
    p.add_argument("--workspace", "-w", required=True, help="The workspace directory (the top of a git repository).")
    p.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)
    p.add_argument("--branch", required=True, metavar="NAME", help="The new branch (must not exist).")
    p.add_argument("--message", "-m", metavar="M", help="The commit message (first line: the subject).")
    p.add_argument("--author", metavar="'NAME <MAIL>'", help="Author and committer (default: loom-worker).")
    p.add_argument("--json", action="store_true", help="Print {branch, commit} as JSON.")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser(
        "report",
        help="A Markdown report of the session: files, commands, hosts reached and refused, secrets by name.",
        epilog="Exit status: 0; 1 the changelog or the sandbox failed; 2 usage error.",
    )
    p.add_argument("--workspace", "-w", required=True, help="The workspace directory.")
    p.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)
    p.add_argument("--run", metavar="RUN-ID", help="The agent run to summarize (default: the newest, if any).")
    p.add_argument("--json", action="store_true", help="The report as JSON.")
    p.set_defaults(func=_cmd_report)
