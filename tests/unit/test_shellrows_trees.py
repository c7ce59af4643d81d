"""Which new directories become one tree entry, and which tree or group a path falls in:
the linear :func:`tree_roots`, :class:`Covering` and ``Group``'s topmost-new lookup give
what their definitions (every path walking up its ancestors, quadratic in a deep chain)
give, on random trees and on a chain 5,000 directories deep."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.changelog import Limits
from worker.changelog.shellrows import TREE_MIN_PATHS, Covering, Group, Row, ignored_root, tree_name, tree_roots


def _row(path: str, kind: str) -> Row:
    return Row(path, kind, 0, 0, 0, 0, None, None, "ok")


def _by_definition(new: dict[str, Row], ignored: frozenset[str]) -> dict[str, str]:
    """tree_roots as first written: each path walks all its ancestors."""
    inside: dict[str, int] = {}
    for path in new:
        parent = path.rpartition("/")[0]
        while parent in new:
            inside[parent] = inside.get(parent, 0) + 1
            parent = parent.rpartition("/")[0]
    out: dict[str, str] = {}
    for path in sorted(new, key=lambda p: p.count("/")):
        if new[path].type != "dir" or ignored_root(path, ignored) is not None:
            continue
        if not tree_name(path, ignored) and inside.get(path, 0) <= TREE_MIN_PATHS:
            continue
        if _covering_by_definition(path, out) is None:
            out[path] = path
    return out


def _covering_by_definition(path: str, trees: Mapping[str, object]) -> str | None:
    parent = path.rpartition("/")[0]
    while parent:
        if parent in trees:
            return parent
        parent = parent.rpartition("/")[0]
    return None


def _topmost_by_definition(path: str, root: str, new: dict[str, Row]) -> str | None:
    parent, top = path.rpartition("/")[0], None
    while parent and parent != root:
        if parent in new:
            top = parent
        parent = parent.rpartition("/")[0]
    return top


_NAMES = st.sampled_from(["a", "b", "c", ".git", "node_modules", "x"])


@st.composite
def _trees(draw: st.DrawFn) -> tuple[dict[str, Row], set[str]]:
    """Random made trees: some directories existed before (not new), some are wide."""
    dirs = [""]
    new: dict[str, Row] = {}
    for _ in range(draw(st.integers(1, 40))):
        parent = draw(st.sampled_from(dirs))
        name = draw(_NAMES) + str(len(dirs))
        path = f"{parent}/{name}" if parent else name
        dirs.append(path)
        if draw(st.booleans()) or parent in new or parent == "":
            new[path] = _row(path, "dir")
        for i in range(draw(st.sampled_from([0, 1, 3, TREE_MIN_PATHS + 1]))):
            f = f"{path}/f{i}"
            new[f] = _row(f, "file")
    return new, set(dirs)


@settings(max_examples=200, deadline=None)
@given(_trees())
def test_trees_covering_and_groups_are_what_their_definitions_say(made: tuple[dict[str, Row], set[str]]) -> None:
    new, _dirs = made
    ignored = frozenset(Limits().ignored_dirs)
    trees = tree_roots(new, ignored)
    assert set(trees) == set(_by_definition(new, ignored))
    cover = Covering(trees)
    for path in sorted(new):
        assert cover(path) == _covering_by_definition(path, trees), path
    for root in ["", *sorted(p for p in new if new[p].type == "dir")[:5]]:
        group = Group(root)
        for path in sorted(new, reverse=True):  # any order: each answer is remembered
            assert group._topmost_new(path.rpartition("/")[0], new) == _topmost_by_definition(path, root, new)


def test_a_chain_5000_deep_is_one_tree_and_everything_is_inside_it() -> None:
    paths = ["deep"]
    for _ in range(5000):
        paths.append(paths[-1] + "/d")
    new = {p: _row(p, "dir") for p in paths}
    new[paths[-1] + "/bottom.txt"] = _row(paths[-1] + "/bottom.txt", "file")
    trees = tree_roots(new, Limits().ignored_dirs)
    assert list(trees) == ["deep"]
    cover = Covering(trees)
    assert {cover(p) for p in new if p != "deep"} == {"deep"}
    group = Group("")
    assert group._topmost_new(paths[-1], new) == "deep"
