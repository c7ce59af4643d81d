"""The session's changes as one mail-format patch (``loom-worker diff --format patch``)."""

from __future__ import annotations

from sandbox.base import Sandbox

from ..changelog import Changelog, Entry
from .gitpatch import mail
from .report import commands
from .state import Changes, collect

DEFAULT_SUBJECT = "Changes made in a loom sandbox"
DEFAULT_AUTHOR = "loom-worker <loom-worker@localhost>"
#: Calls listed in the message at most (a long session is summarized).
MAX_LISTED = 50


def session_body(entries: list[Entry], changes: Changes) -> str:
    """The message body: the session's calls and turns, briefly, and what was left out."""
    lines = []
    calls = [c for c in commands(entries) if not c["reverted"]]
    if calls:
        lines.append("Recorded calls and turns:")
        for c in calls[:MAX_LISTED]:
            what = f": {' '.join(c['command'].split())[:100]}" if c["command"] else ""
            lines.append(f"- {c['tool']}{what} ({c['paths']} path{'s' if c['paths'] != 1 else ''})")
        if len(calls) > MAX_LISTED:
            lines.append(f"- ... and {len(calls) - MAX_LISTED} more")
    if changes.skipped:
        lines.append("")
        lines.append("Not included:")
        lines.extend(f"- {s}" for s in changes.skipped)
    return "\n".join(lines)


async def make_patch(
    cl: Changelog, sandbox: Sandbox, *, message: str | None = None, author: str = DEFAULT_AUTHOR
) -> tuple[str, Changes]:
    """The patch text (``git am``'s input) and the changes in it. ``message``: the commit
    message (first line the subject); the calls are listed after it. Raises HandoffError
    (a path whose change cannot be told), ChangelogStorageError, sandbox errors."""
    changes = await collect(cl, sandbox)
    subject, _, rest = (message or DEFAULT_SUBJECT).strip().partition("\n")
    body = "\n\n".join(x for x in (rest.strip("\n"), session_body(await cl.log(), changes)) if x)
    return mail(changes.changes, subject=subject, body=body, author=author), changes
