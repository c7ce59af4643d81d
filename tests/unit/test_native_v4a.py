"""The V4A parser and applier (worker.native.v4a), no Docker: Codex's grammar, its error
wording, its matching order, and our two additions (nested anchors, an addition under an
anchor)."""

from __future__ import annotations

import pytest

from worker.native.bash import cut, quote, script
from worker.native.v4a import (
    PatchError,
    apply_chunks,
    parse_create_diff,
    parse_patch,
    parse_update_diff,
    seek_sequence,
)

SRC = "class A:\n    def f(self):\n        return 1\n\nclass B:\n    def f(self):\n        return 1\n"

APPLY_CASES = [
    ("one hunk, no anchor", "@@\n-class A:\n+class Z:\n", SRC.replace("class A", "class Z")),
    (
        "first hunk without @@",
        " class B:\n     def f(self):\n-        return 1\n+        return 2\n",
        SRC[: -len("1\n")] + "2\n",
    ),
    (
        "nested anchors narrow",
        "@@ class B:\n@@     def f(self):\n-        return 1\n+        return 2\n",
        SRC[: -len("1\n")] + "2\n",
    ),
    (
        "two hunks in order",
        "@@\n-class A:\n+class Y:\n@@\n-class B:\n+class X:\n",
        SRC.replace("A:", "Y:").replace("B:", "X:"),
    ),
    ("trailing whitespace ignored", "@@\n-class A:   \n+class Q:\n", SRC.replace("class A", "class Q")),
    ("surrounding whitespace ignored", "@@\n-  class A:\n+class Q:\n", SRC.replace("class A", "class Q")),
    ("typographic dash folded", "@@\n-x \u2013 y\n+x - z\n", None),
    (
        "end of file picks the last match",
        "@@\n-        return 1\n+        return 9\n*** End of File\n",
        SRC[: -len("1\n")] + "9\n",
    ),
    (
        "addition under an anchor goes after it",
        "@@ class B:\n+    '''doc'''\n",
        SRC.replace("class B:\n", "class B:\n    '''doc'''\n"),
    ),
    ("addition without anchor appends", "@@\n+# end\n", SRC + "# end\n"),
]


@pytest.mark.parametrize("case", APPLY_CASES, ids=[c[0] for c in APPLY_CASES])
def test_apply(case: tuple[str, str, str | None]) -> None:
    name, diff, expected = case
    if expected is None:  # (the punctuation case has its own source)
        assert apply_chunks("a\nx \u2014 y\n", parse_update_diff(diff), "p") == "a\nx - z\n"
        return
    assert apply_chunks(SRC, parse_update_diff(diff), "m.py") == expected, name


def test_crlf_files_keep_their_line_ends() -> None:
    assert apply_chunks("a\r\nb\r\n", parse_update_diff("@@\n-b\n+c\n"), "w.txt") == "a\r\nc\r\n"


def test_a_file_without_a_final_newline_gets_one() -> None:
    assert apply_chunks("a\nb", parse_update_diff("@@\n-a\n+A\n"), "n.txt") == "A\nb\n"


def test_misses_name_the_hunk_and_where_it_was_looked_for() -> None:
    chunks = parse_update_diff("@@\n-class A:\n+class Y:\n@@\n-nope\n+x\n")
    with pytest.raises(PatchError) as e:
        apply_chunks(SRC, chunks, "m.py")
    assert str(e.value) == "Failed to find expected lines in m.py (hunk 2 of 2), searching from line 2:\nnope"
    with pytest.raises(PatchError, match=r"^Failed to find context 'class C:' in m.py, searching from line 1$"):
        apply_chunks(SRC, parse_update_diff("@@ class C:\n-x\n+y\n"), "m.py")


def test_seek_sequence_order() -> None:
    lines = ["foo   ", "  bar", "foo"]
    assert seek_sequence(lines, ["foo"], 0, False) == 2  # exact beats trailing-whitespace
    assert seek_sequence(lines, ["bar"], 0, False) == 1  # surrounding whitespace
    assert seek_sequence(lines, ["a", "b", "c", "d"], 0, False) is None
    assert seek_sequence(lines, [], 1, False) == 1


def test_envelope_with_every_kind_of_hunk() -> None:
    ops = parse_patch(
        "*** Begin Patch\n*** Add File: a/new.txt\n+one\n+two\n*** Delete File: old.txt\n"
        "*** Update File: m.py\n*** Move to: n.py\n@@ class A:\n-x\n+y\n*** End Patch\n"
    )
    assert [(o.kind, o.path) for o in ops] == [("add", "a/new.txt"), ("delete", "old.txt"), ("update", "m.py")]
    assert ops[0].contents == "one\ntwo\n" and ops[2].move_to == "n.py" and ops[2].chunks[0].anchors == ["class A:"]
    # Codex's leniency: a heredoc around it.
    assert len(parse_patch("<<'EOF'\n*** Begin Patch\n*** Delete File: x\n*** End Patch\nEOF\n")) == 1


ERRORS = [
    ("bad", "invalid patch: The first line of the patch must be '*** Begin Patch'"),
    ("*** Begin Patch\n*** Delete File: x\n", "invalid patch: The last line of the patch must be '*** End Patch'"),
    (
        "*** Begin Patch\n*** Frobnicate File: x\n*** End Patch",
        "invalid hunk at line 2, '*** Frobnicate File: x' is not a valid hunk header. Valid hunk headers: "
        "'*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'",
    ),
    (
        "*** Begin Patch\n*** Update File: t.py\n*** End Patch",
        "invalid hunk at line 2, Update file hunk for path 't.py' is empty",
    ),
    (
        "*** Begin Patch\n*** Update File: t.py\n@@\n?x\n*** End Patch",
        "invalid hunk at line 4, Unexpected line found in update hunk: '?x'. Every line should start with ' ' "
        "(context line), '+' (added line), or '-' (removed line)",
    ),
]


@pytest.mark.parametrize("text,message", ERRORS)
def test_parse_errors_use_codex_s_wording(text: str, message: str) -> None:
    with pytest.raises(PatchError) as e:
        parse_patch(text)
    assert str(e.value) == message


def test_create_diff() -> None:
    assert parse_create_diff("+a\n+\n+b\n") == "a\n\nb\n"
    with pytest.raises(PatchError, match="does not start with '\\+'"):
        parse_create_diff("+a\nb\n")


def test_the_bash_protocol_quotes_any_command_and_cuts_long_output() -> None:
    assert quote("it's") == "'it'\"'\"'s'"
    text = script("echo 'x'", "__LOOM_ab__").decode()
    assert "__LOOM_ab__" not in text  # printed in two pieces: xtrace never shows it whole
    assert "'__LOO' 'M_ab__'" in text and 'eval "$__loom_c" </dev/null' in text
    out = cut(b"a" * 10 + b"b" * 40_000 + b"c" * 10)
    assert out.startswith("aaaaaaaaaa") and out.endswith("cccccccccc") and "bytes of output omitted" in out
