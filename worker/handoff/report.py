"""A session's report in Markdown (or as a dict, for ``--json``): files changed, commands
and turns run, hosts reached and refused, secrets used (by name: the egress log never
holds a value), and the agent run's summary where ``agent run`` saved one.

:func:`build` is pure; :func:`load_egress` and :func:`load_run` read the host-side files.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..changelog import Entry
from ..changelog.recorder import workspace_dir
from ..egress.log import EgressLog
from .gitpatch import count, is_binary
from .state import Changes

RUNS_DIR = "agent-runs"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def load_egress(data_dir: Path, workspace: Path, limit: int = 100_000) -> list[dict[str, Any]]:
    """The workspace's egress records, oldest first (blocking)."""
    return EgressLog(data_dir).read(workspace, limit=limit)


def load_run(data_dir: Path, workspace: Path, run_id: str | None) -> dict[str, Any] | None:
    """The ``run.json`` of run ``run_id`` (None: the newest run), None when there is none.
    Blocking. Raises ValueError (a run id that is not a plain name, or a run not found
    when one was named), OSError."""
    runs = workspace_dir(data_dir, workspace) / RUNS_DIR
    if run_id is not None:
        if not _RUN_ID.match(run_id):
            raise ValueError(f"not a run id: {run_id!r}")
        path = runs / run_id / "run.json"
        if not path.is_file():
            raise ValueError(f"no run {run_id} in this workspace")
    else:
        found = sorted(runs.glob("*/run.json"), key=lambda p: p.stat().st_mtime) if runs.is_dir() else []
        if not found:
            return None
        path = found[-1]
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    data.setdefault("run_id", path.parent.name)
    return data


def commands(entries: list[Entry]) -> list[dict[str, Any]]:
    calls: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e.origin == "undo" or e.state == "failed":
            continue
        key = e.call_id or f"entry {e.id}"
        c = calls.setdefault(key, {"call_id": e.call_id, "tool": e.tool, "command": None, "paths": 0, "reverted": True})
        c["paths"] += 1
        c["reverted"] = c["reverted"] and e.reverted
        if c["command"] is None and e.note and e.note.startswith("$ "):
            c["command"] = e.note[2:].split(" [interrupted", 1)[0]
    return list(calls.values())


def _hosts(egress: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    reached: dict[str, dict[str, Any]] = {}
    refused: dict[str, dict[str, Any]] = {}
    secrets: dict[str, dict[str, Any]] = {}
    for r in egress:
        if r.get("kind") == "secret":
            name = r.get("secret") or "(a placeholder of no secret)"
            s = secrets.setdefault(name, {"secret": name, "hosts": set(), "uses": 0, "refused": 0})
            s["hosts"].add(str(r.get("host")))
            s["uses" if r.get("verdict") == "allowed" else "refused"] += 1
            continue
        host = f"{r.get('host')}:{r.get('port')}"
        if r.get("verdict") in ("allowed", "error"):
            h = reached.setdefault(host, {"host": host, "count": 0, "bytes_up": 0, "bytes_down": 0})
            h["count"] += 1
            h["bytes_up"] += int(r.get("bytes_up") or 0)
            h["bytes_down"] += int(r.get("bytes_down") or 0)
        else:
            h = refused.setdefault(host, {"host": host, "count": 0, "reason": r.get("reason") or r.get("verdict")})
            h["count"] += 1
    out_secrets = [{**s, "hosts": sorted(s["hosts"])} for s in secrets.values()]
    return list(reached.values()), list(refused.values()), out_secrets


def build(
    entries: list[Entry], changes: Changes, egress: list[dict[str, Any]], run: dict[str, Any] | None
) -> dict[str, Any]:
    """The report as a dict (what ``--json`` prints)."""
    files = []
    for c in changes.changes:
        o = c.old.data if c.old else b""
        n = c.new.data if c.new else b""
        status = (
            "created"
            if c.old is None
            else "deleted"
            if c.new is None
            else "renamed"
            if c.old_path != c.new_path
            else "modified"
        )
        binary = is_binary(o) or is_binary(n)
        plus, minus = (0, 0) if binary else count(o, n)
        row: dict[str, Any] = {
            "path": c.new_path if c.new else c.old_path,
            "status": status,
            "added": plus,
            "removed": minus,
        }
        if status == "renamed":
            row["from"] = c.old_path
        if binary:
            row["binary"] = True
        if c.old and c.new and c.old.mode != c.new.mode:
            row["mode"] = f"{c.old.mode} -> {c.new.mode}"
        files.append(row)
    reached, refused, secrets = _hosts(egress)
    return {
        "run": run,
        "files": files,
        "skipped": changes.skipped,
        "commands": commands(entries),
        "hosts_reached": reached,
        "hosts_refused": refused,
        "secrets_used": secrets,
    }


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _shown(key: str, value: object) -> object:
    """A run field as a reader wants it: times (epoch seconds in run.json) in UTC, ISO 8601."""
    if key in ("started", "ended") and isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, tz=UTC).isoformat(timespec="seconds")
    if key == "cost_usd" and isinstance(value, int | float) and not isinstance(value, bool):
        return f"${value:.4f}"
    return value


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown."""
    out = ["# loom session report\n"]
    run = report.get("run")
    if run:
        out.append("\n## Agent run\n\n")
        for key in ("run_id", "agent", "version", "exit_code", "outcome", "started", "ended", "turns", "cost_usd"):
            if run.get(key) is not None:
                out.append(f"- **{key.replace('_', ' ')}**: {_cell(_shown(key, run[key]))}\n")
    files = report["files"]
    out.append(f"\n## Files changed ({len(files)})\n\n")
    if files:
        out.append("| path | change | + | - |\n|---|---|---|---|\n")
        for f in files:
            what = f["status"] + (f" from `{_cell(f['from'])}`" if "from" in f else "")
            what += f" (mode {f['mode']})" if "mode" in f else ""
            add, rem = ("bin", "bin") if f.get("binary") else (f["added"], f["removed"])
            out.append(f"| `{_cell(f['path'])}` | {what} | {add} | {rem} |\n")
    else:
        out.append("None.\n")
    for s in report["skipped"]:
        out.append(f"- not included: {_cell(s)}\n")
    cmds = report["commands"]
    out.append(f"\n## Commands and turns ({len(cmds)})\n\n")
    if cmds:
        out.append("| call | tool | command | paths |\n|---|---|---|---|\n")
        for c in cmds:
            cmd = f"`{_cell(c['command'][:160])}`" if c["command"] else ""
            gone = " (undone)" if c["reverted"] else ""
            out.append(f"| {_cell(c['call_id'] or '')} | {_cell(c['tool'])}{gone} | {cmd} | {c['paths']} |\n")
    else:
        out.append("None recorded.\n")
    reached = [
        f"`{_cell(h['host'])}`: {h['count']}x, {h['bytes_up']} bytes up, {h['bytes_down']} down"
        for h in report["hosts_reached"]
    ]
    refused = [f"`{_cell(h['host'])}`: {h['count']}x ({_cell(h['reason'])})" for h in report["hosts_refused"]]
    secrets = [
        f"`{_cell(s['secret'])}` to {', '.join(_cell(h) for h in s['hosts'])}: {s['uses']} use(s)"
        + (f", {s['refused']} refused" if s["refused"] else "")
        for s in report["secrets_used"]
    ]
    for title, items in (("Hosts reached", reached), ("Hosts refused", refused), ("Secrets used (by name)", secrets)):
        out.append(f"\n## {title}\n\n")
        out.extend([f"- {item}\n" for item in items] or ["None.\n"])
    return "".join(out)
