"""What makes an agent report its turns (:mod:`worker.agents.turns`): the hook script
written into the sandbox's $HOME, the agent's hook configuration, and the agent's extra
arguments.

- Claude Code: a settings file passed with ``--settings FILE`` (so the user's own settings
  stay) with a ``PostToolUse`` hook after every tool that may change files (Bash, Edit,
  MultiEdit, Write, NotebookEdit and MCP tools): an HTTP hook (Claude Code posts the hook's
  JSON, ``tool_name`` and ``tool_input``, to the egress proxy's address in the sandbox,
  which relays it to the turn socket: no process is started per tool call), or, where the
  workspace has no egress proxy, the script run as a command with that JSON on stdin.
- Codex (0.124 and later, checked on 0.171): the same ``PostToolUse`` hooks, and a
  ``PreToolUse`` one that closes what changed since the last tool (Codex's ``apply_patch``
  edits fire no hook: they become a group named ``apply_patch``), given as
  ``-c hooks.PostToolUse=...`` / ``-c hooks.PreToolUse=...`` overrides (a session-flags layer; the user's ``~/.codex``
  stays) with ``--dangerously-bypass-hook-trust``: Codex runs a hook only once its exact
  definition is trusted, and this one is loom's own, written by the worker. Both are
  options of ``codex exec`` (and of ``codex`` itself).
- Any other agent: nothing; its session is one group.

The script never fails the agent: it exits 0 whatever happens (no socket, no worker, bad
input), prints nothing, and gives up waiting after :data:`HOOK_TIMEOUT` seconds.
"""

from __future__ import annotations

import json

from sandbox.spec import AGENT_COMMAND, EGRESS_PROXY_PORT, HOME_DIR

#: Where the files go, relative to the sandbox's $HOME.
HOOK_SCRIPT = ".loom/loom-turn.py"
CLAUDE_SETTINGS = ".loom/claude-settings.json"
#: Seconds the hook waits for the worker's answer (the agent waits that long at most).
HOOK_TIMEOUT = 300
#: Claude Code's tools that may change files (a regular expression, as its matchers are).
CLAUDE_MATCHER = "Bash|Edit|MultiEdit|Write|NotebookEdit|mcp__.*"

SCRIPT = r'''"""loom-turn: an agent's hook around its tool calls (loom-worker, turn by turn undo).

Sends {"tool", "summary"} to $LOOM_TURN_SOCKET and waits for the worker's answer, so the
tool's changes are recorded as their own group before the agent goes on. Run by loom's own
Python (the agent runtime mounted in every sandbox), standard library only. Always exits 0,
prints nothing.
"""
import json
import os
import re
import socket
import sys

TIMEOUT = __TIMEOUT__


def summary(ti):
    if not isinstance(ti, dict):
        return ""
    s = ""
    for key in ("file_path", "notebook_path", "path", "command", "cmd", "input"):
        if ti.get(key):
            s = ti[key]
            break
    if isinstance(s, list):
        s = " ".join(str(w) for w in s)
    if not isinstance(s, str):
        s = json.dumps(s)
    if s.startswith("*** Begin Patch"):  # Codex's apply_patch: the files it names
        files = re.findall(r"^\*\*\* (?:Add|Update|Delete) File: (.*)$", s, re.M)
        if files:
            s = " ".join(files)
    return s[:200]


def main():
    where = os.environ.get("LOOM_TURN_SOCKET")
    if not where:
        return
    try:
        hook = json.loads(sys.stdin.read(1 << 20) or "{}")
    except ValueError:
        hook = {}
    if not isinstance(hook, dict):
        hook = {}
    tool = str(hook.get("tool_name") or "tool")[:64]
    what = summary(hook.get("tool_input"))
    if sys.argv[1:] == ["before"]:  # before a tool: what changed since the last one
        tool, what = "apply_patch", "edits made before " + what[:180]
    line = json.dumps({"tool": tool, "summary": what}) + "\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(where)
        sock.sendall(line.encode())
        answer = b""
        while b"\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk


try:
    main()
except BaseException:  # never the agent's problem
    pass
sys.exit(0)
'''.replace("__TIMEOUT__", str(HOOK_TIMEOUT))


def _command(home: str, *args: str) -> str:
    # loom's own interpreter (the agent runtime, in every sandbox: no node or python needed
    # in the image, and it starts in ~20 ms where node takes ~40), through the agent's shell:
    # a missing script is no error the agent sees.
    python = " ".join(AGENT_COMMAND[:-1])  # the loader, its library path, python3 -I -S
    return f'{python} "{home}/{HOOK_SCRIPT}"{"".join(" " + a for a in args)} 2>/dev/null || true'


def _post_tool_use(matcher: str, home: str, *args: str) -> list[dict[str, object]]:
    hook = {"type": "command", "command": _command(home, *args), "timeout": HOOK_TIMEOUT + 5}
    return [{"matcher": matcher, "hooks": [hook]}]


def _http_hook(matcher: str, process_id: str) -> list[dict[str, object]]:
    # Claude Code's HTTP hook: a POST from the agent's own process to the egress proxy's
    # address in the sandbox (loopback, so never proxied), which hands it to the turn
    # socket (worker.egress.decide.Turn): no process to start for each tool call.
    url = f"http://127.0.0.1:{EGRESS_PROXY_PORT}/.loom/turn/{process_id}"
    return [{"matcher": matcher, "hooks": [{"type": "http", "url": url, "timeout": HOOK_TIMEOUT + 5}]}]


def hook_files(agent: str, home: str = "$HOME", *, process_id: str | None = None) -> dict[str, str]:
    """The files to write into the sandbox's $HOME for ``agent`` (paths relative to it:
    the hook script, and Claude Code's settings file); {} for an agent without hooks.
    ``home``: how the hook command names $HOME (the shell expands ``$HOME``).
    ``process_id``: the agent's process, when its workspace has the egress proxy (whose
    address Claude Code's HTTP hook posts to; else its hook runs the script)."""
    if agent == "claude":
        post = _http_hook(CLAUDE_MATCHER, process_id) if process_id else _post_tool_use(CLAUDE_MATCHER, home)
        settings = {"hooks": {"PostToolUse": post}}
        return {HOOK_SCRIPT: SCRIPT, CLAUDE_SETTINGS: json.dumps(settings, indent=2) + "\n"}
    if agent == "codex":
        return {HOOK_SCRIPT: SCRIPT}
    return {}


def _toml(value: object) -> str:
    """``value`` as an inline TOML value (JSON strings are valid TOML basic strings)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def agent_args(agent: str, home: str = HOME_DIR) -> list[str]:
    """Extra arguments for ``agent`` so it runs the hooks of :func:`hook_files` (``home``:
    the sandbox's $HOME, as the agent is given a path, not a shell word); [] for others."""
    if agent == "claude":
        return ["--settings", f"{home}/{CLAUDE_SETTINGS}"]
    if agent == "codex":
        # Codex edits files with apply_patch, which fires no hook (checked on 0.171): a
        # hook before each other tool closes those edits as a group of their own, so
        # they do not join the next command's.
        after = _toml(_post_tool_use("*", "$HOME"))
        before = _toml(_post_tool_use("*", "$HOME", "before"))
        return [
            "--dangerously-bypass-hook-trust", "-c", f"hooks.PostToolUse={after}", "-c", f"hooks.PreToolUse={before}",
        ]  # fmt: skip
    return []
