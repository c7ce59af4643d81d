"""The changelog's intent journal (worker.changelog.intents): what two users of one
journal see of each other's intents, crashes' leftovers, compaction, and that a journal
reads back only what others wrote (its own lines were applied when written)."""

from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

import pytest

import worker.changelog.intents as intents
from worker.changelog.intents import IntentJournal


def counting_json(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    decoded: list[bytes] = []

    def loads(text: bytes) -> object:
        decoded.append(text)
        return json.loads(text)

    monkeypatch.setattr(intents, "json", types.SimpleNamespace(dumps=json.dumps, loads=loads))
    return decoded


def test_two_users_of_one_journal_see_each_others_intents_open_and_closed(tmp_path: Path) -> None:
    a, b = IntentJournal(tmp_path / "j"), IntentJournal(tmp_path / "j")
    i = a.start("command", {"command": "make", "call_id": "c1"}, ts=time.time())
    b.refresh()
    assert set(b._open) == {i} and b._open[i].record == {"command": "make", "call_id": "c1"}
    assert b.orphans() == [] and a.orphans() == []  # live work of this process
    assert a.end(i)
    b.refresh()
    assert b._open == {} and a._open == {}


def test_an_intent_given_up_is_an_orphan_to_every_user(tmp_path: Path) -> None:
    a, b = IntentJournal(tmp_path / "j"), IntentJournal(tmp_path / "j")
    i = a.start("command", {"command": "sleep 9"}, ts=time.time())
    a.abandon(i)
    assert [o.id for o in a.orphans()] == [i]
    assert [o.id for o in b.orphans()] == [i]
    assert b.end(i)  # reconciled by the other
    assert a.orphans() == []


def test_a_journal_decodes_only_what_others_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = IntentJournal(tmp_path / "j"), IntentJournal(tmp_path / "j")
    a.refresh()
    decoded = counting_json(monkeypatch)
    for _ in range(20):
        a.end(a.start("command", {"command": "true"}, ts=time.time()))
        assert a.orphans() == []
    assert decoded == []  # its own 40 lines: applied when written, skipped when read back
    b.refresh()
    assert len(decoded) == 40  # to another user they are lines like any
    decoded.clear()
    j = b.start("process", {"command": "server &"}, ts=time.time())
    assert set(a._open) == set() and a.orphans() == []
    assert len(decoded) == 1 and json.loads(decoded[0])["id"] == j  # the other's line, once
    assert j in a._open
    b.end(j)
    a.refresh()
    assert a._open == {}


def test_a_torn_line_and_empty_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "j"
    a = IntentJournal(path)
    i = a.start("command", {"command": "true"}, ts=time.time())
    with open(path, "ab") as f:
        f.write(b'\n\n{"op":"start","id":"torn","kin')
    b = IntentJournal(path)
    b.refresh()
    assert set(b._open) == {i}


def test_a_journal_compacted_by_one_user_is_read_whole_by_the_other(tmp_path: Path) -> None:
    path = tmp_path / "j"
    a, b = IntentJournal(path), IntentJournal(path)
    big = {"command": "x" * 4096}
    compacted = False
    for _ in range(200):
        i = a.start("command", big, ts=time.time())
        b.refresh()  # (b has read the journal at its longest)
        a.end(i)
        if path.stat().st_size == 0:  # nothing open, above COMPACT_BYTES: emptied
            compacted = True
            break
    assert compacted and a._open == {}
    i = a.start("command", {"command": "after"}, ts=time.time())
    assert path.stat().st_size < b._size  # (b read more than there is now: it reads it whole)
    b.refresh()
    assert set(b._open) == {i}
    a.abandon(i)
    assert [o.id for o in a.orphans()] == [i]  # its own line, read whole, still counts
    assert [o.id for o in b.orphans()] == [i]


def test_a_new_user_reads_the_whole_journal_its_own_process_wrote(tmp_path: Path) -> None:
    path = tmp_path / "j"
    a = IntentJournal(path)
    i = a.start("stage", {"path": "f.txt"}, temp=".f.txt.loom-t.tmp", ts=time.time())
    a.close()
    a2 = IntentJournal(path)  # (a changelog opened again in the same process)
    a2.refresh()
    assert a2._open[i].temp == ".f.txt.loom-t.tmp"
    assert os.path.getsize(path) > 0


def test_a_journal_reads_back_nothing_of_its_own_unless_another_line_came_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alone, a journal's own lines are never read back (the file grew by them only); when
    another process appends between its read and its write, the other's line is read as
    any, and its own skipped."""
    a, b = IntentJournal(tmp_path / "j"), IntentJournal(tmp_path / "j")
    a.refresh()
    preads: list[int] = []
    real_pread = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        preads.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(intents.os, "pread", pread)
    for _ in range(5):
        a.end(a.start("command", {"command": "true"}, ts=time.time()))
        assert a.orphans() == []
    assert preads == [] and a._mine == set()
    real_refresh = a.refresh
    between: list[str] = []

    def refresh_then_another_appends() -> None:
        real_refresh()
        if not between:  # (once: b's line lands after a's read, before a's write)
            between.append(b.start("process", {"command": "server &"}, ts=time.time()))

    monkeypatch.setattr(a, "refresh", refresh_then_another_appends)
    mine = a.start("command", {"command": "make"}, ts=time.time())
    monkeypatch.setattr(a, "refresh", real_refresh)
    assert len(a._mine) == 1  # its own line, to skip when read back
    a.refresh()
    assert set(a._open) == {mine, between[0]} and a._mine == set()
    assert a.end(mine) and b.end(between[0])
    a.refresh()
    assert a._open == {}
