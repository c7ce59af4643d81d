"""``loom-worker daemon status|stop``: the CLI's local worker (see :mod:`worker.localworker`).

``status`` says whether the worker this invocation's calls would use is running and, when
not, why (switched off, no usable run directory, the last thing its log says: it exited
when idle, or it failed to start), then lists this user's other workers (other settings,
other code). ``stop`` asks it (``--all``: every one of this user's) to exit once its
calls in flight are done. ``loom-worker doctor`` shows the same summary.

Exit codes: 0 ok; 1 ``status`` found no usable run directory; 2 usage error.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from typing import Any


def _backend(args: argparse.Namespace) -> str:
    return str(getattr(args, "backend", "docker"))


def _last_word(log_path: str) -> str | None:
    """The last event of a worker's log: why it exited, or why it did not start."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") in (
            "local_worker.exit",
            "local_worker.start_failed",
            "local_worker.retiring",
            "local_worker.started",
        ):
            what = str(event["event"]).removeprefix("local_worker.")
            reason = event.get("reason")
            return f"{what}{': ' + str(reason) if reason else ''} ({event.get('timestamp')})"
    return lines[-1][:300] if lines else None


def _status_of(files: Any, key: str) -> dict[str, Any]:
    from ..localworker.client import Lost, Unavailable, connect

    out: dict[str, Any] = {"key": key, "socket": files.socket, "log": files.log, "running": False}
    try:
        client = connect(files, key)
    except Unavailable as e:
        out["problem"] = str(e)
        return out
    if client is None:
        out["last"] = _last_word(files.log)
        return out
    try:
        answer = client.request({"op": "status"})
        out.update({k: v for k, v in answer.items() if k not in ("id", "t")}, running=True)
    except (Lost, Unavailable) as e:
        out["problem"] = str(e)
    finally:
        client.close()
    return out


def local_worker_report(backend: str = "docker") -> dict[str, Any]:
    """Everything ``status`` and ``doctor`` show: this invocation's worker and the others."""
    from ..localworker.client import switch
    from ..localworker.identity import daemon_key
    from ..localworker.rundir import RunDirError, WorkerFiles, run_dir

    report: dict[str, Any] = {"enabled": switch()}
    try:
        directory, notes = run_dir()
    except RunDirError as e:
        report["problem"] = str(e)
        return report
    key = daemon_key(backend)
    report.update(run_dir=directory, notes=notes, this=_status_of(WorkerFiles(directory, key), key))
    others = []
    for sock in sorted(glob.glob(os.path.join(glob.escape(directory), "d-*.sock"))):
        other = os.path.basename(sock)[2:-5]
        if other != key:
            others.append(_status_of(WorkerFiles(directory, other), other))
    report["others"] = others
    return report


def describe(report: dict[str, Any]) -> list[tuple[bool, str]]:
    """``report`` as lines for a person, each with whether it is fine."""
    lines: list[tuple[bool, str]] = []
    if report["enabled"] is False:
        lines.append((True, "off (LOOM_CLI_DAEMON=0): every call runs in the CLI's own process"))
    elif report["enabled"] is None:
        lines.append((False, "LOOM_CLI_DAEMON is not a valid boolean: calls fail with a usage error"))
    if "problem" in report:
        lines.append((False, f"cannot be used: {report['problem']}; calls run in the CLI's own process"))
        return lines
    this = report["this"]
    for note in report.get("notes", []):
        lines.append((True, note))
    if this.get("running"):
        up = time.time() - float(this.get("started") or time.time())
        lines.append(
            (
                True,
                f"running: pid {this.get('pid')}, up {up:.0f} s, {this.get('calls')} calls, "
                f"exits after {this.get('idle_exit')} s idle; socket {this['socket']}",
            )
        )
    elif "problem" in this:
        lines.append((False, f"cannot be used: {this['problem']}; calls run in the CLI's own process"))
    elif report["enabled"]:
        last = this.get("last")
        failed = bool(last and last.startswith("start_failed"))  # then calls run in-process
        text = "not running: the next `loom-worker call` starts it" + (f"; last: {last}" if last else "")
        lines.append((not failed, text))
    for other in report.get("others", []):
        state = f"running, pid {other.get('pid')}" if other.get("running") else "not answering"
        lines.append((True, f"another worker of this user (other settings or code): {other['key']}, {state}"))
    return lines


def _cmd_status(args: argparse.Namespace, _settings: Any) -> int:
    report = local_worker_report(_backend(args))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        for ok, text in describe(report):
            print(f"[{'ok' if ok else 'FAIL'}] local worker: {text}")
    return 1 if "problem" in report else 0


def _cmd_stop(args: argparse.Namespace, _settings: Any) -> int:
    from ..localworker.client import Lost, Unavailable, connect
    from ..localworker.identity import daemon_key
    from ..localworker.rundir import RunDirError, WorkerFiles, run_dir

    try:
        directory, _notes = run_dir()
    except RunDirError as e:
        print(f"loom-worker daemon: {e}", file=sys.stderr)
        return 1
    if args.all:
        keys = [os.path.basename(s)[2:-5] for s in glob.glob(os.path.join(glob.escape(directory), "d-*.sock"))]
    else:
        keys = [daemon_key(_backend(args))]
    stopped = 0
    for key in keys:
        try:
            client = connect(WorkerFiles(directory, key), key)
        except Unavailable:
            continue
        if client is None:
            continue
        try:
            client.request({"op": "shutdown"})
            stopped += 1
        except (Lost, Unavailable):
            pass
        finally:
            client.close()
    print(f"asked {stopped} local worker(s) to stop" if stopped else "no local worker was running")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("daemon", help="The CLI's local worker: status, stop.")
    actions = p.add_subparsers(dest="daemon_action", metavar="ACTION", required=True)
    q = actions.add_parser(
        "status",
        help="Is it running, and if not, why not.",
        epilog="Exit status: 0 (a worker that is not running, or does not start, is reported, not an error); 1 no "
        "usable run directory.",
    )
    q.add_argument("--json", action="store_true", help="Print JSON.")
    q.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)
    q.set_defaults(func=_cmd_status, own_settings=True)
    q = actions.add_parser(
        "stop",
        help="Ask it to exit once its calls in flight are done.",
        epilog="Exit status: 0 (also when none was running); 1 no usable run directory.",
    )
    q.add_argument("--all", action="store_true", help="Every local worker of this user.")
    q.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)
    q.set_defaults(func=_cmd_stop, own_settings=True)
