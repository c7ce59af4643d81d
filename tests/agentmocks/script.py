"""Scripted agent sessions for the mock providers: what the "model" asks the agent to do, turn
by turn, independent of the agent that runs it. ``render_claude`` and ``render_codex`` turn one
step into that agent's own tool call (Claude Code: Bash/Read/Write/Edit; Codex: ``exec_command``,
with ``apply_patch`` for file changes, which Codex applies itself).

Which step a request is at is read from the request (the number of tool results it carries),
so the mock holds no per-session state: retries and concurrent sessions of the same script
work.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent / "fixtures" / "tinycalc"


@dataclass(frozen=True)
class Shell:
    command: str


@dataclass(frozen=True)
class Read:
    path: str  # relative to the agent's working directory


@dataclass(frozen=True)
class Write:
    path: str
    content: str


@dataclass(frozen=True)
class Edit:
    """Replace one whole line (``old`` is unique in the file) with ``new``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Answer:
    text: str


Step = Shell | Read | Write | Edit | Answer


def changes(step: Step) -> bool:
    """Whether the step changes the project's tree (a turn that undo can take back)."""
    return isinstance(step, Write | Edit)


def project_files(root: Path = PROJECT) -> dict[str, str]:
    """The text files of a project, by path relative to its root (sorted)."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if (
            path.is_file()
            and not {"__pycache__", ".git"} & set(path.relative_to(root).parts)
            and path.suffix in {".py", ".md", ".toml", ".txt"}
        ):
            out[path.relative_to(root).as_posix()] = path.read_text()
    return out


def _unique_lines(text: str) -> list[str]:
    lines = text.splitlines()
    return [
        line for line in lines if lines.count(line) == 1 and line.startswith(("def ", "import ", "from ", "class "))
    ]


def session(n_turns: int = 20, files: dict[str, str] | None = None) -> list[Step]:
    """A scripted session of ``n_turns`` tool calls on a project (default: tests/fixtures/tinycalc),
    then a final answer: reads, one-line edits of the project's own source, new files written
    and edited, and shell commands, in a fixed order. Every edit is applied to ``files`` as it
    goes, so a later edit's ``old`` line is there when it runs.

    Raises ValueError if the project has no editable line (a unique ``def``/``import`` line).
    """
    files = dict(files if files is not None else project_files())
    editable = [(p, line) for p, text in files.items() if p.endswith(".py") for line in _unique_lines(text)]
    if not editable:
        raise ValueError("the project has no line the session can edit")
    steps: list[Step] = []
    i = 0
    while len(steps) < n_turns:
        kind = i % 5
        if kind == 0:
            path, line = editable[(i // 5) % len(editable)]
            steps.append(Read(path))
        elif kind == 1:
            path, line = editable[(i // 5) % len(editable)]
            if line in files[path].splitlines():
                new = f"{line}  # loom-mock edit {i}"
                steps.append(Edit(path, line, new))
                files[path] = files[path].replace(line + "\n", new + "\n", 1)
                editable[(i // 5) % len(editable)] = (path, new)
            else:
                steps.append(Shell(f"grep -c '' {path}"))
        elif kind == 2:
            name = f"notes/turn_{i:02d}.txt"
            content = f"turn {i}\nwritten by the scripted session\n"
            steps.append(Write(name, content))
            files[name] = content
        elif kind == 3:
            name = f"notes/turn_{i - 1:02d}.txt"
            steps.append(Edit(name, f"turn {i - 1}", f"turn {i - 1} (edited at {i})"))
            files[name] = files[name].replace(f"turn {i - 1}\n", f"turn {i - 1} (edited at {i})\n", 1)
        else:
            steps.append(Shell(f"ls -1 && wc -l {' '.join(sorted(p for p in files if p.endswith('.py'))[:3])}"))
        i += 1
    steps.append(Answer(f"Done: {n_turns} steps."))
    return steps


def render_claude(step: Step, cwd: str) -> tuple[str, dict[str, object]]:
    """Claude Code's tool name and input for a step (file paths absolute, as its tools want)."""
    if isinstance(step, Shell):
        return "Bash", {"command": step.command, "description": "scripted step"}
    if isinstance(step, Read):
        return "Read", {"file_path": posixpath.join(cwd, step.path)}
    if isinstance(step, Write):
        return "Write", {"file_path": posixpath.join(cwd, step.path), "content": step.content}
    if isinstance(step, Edit):
        return "Edit", {
            "file_path": posixpath.join(cwd, step.path),
            "old_string": step.old,
            "new_string": step.new,
            "replace_all": False,
        }
    raise TypeError(f"not a tool step: {step!r}")


def _patch(body: str) -> str:
    return f"apply_patch <<'LOOM_PATCH'\n*** Begin Patch\n{body}*** End Patch\nLOOM_PATCH\n"


def render_codex(step: Step, cwd: str) -> tuple[str, dict[str, object]]:
    """Codex's tool name and arguments for a step: everything is ``exec_command``; file changes
    are ``apply_patch`` heredocs, which Codex intercepts and applies itself."""
    if isinstance(step, Shell):
        cmd = step.command
    elif isinstance(step, Read):
        cmd = f"cat {step.path}"
    elif isinstance(step, Write):
        added = "".join(f"+{line}\n" for line in step.content.splitlines())
        cmd = _patch(f"*** Add File: {step.path}\n{added}")
    elif isinstance(step, Edit):
        cmd = _patch(f"*** Update File: {step.path}\n@@\n-{step.old}\n+{step.new}\n")
    else:
        raise TypeError(f"not a tool step: {step!r}")
    return "exec_command", {"cmd": cmd, "workdir": cwd}


def dumps(step: Step) -> str:
    return json.dumps({"kind": type(step).__name__, **step.__dict__})


def trees(steps: list[Step], files: dict[str, str] | None = None) -> list[dict[str, str]]:
    """The project's text files at the start and after each step that changes them, as the
    script means them (an agent that did the session leaves the last one): ``[start, after
    the first change, ...]``. Raises ValueError if an edit's line is not there."""
    tree = dict(files if files is not None else project_files())
    out = [dict(tree)]
    for step in steps:
        if isinstance(step, Write):
            tree[step.path] = step.content
        elif isinstance(step, Edit):
            lines = tree[step.path].split("\n")
            if step.old not in lines:
                raise ValueError(f"{step.path}: no line {step.old!r}")
            lines[lines.index(step.old)] = step.new
            tree[step.path] = "\n".join(lines)
        else:
            continue
        out.append(dict(tree))
    return out


def read_tree(root: Path, like: dict[str, str]) -> dict[str, str]:
    """The files of ``root`` a tree of :func:`trees` could hold: the same text suffixes, plus
    whatever ``like`` names (files of the agent's own, e.g. its settings, are left out)."""
    now = project_files(root)
    for rel in like:
        if rel not in now and (root / rel).is_file():
            now[rel] = (root / rel).read_text()
    return now
