"""The agent's JSON (``sandbox.agent.jsonline``) and its two patterns matched without ``re``
give exactly what ``json`` and the regular expressions they replace give: the same bytes,
the same objects, the same errors (the agent's boot imports neither ``json`` nor ``re``,
tests/unit/test_agent_boot_imports.py)."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from sandbox.agent import fswatch, jsonline, processes

OBJECTS: list[Any] = [
    {"a": 1},
    {"id": 3, "op": "exec", "command": "echo é \u2028 \x00 \"'\\", "timeout": 60.0, "env": {"K": "v"}},
    {"x": [1.5, -0.0, 1e300, 5e-324, None, True, False, 10**30, -7]},
    {"inf": float("inf"), "-inf": float("-inf")},
    {"nested": {"deep": [[[{"k": ["v"]}]]]}},
    {"\U0001f600": "\ud83d\ude00 astral", "surrogate": "\ud800"},
    [],
    {},
    5,
    None,
    "a bare string é",
]


def _outcome(fn: Any, *args: Any) -> tuple[str, str]:
    try:
        return "ok", repr(fn(*args))
    except Exception as e:
        return type(e).__name__, str(e)


def test_the_c_accelerator_serves_here() -> None:
    jsonline.loads(b"{}")
    assert jsonline._fast and jsonline._fast[0] is not None and jsonline._fast[1] is not None


@pytest.mark.parametrize("obj", OBJECTS, ids=range(len(OBJECTS)))
def test_dumps_and_loads_are_jsons(obj: Any) -> None:
    ref = json.dumps(obj, separators=(",", ":")).encode()
    assert jsonline.dumps(obj) == ref
    assert repr(jsonline.loads(ref)) == repr(json.loads(ref))
    assert repr(jsonline.loads(ref.decode())) == repr(json.loads(ref.decode()))


def test_nan_round_trips_as_json_does() -> None:
    line = jsonline.dumps({"n": float("nan")})
    assert line == b'{"n":NaN}'
    assert str(jsonline.loads(line)["n"]) == "nan"


@pytest.mark.parametrize(
    "data",
    [
        b' \t{"a": 1}\r\n',
        b'{"a":1} x',
        b"",
        b"   ",
        b"\xff{}",
        b'\xef\xbb\xbf{"a":1}',
        '{"a":1}'.encode("utf-16"),
        '{"a":1}'.encode("utf-32"),
        b"[1,2",
        b'"\x01"',
        b'{"a":1}{"b":2}',
        b'{"a":"\\ud800"}',
        "\ufeff{}",
        "  {}  ",
        bytearray(b'{"b":[true]}'),
        b"NaN",
        b"-Infinity",
        b"01",
    ],
)
def test_loads_answers_and_fails_as_json_does(data: Any) -> None:
    assert _outcome(jsonline.loads, data) == _outcome(json.loads, data)


@pytest.mark.parametrize("obj", [{1: 2}, {"a": {1, 2}}, {(1,): 2}, {"b": b"x"}, {True: None, 2.5: 1}])
def test_dumps_fails_and_coerces_keys_as_json_does(obj: Any) -> None:
    ours = _outcome(lambda o: jsonline.dumps(o).decode(), obj)
    assert ours == _outcome(lambda o: json.dumps(o, separators=(",", ":")), obj)


def test_a_circular_object_is_refused() -> None:
    c: dict[str, Any] = {}
    c["c"] = c
    with pytest.raises(ValueError, match="Circular reference detected"):
        jsonline.dumps(c)


def test_without_the_accelerator_json_itself_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonline, "_fast", [None, None])
    assert jsonline.dumps({"a": [1, "é"]}) == b'{"a":[1,"\\u00e9"]}'
    assert jsonline.loads(b'{"a": 1}') == {"a": 1}
    with pytest.raises(ValueError):
        jsonline.loads(b"{")


def _strings(alphabet: str, n: int, longest: int) -> list[str]:
    rng = random.Random(44)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, longest))) for _ in range(n)]


def test_a_writes_temporary_is_recognised_as_the_pattern_did() -> None:
    pattern = re.compile(r"\..*\.loom-[A-Za-z0-9]+\.tmp\Z", re.S)
    names = [
        ".x.loom-abc.tmp",
        "..loom-a.tmp",
        ".loom-a.tmp",
        "..loom-.tmp",
        ".a.loom-ab.loom-c.tmp",
        ".a.loom-a-b.tmp",
        ".a\n.loom-x.tmp",
        ".a.loom-é.tmp",
        ".a.loom-x.tmp\n",
        ".report.txt.loom-0a1b2c3d4e5f.tmp",
        *_strings(".loom-tmpab9Z_\n é", 30000, 16),
    ]
    assert [n for n in names if fswatch._temporary(n) != bool(pattern.match(n))] == []


def test_a_process_id_is_checked_as_the_pattern_did_and_without_a_trailing_newline() -> None:
    pattern = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
    ids = ["a", "a" * 64, "a" * 65, "", "a-b_c", "a b", "é", "A9", *_strings("aZ9_-\n .é", 20000, 70)]
    assert [i for i in ids if processes._valid_id(i) != bool(pattern.match(i))] == []
    # (the pattern it replaces, ``^...$``, let "abc\n" through: an id never ends in a newline)
    assert not processes._valid_id("abc\n")
    assert not processes._valid_id(7)
