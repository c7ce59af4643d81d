"""The lexical path policy (the agent holds the authoritative check)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from worker.policy.paths import normalize, require_file_path
from worker.tool import PolicyError, ToolError

WS = "/tmp/loom-ws-abc"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("a.txt", "a.txt"),
        ("./a.txt", "a.txt"),
        ("src//pkg/./m.py", "src/pkg/m.py"),
        ("src/../b.txt", "b.txt"),
        ("a/b/../../c", "c"),
        (".", "."),
        ("", "."),
        ("./", "."),
        (f"{WS}/src/m.py", "src/m.py"),
        (WS, "."),
        (f"{WS}/", "."),
        ("/workspace/src/m.py", "src/m.py"),
        ("/workspace", "."),
        ("~/x", "~/x"),  # not expanded: a literal directory named "~" inside the workspace
    ],
)
def test_normalize_inside(given: str, expected: str) -> None:
    assert normalize(given, WS) == expected


@pytest.mark.parametrize(
    "given",
    [
        "..",
        "../x",
        "a/../../x",
        "newdir/../../x",
        "/etc/passwd",
        "/",
        f"{WS}-evil/secret",  # sibling directory sharing the prefix
        f"{WS}evil",
        f"{WS}/../loom-ws-other/x",
        "/workspace/../etc/passwd",
        "/workspaces/x",
        "a\x00b",
        "x" * 5000,
    ],
)
def test_normalize_refuses(given: str) -> None:
    with pytest.raises(PolicyError) as exc:
        normalize(given, WS)
    assert str(exc.value).startswith("Safety violation")


def test_require_file_path_refuses_root() -> None:
    assert require_file_path("a/b", WS) == "a/b"
    with pytest.raises(ToolError, match="Not a file"):
        require_file_path(".", WS)
    with pytest.raises(ToolError, match="Not a file"):
        require_file_path(WS, WS)


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet=["a", "b", "/", ".", " ", "\x00", "\\"], max_size=14))
def test_the_fast_path_of_normalize_is_the_general_one(path: str) -> None:
    """``normalize`` takes a plain relative path as it is (the usual case, on every file
    tool's call); a ``./`` in front sends the same path through the general algorithm. (No
    quotes drawn: the fast path never takes one, and a path quoted whole is not the same
    as ``./`` and a quoted name.)"""
    assume(path[:1] != "/" and not (path and path.isspace()) and path != "")

    def outcome(p: str) -> str:
        try:
            return normalize(p)
        except PolicyError as e:
            return "refused: " + str(e).replace(f"'{p}'", "'<path>'")  # (the message names it)

    assert outcome(path) == outcome("./" + path)
