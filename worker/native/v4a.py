"""The V4A patch format of OpenAI's ``apply_patch`` (and Codex's): parse, then apply in memory.

Pure functions over text, no I/O: :mod:`worker.native.apply_patch` reads the files through
the sandbox, calls these, and writes the results through the changelog.

Why our own: the format's reference implementation is Codex's Rust crate
(``codex-rs/apply-patch``), not a Python library; OpenAI's Python helper only covers one
operation's diff. We follow Codex's grammar, its error wording and its matching order
(:func:`seek_sequence`: exact, then ignoring trailing whitespace, then ignoring surrounding
whitespace, then with typographic punctuation folded to ASCII), with two additions, both
documented in ``docs/native-tools.md``: several consecutive ``@@`` anchors each narrow the
location (Codex takes one), and an addition-only hunk under an anchor is inserted right
after that anchor (Codex appends it at the end of the file).

The envelope::

    *** Begin Patch
    *** Add File: path        then lines starting with "+"
    *** Delete File: path
    *** Update File: path
    *** Move to: new/path     (optional)
    @@ anchor                 (optional; "@@" alone for none)
     context / -removed / +added lines
    *** End of File           (optional: the hunk's lines end the file)
    *** End Patch

Errors: :class:`PatchError` (a ``ValueError``), its message meant for the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

BEGIN = "*** Begin Patch"
END = "*** End Patch"
ADD = "*** Add File: "
DELETE = "*** Delete File: "
UPDATE = "*** Update File: "
MOVE = "*** Move to: "
EOF_MARK = "*** End of File"


class PatchError(ValueError):
    """The patch cannot be parsed or applied; the message says where and why."""


@dataclass
class Chunk:
    """One hunk of an update: optional anchors, the lines it replaces and their replacement."""

    anchors: list[str] = field(default_factory=list)
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    end_of_file: bool = False


@dataclass
class FileOp:
    """One file's part of a patch."""

    kind: Literal["add", "delete", "update"]
    path: str
    contents: str = ""  # add
    move_to: str | None = None  # update
    chunks: list[Chunk] = field(default_factory=list)  # update


def _hunk_error(line_number: int, message: str) -> PatchError:
    return PatchError(f"invalid hunk at line {line_number}, {message}")


def _strip_heredoc(lines: list[str]) -> list[str]:
    """Codex's leniency: a patch wrapped in ``<<'EOF'`` ... ``EOF`` (a heredoc sent as text)."""
    if len(lines) >= 4 and lines[0] in ("<<EOF", "<<'EOF'", '<<"EOF"') and lines[-1].endswith("EOF"):
        return lines[1:-1]
    return lines


def parse_patch(text: str) -> list[FileOp]:
    """The file operations of a whole ``*** Begin Patch`` ... ``*** End Patch`` envelope.

    Raises PatchError (the envelope's markers are missing, a hunk is malformed).
    """
    lines = text.strip().splitlines()
    if not (lines and lines[0].strip() == BEGIN and lines[-1].strip() == END):
        lines = _strip_heredoc(lines)
    if not lines or lines[0].strip() != BEGIN:
        raise PatchError("invalid patch: The first line of the patch must be '*** Begin Patch'")
    if len(lines) < 2 or lines[-1].strip() != END:
        raise PatchError("invalid patch: The last line of the patch must be '*** End Patch'")
    body = lines[1:-1]
    ops: list[FileOp] = []
    i = 0
    while i < len(body):
        line_number = i + 2
        header = body[i].strip()
        if header.startswith(ADD):
            path = header[len(ADD) :]
            i += 1
            contents = []
            while i < len(body) and body[i].startswith("+"):
                contents.append(body[i][1:] + "\n")
                i += 1
            ops.append(FileOp("add", path, contents="".join(contents)))
        elif header.startswith(DELETE):
            ops.append(FileOp("delete", header[len(DELETE) :]))
            i += 1
        elif header.startswith(UPDATE):
            path = header[len(UPDATE) :]
            i += 1
            move_to = None
            if i < len(body) and body[i].startswith(MOVE):
                move_to = body[i][len(MOVE) :].strip()
                i += 1
            chunks, used = parse_chunks(body[i:], i + 2)
            if not chunks:
                raise _hunk_error(line_number, f"Update file hunk for path '{path}' is empty")
            i += used
            ops.append(FileOp("update", path, move_to=move_to, chunks=chunks))
        elif header == "":
            i += 1
        else:
            raise _hunk_error(
                line_number,
                f"'{header}' is not a valid hunk header. Valid hunk headers: '*** Add File: {{path}}', "
                "'*** Delete File: {path}', '*** Update File: {path}'",
            )
    return ops


def parse_chunks(lines: list[str], first_line_number: int = 1) -> tuple[list[Chunk], int]:
    """The hunks of one file's update, up to the next ``***`` header (not the End of File
    marker): ``(chunks, lines used)``. The first hunk may omit its ``@@`` line.

    Raises PatchError for a line that is none of ``@@``, `` ``, ``+``, ``-``.
    """
    chunks: list[Chunk] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == "":
            i += 1  # blank lines between hunks
            continue
        if line.startswith("***") and line.strip() != EOF_MARK:
            break
        line_number = first_line_number + i
        chunk = Chunk()
        while i < len(lines) and (lines[i] == "@@" or lines[i].startswith("@@ ")):
            anchor = lines[i][3:]
            if anchor.strip():
                chunk.anchors.append(anchor)
            i += 1
        if i == line_number - first_line_number and chunks:
            raise _hunk_error(line_number, f"Expected update hunk to start with a @@ context marker, got: '{line}'")
        body = 0
        while i < len(lines):
            cur = lines[i]
            if cur.strip() == EOF_MARK and cur.startswith("***"):
                if body == 0:
                    raise _hunk_error(first_line_number + i, "Update hunk does not contain any lines")
                chunk.end_of_file = True
                i += 1
                break
            head = cur[:1]
            if cur == "":
                chunk.old.append("")
                chunk.new.append("")
            elif head == " ":
                chunk.old.append(cur[1:])
                chunk.new.append(cur[1:])
            elif head == "+":
                chunk.new.append(cur[1:])
            elif head == "-":
                chunk.old.append(cur[1:])
            elif body == 0:
                raise _hunk_error(
                    first_line_number + i,
                    f"Unexpected line found in update hunk: '{cur}'. Every line should start with ' ' "
                    "(context line), '+' (added line), or '-' (removed line)",
                )
            else:
                break  # the next hunk ("@@") or file ("***")
            body += 1
            i += 1
        if body == 0:
            raise _hunk_error(first_line_number + i, "Update hunk does not contain any lines")
        chunks.append(chunk)
    return chunks, i


def parse_update_diff(diff: str) -> list[Chunk]:
    """The hunks of an OpenAI ``update_file`` operation's ``diff``. Raises PatchError."""
    lines = diff.splitlines()
    chunks, used = parse_chunks(lines, 1)
    if used < len(lines):
        raise _hunk_error(used + 1, f"'{lines[used]}' is not part of an update hunk")
    if not chunks:
        raise PatchError("invalid patch: the update_file diff has no hunk")
    return chunks


def parse_create_diff(diff: str) -> str:
    """The content an OpenAI ``create_file`` operation's ``diff`` makes: every line starts
    with ``+``. Raises PatchError naming the first line that does not."""
    out = []
    for n, line in enumerate(diff.splitlines(), 1):
        if line.startswith("+"):
            out.append(line[1:] + "\n")
        elif line.strip() in ("", BEGIN, END) or line.startswith(ADD):
            continue  # a blank line, or an envelope the model added around it
        else:
            raise _hunk_error(n, f"'{line}' does not start with '+' (every line of a created file does)")
    return "".join(out)


# -- applying ---------------------------------------------------------------------------

_PUNCT = str.maketrans(
    {
        **dict.fromkeys(map(ord, "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"), "-"),
        **dict.fromkeys(map(ord, "\u2018\u2019\u201a\u201b"), "'"),
        **dict.fromkeys(map(ord, "\u201c\u201d\u201e\u201f"), '"'),
        **dict.fromkeys(
            map(ord, "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000"), " "
        ),
    }
)


def _same(a: list[str], b: list[str], key: object) -> bool:
    return all(key(x) == key(y) for x, y in zip(a, b, strict=True))  # type: ignore[operator]


def seek_sequence(lines: list[str], pattern: list[str], start: int, end_of_file: bool) -> int | None:
    """Where ``pattern`` occurs in ``lines`` at or after ``start`` (at the very end first
    when ``end_of_file``), trying exact, then trailing-whitespace-insensitive, then
    surrounding-whitespace-insensitive, then punctuation-folded comparison, as Codex does."""
    if not pattern:
        return start
    if len(pattern) > len(lines):
        return None
    first = len(lines) - len(pattern) if end_of_file else start
    last = len(lines) - len(pattern)
    keys = (
        lambda s: s,
        str.rstrip,
        str.strip,
        lambda s: s.strip().translate(_PUNCT),
    )
    for key in keys:
        for i in range(first, last + 1):
            if _same(lines[i : i + len(pattern)], pattern, key):
                return i
    if end_of_file and first > start:
        return seek_sequence(lines, pattern, start, False)
    return None


def apply_chunks(original: str, chunks: list[Chunk], path: str) -> str:
    """``original`` with ``chunks`` applied in order; the result ends with a newline (CRLF
    when the original's lines ended so). Raises PatchError naming the hunk that did not
    match, and from which line it was looked for."""
    crlf = "\r\n" in original
    lines = original.split("\n")
    if crlf:
        lines = [x.removesuffix("\r") for x in lines]
    if lines and lines[-1] == "":
        lines.pop()
    replacements: list[tuple[int, int, list[str]]] = []
    index = 0
    total = len(chunks)
    for number, chunk in enumerate(chunks, 1):
        where = f" (hunk {number} of {total})" if total > 1 else ""
        for anchor in chunk.anchors:
            found = seek_sequence(lines, [anchor], index, False)
            if found is None:
                raise PatchError(f"Failed to find context '{anchor}' in {path}{where}, searching from line {index + 1}")
            index = found + 1
        if not chunk.old:
            at = index if chunk.anchors else len(lines)
            replacements.append((at, 0, chunk.new))
            continue
        old, new = chunk.old, chunk.new
        found = seek_sequence(lines, old, index, chunk.end_of_file)
        if found is None and old[-1] == "":
            # A trailing empty context line is often an artefact of the patch's last newline.
            old = old[:-1]
            new = new[:-1] if new and new[-1] == "" else new
            found = seek_sequence(lines, old, index, chunk.end_of_file)
        if found is None:
            raise PatchError(
                f"Failed to find expected lines in {path}{where}, searching from line {index + 1}:\n"
                + "\n".join(chunk.old)
            )
        replacements.append((found, len(old), new))
        index = found + len(old)
    replacements.sort(key=lambda r: r[0])
    for at, size, new in reversed(replacements):
        lines[at : at + size] = new
    eol = "\r\n" if crlf else "\n"
    return eol.join(lines) + eol if lines else ""
