"""What a GitHub Actions step reads and writes on the runner: its inputs (``INPUT_*``),
its outputs (``$GITHUB_OUTPUT``), the job summary (``$GITHUB_STEP_SUMMARY``) and workflow
commands (``::group::``, ``::error::``) on stdout.

The files' format is GitHub's
(https://docs.github.com/actions/reference/workflow-commands-for-github-actions): every
output is written as ``NAME<<DELIMITER``, the value, ``DELIMITER``, which is the only form
a multi-line value may take and works for one line too; the delimiter is random per value
and checked not to occur in it (a value that held its own delimiter could set other
outputs). Outside a runner (the variables unset), outputs and the summary go nowhere.

Errors: :class:`OSError` when a file cannot be written; :class:`ValueError` for an output
name GitHub would not accept.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def input_env(name: str) -> str:
    """The environment variable an input is passed in: ``INPUT_`` + the name in upper
    case with ``-`` as ``_`` (``prompt-file`` -> ``INPUT_PROMPT_FILE``). A composite
    action's step maps each input to it explicitly (GitHub sets ``INPUT_*`` itself only
    for JavaScript and Docker actions, and keeps the ``-`` there, which a shell cannot
    name)."""
    return "INPUT_" + name.upper().replace("-", "_").replace(" ", "_")


def read_input(env: Mapping[str, str], name: str) -> str:
    """An input's value, surrounding white space removed ("" when not given)."""
    return env.get(input_env(name), "").strip()


def _delimiter(value: str) -> str:
    while True:
        delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
        if delimiter not in value:
            return delimiter


def format_output(name: str, value: str) -> str:
    """One output as ``$GITHUB_OUTPUT`` takes it (heredoc form, ends with a newline).

    Raises :class:`ValueError` for a name GitHub would not accept."""
    if not _NAME.match(name):
        raise ValueError(f"output name {name!r}: letters, digits, '-' and '_', not starting with a digit")
    delimiter = _delimiter(value)
    return f"{name}<<{delimiter}\n{value}\n{delimiter}\n"


def set_outputs(env: Mapping[str, str], outputs: Mapping[str, str]) -> Path | None:
    """Appends ``outputs`` to ``$GITHUB_OUTPUT``; the file, or None when not on a runner.

    Raises :class:`OSError` when the file cannot be written."""
    path = env.get("GITHUB_OUTPUT")
    if not path:
        return None
    text = "".join(format_output(k, v) for k, v in outputs.items())
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
    return Path(path)


def append_summary(env: Mapping[str, str], markdown: str) -> Path | None:
    """Appends ``markdown`` to the job summary (``$GITHUB_STEP_SUMMARY``); the file, or
    None when not on a runner.

    Raises :class:`OSError` when the file cannot be written."""
    path = env.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown if markdown.endswith("\n") else markdown + "\n")
    return Path(path)


def _escape(text: str) -> str:
    # A workflow command's message ends at its line; GitHub's own escapes keep it one line.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def command(name: str, message: str = "", **props: str) -> str:
    """A workflow command line (``::error title=x::message``)."""
    props_text = ",".join(f"{k}={_escape(v).replace(':', '%3A').replace(',', '%2C')}" for k, v in props.items())
    return f"::{name}{' ' + props_text if props_text else ''}::{_escape(message)}"


def on_runner(env: Mapping[str, str] | None = None) -> bool:
    """Whether this runs as a GitHub Actions step (workflow commands are understood)."""
    return (env if env is not None else os.environ).get("GITHUB_ACTIONS") == "true"


def format_dotenv(values: Mapping[str, str], prefix: str = "LOOM_AGENT_") -> str:
    """``values`` as a GitLab dotenv report: ``PREFIX_NAME=value`` lines, names in upper
    case with ``-`` as ``_``; a value's line breaks become ``,`` (the format has one line
    per variable, and GitLab refuses quotes' escapes)."""
    lines = []
    for name, value in values.items():
        key = prefix + name.upper().replace("-", "_")
        lines.append(f"{key}={','.join(v for v in value.splitlines() if v)}")
    return "\n".join(lines) + "\n"
