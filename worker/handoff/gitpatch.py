"""Net changes as git's patch formats: the ``diff --git`` body (``git apply``) and the
mail format ``git format-patch`` writes (``git am``).

Pure functions on bytes. Text files get unified hunks with three lines of context, binary
files (a NUL in the first 8000 bytes, as git decides) and text holding a carriage return
(which ``git am`` strips from a mail) a ``GIT binary patch`` (zlib +
base85, forward and reverse), every part a full ``index`` line (git applies a binary
patch only with one, and checks the preimage against it).
"""

from __future__ import annotations

import base64
import difflib
import email.utils
import hashlib
import zlib
from collections.abc import Sequence

from ..quoting import quote_path
from .state import Change, Side

ZERO = "0" * 40


def blob_id(data: bytes) -> str:
    """The object id git gives ``data`` as a blob (sha1)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_binary(data: bytes) -> bool:
    return b"\0" in data[:8000]


def _keep_ends(data: bytes) -> list[str]:
    # Split on \n only (str.splitlines would split on \r and others, and the hunk would
    # not match what git sees); bytes that are not UTF-8 survive as surrogates.
    parts = data.decode("utf-8", "surrogateescape").split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def hunks(old: bytes, new: bytes) -> str:
    """The unified hunks from ``old`` to ``new`` (no file headers)."""
    out = []
    for i, line in enumerate(difflib.unified_diff(_keep_ends(old), _keep_ends(new), n=3)):
        if i < 2:
            continue  # difflib's own ---/+++ lines
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _b85_lines(data: bytes) -> str:
    packed = zlib.compress(data, 9)
    out = []
    for i in range(0, len(packed), 52):
        chunk = packed[i : i + 52]
        n = len(chunk)
        out.append(
            (chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27)) + base64.b85encode(chunk, pad=True).decode()
        )
    return "".join(line + "\n" for line in out)


def binary_patch(old: bytes, new: bytes) -> str:
    """A ``GIT binary patch`` from ``old`` to ``new`` (literal forms both ways)."""
    return f"GIT binary patch\nliteral {len(new)}\n{_b85_lines(new)}\nliteral {len(old)}\n{_b85_lines(old)}\n"


def _content(old: Side | None, new: Side | None, a: str, b: str) -> str:
    o = old.data if old is not None else b""
    n = new.data if new is not None else b""
    if o == n:
        return ""
    # A carriage return would not survive the mail: ``git am`` strips CR before LF in
    # what it reads (``--keep-cr`` is off by default). Base85 holds only printable text.
    if is_binary(o) or is_binary(n) or b"\r" in o or b"\r" in n:
        return binary_patch(o, n)
    return f"--- {a}\n+++ {b}\n" + hunks(o, n)


def file_diff(change: Change) -> str:
    """One change as git writes it (a kind change, file <-> symlink, is a deletion and a
    creation, as git shows it)."""
    old, new = change.old, change.new
    if old is not None and new is not None and old.kind != new.kind:
        return file_diff(Change(change.old_path, change.old_path, old, None)) + file_diff(
            Change(change.new_path, change.new_path, None, new)
        )
    a_name, b_name = change.old_path, change.new_path
    a, b = quote_path(f"a/{a_name}"), quote_path(f"b/{b_name}")
    head = [f"diff --git {a} {b}\n"]
    oid = blob_id(old.data) if old is not None else ZERO
    nid = blob_id(new.data) if new is not None else ZERO
    if old is None and new is not None:
        head.append(f"new file mode {new.mode}\n")
        head.append(f"index {ZERO}..{nid}\n")
        a = "/dev/null"
    elif new is None and old is not None:
        head.append(f"deleted file mode {old.mode}\n")
        head.append(f"index {oid}..{ZERO}\n")
        b = "/dev/null"
    elif old is not None and new is not None:
        if old.mode != new.mode:
            head.append(f"old mode {old.mode}\nnew mode {new.mode}\n")
        if a_name != b_name:
            same = old.data == new.data
            head.append(
                f"similarity index {100 if same else 50}%\n"
                f"rename from {quote_path(a_name)}\nrename to {quote_path(b_name)}\n"
            )
        if oid != nid:
            head.append(f"index {oid}..{nid}" + (f" {new.mode}\n" if old.mode == new.mode else "\n"))
    return "".join(head) + _content(old, new, a, b)


def diffstat(changes: Sequence[Change]) -> str:
    """``git diff --stat``'s lines (a count per file; binary files as ``Bin``)."""
    rows: list[tuple[str, str]] = []
    files = ins = dels = 0
    for c in changes:
        name = c.new_path if c.old_path == c.new_path else f"{c.old_path} => {c.new_path}"
        o = c.old.data if c.old else b""
        n = c.new.data if c.new else b""
        files += 1
        if is_binary(o) or is_binary(n):
            rows.append((name, f"Bin {len(o)} -> {len(n)} bytes"))
            continue
        plus, minus = count(o, n)
        ins, dels = ins + plus, dels + minus
        rows.append((name, f"{plus + minus} " + "+" * min(plus, 40) + "-" * min(minus, 40)))
    width = max((len(r[0]) for r in rows), default=0)
    out = [f" {name.ljust(width)} | {what}\n" for name, what in rows]
    out.append(
        f" {files} file{'s' if files != 1 else ''} changed, {ins} insertion{'s' if ins != 1 else ''}(+), "
        f"{dels} deletion{'s' if dels != 1 else ''}(-)\n"
    )
    return "".join(out)


def count(old: bytes, new: bytes) -> tuple[int, int]:
    """Lines added and removed from ``old`` to ``new`` (text)."""
    plus = minus = 0
    for line in difflib.unified_diff(_keep_ends(old), _keep_ends(new), n=0):
        if line.startswith("+") and not line.startswith("+++"):
            plus += 1
        elif line.startswith("-") and not line.startswith("---"):
            minus += 1
    return plus, minus


def diff_body(changes: Sequence[Change]) -> str:
    """Every change as ``git diff`` writes it (what ``git apply`` takes)."""
    return "".join(file_diff(c) for c in changes)


def mail(
    changes: Sequence[Change],
    *,
    subject: str,
    body: str = "",
    author: str = "loom-worker <loom-worker@localhost>",
    date: float | None = None,
) -> str:
    """The patch as ``git format-patch`` writes one commit (what ``git am`` takes)."""
    diff = diff_body(changes)
    digest = hashlib.sha1(diff.encode("utf-8", "surrogateescape")).hexdigest()
    subject_line = " ".join(subject.split()) or "Changes made in a loom sandbox"
    text = body.strip("\n")
    parts = [
        f"From {digest} Mon Sep 17 00:00:00 2001\n",
        f"From: {author}\n",
        f"Date: {email.utils.formatdate(date, localtime=True)}\n",
        f"Subject: [PATCH] {subject_line}\n",
        "MIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-8\nContent-Transfer-Encoding: 8bit\n",
        "\n",
        (text + "\n") if text else "",
        "---\n",
        diffstat(changes),
        "\n",
        diff,
        "-- \nloom-worker\n\n",
    ]
    return "".join(parts)
