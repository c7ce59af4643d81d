"""The call journal (worker.calls): records, redaction, pages, the tail, rotation, several
writing processes, and the registry writing it (LocalProcessBackend, no Docker)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from sandbox.local import LocalProcessBackend
from worker import ToolRegistry, ToolResult
from worker.calls import CallJournal, Tail, brief_args, end_cursor, mask_secrets, page
from worker.calls.journal import segments

OK = ToolResult.ok("out", {"exit_code": 0, "outcome": "exit"}, ["a.txt"])


def fill(journal: CallJournal, root: Path, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        journal.record(root, "shell_execute", {"command": f"echo {i}"}, OK, 1.0, call_id=f"c{i}", subtask_id=None)


def every_call(directory: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    before = None
    while True:
        found, before = page(directory, before=before, limit=37)
        out += found
        if before is None:
            return out


# -- the record ---------------------------------------------------------------------------


def test_arguments_are_shortened_never_contents_or_secrets() -> None:
    args = brief_args(
        {
            "path": "src/a.py",
            "content": "SECRET FILE CONTENT" * 100,
            "old_str": "x",
            "edits": [{"old_str": "a", "new_str": "b"}],
            "api_token": "tok-123",
            "Authorization": "Bearer abc",
            "command": "curl -H 'Authorization: Bearer abcdefghijkl' https://x && PASSWORD=hunter2 make",
            "timeout": 30,
            "line_range": [1, 20],
            "nested": {"a": 1},
            "long": "y" * 1000,
        }
    )
    text = json.dumps(args)
    assert "SECRET FILE CONTENT" not in text and "tok-123" not in text and "hunter2" not in text
    assert "abcdefghijkl" not in text
    assert args["path"] == "src/a.py" and args["timeout"] == 30 and args["line_range"] == [1, 20]
    assert args["content"] == "[1900 chars]" and args["old_str"] == "[1 chars]" and args["edits"] == "[list of 1]"
    assert args["api_token"] == args["Authorization"] == "[redacted]"
    assert args["nested"] == "[dict of 1]"
    assert args["long"].startswith("y" * 240) and args["long"].endswith("[+760 chars]")
    assert "curl" in args["command"] and "make" in args["command"]


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        ("export GITHUB_TOKEN=ghp_abcdef123", "ghp_abcdef123"),
        ("mysql --password s3cret -u root", "s3cret"),
        ('curl -H "Authorization: Bearer eyJhbGciOi.x.y" url', "eyJhbGciOi"),
        ("API_KEY='a b c' run", "a b c"),
        ("git clone https://x?secret=zzz", "zzz"),
    ],
)
def test_secrets_inside_a_command_are_masked(text: str, hidden: str) -> None:
    masked = mask_secrets(text)
    assert hidden not in masked and "[redacted]" in masked


def test_arguments_as_a_json_string_or_garbage() -> None:
    assert brief_args('{"path": "a"}') == {"path": "a"}
    assert brief_args("{not json") == {"(arguments)": "[not JSON: 9 chars]"}
    assert brief_args(None) == {}
    assert brief_args([1, 2]) == {"(arguments)": "[list of 2]"}  # type: ignore[arg-type]
    many = brief_args({f"k{i}": i for i in range(20)})
    assert len(many) == 17 and many["…"] == "4 more"


def test_a_record_holds_the_outcome(tmp_path: Path) -> None:
    j = CallJournal(tmp_path / "data")
    root = tmp_path / "ws"
    root.mkdir()
    bad = ToolResult.fail(
        "Command timed out after 1s", data={"exit_code": None, "outcome": "timeout"}, files_changed=["x"] * 30
    )
    j.record(root, "shell_execute", {"command": "sleep 9"}, bad, 1234.5, call_id="c1", subtask_id="t1")
    (rec,), nxt = page(j.directory(root))
    assert nxt is None
    assert rec["tool"] == "shell_execute" and rec["call_id"] == "c1" and rec["subtask_id"] == "t1"
    assert rec["success"] is False and rec["outcome"] == "timeout" and rec["exit_code"] is None
    assert rec["error"] == "Command timed out after 1s" and rec["duration_ms"] == 1234.5
    assert len(rec["files_changed"]) == 20 and rec["files_count"] == 30
    assert rec["pid"] == os.getpid() and rec["cursor"] == 0
    assert rec["ts"] - rec["started"] == pytest.approx(1.2345, abs=1e-3)
    assert oct(os.stat(j.directory(root) / "0000000000000000.jsonl").st_mode & 0o777) == "0o600"
    assert oct(os.stat(j.directory(root)).st_mode & 0o777) == "0o700"


def test_nothing_is_recorded_for_a_missing_workspace_or_with_no_budget(tmp_path: Path) -> None:
    j = CallJournal(tmp_path / "data")
    j.record(tmp_path / "nope", "read_file", {}, OK, 1.0, call_id="c", subtask_id=None)
    assert not (tmp_path / "data").exists()
    off = CallJournal(tmp_path / "data", max_bytes=0)
    off.record(tmp_path, "read_file", {}, OK, 1.0, call_id="c", subtask_id=None)
    assert not (tmp_path / "data").exists()


def test_a_journal_that_cannot_be_written_never_fails_the_caller(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file where the directory should be")
    j = CallJournal(tmp_path / "data")
    with capture_logs() as logs:
        for _ in range(3):
            j.record(tmp_path, "read_file", {}, OK, 1.0, call_id="c", subtask_id=None)
    assert [e["event"] for e in logs] == ["calls.journal_failed"]  # once, not per call


# -- pages and cursors --------------------------------------------------------------------


def test_pages_newest_first_with_a_before_cursor(tmp_path: Path) -> None:
    j = CallJournal(tmp_path / "data")
    fill(j, tmp_path, 120)
    d = j.directory(tmp_path)
    first, nxt = page(d, limit=50)
    assert [c["call_id"] for c in first] == [f"c{i}" for i in range(119, 69, -1)]
    assert nxt == first[-1]["cursor"]
    second, nxt2 = page(d, before=nxt, limit=50)
    assert [c["call_id"] for c in second] == [f"c{i}" for i in range(69, 19, -1)]
    third, nxt3 = page(d, before=nxt2, limit=50)
    assert [c["call_id"] for c in third] == [f"c{i}" for i in range(19, -1, -1)] and nxt3 is None
    cursors = [c["cursor"] for c in first + second + third]
    assert cursors == sorted(cursors, reverse=True) and len(set(cursors)) == 120
    assert page(d, before=0) == ([], None)
    assert page(tmp_path / "nothing") == ([], None)


def test_rotation_keeps_the_journal_bounded_and_cursors_stable(tmp_path: Path) -> None:
    j = CallJournal(tmp_path / "data", max_bytes=32 * 1024, segments=4)
    d = j.directory(tmp_path)
    fill(j, tmp_path, 10)
    early = page(d, limit=1)[0][0]["cursor"]
    fill(j, tmp_path, 2000, start=10)
    bases = segments(d)
    assert len(bases) == 4
    total = sum(os.stat(d / f"{b:016d}.jsonl").st_size for b in bases)
    assert total <= 32 * 1024 + 8 * 1024
    kept = every_call(d)
    numbers = [int(c["call_id"][1:]) for c in kept]
    # The newest calls, all of them, in order, and only the oldest ones dropped.
    assert numbers == list(range(2009, 2009 - len(numbers), -1)) and 50 < len(numbers) < 2010
    assert kept[-1]["cursor"] == bases[0] > early  # an old cursor stays an offset, never reused
    assert end_cursor(d) == bases[-1] + os.stat(d / f"{bases[-1]:016d}.jsonl").st_size


def test_a_torn_line_is_skipped(tmp_path: Path) -> None:
    j = CallJournal(tmp_path / "data")
    fill(j, tmp_path, 2)
    seg = j.directory(tmp_path) / "0000000000000000.jsonl"
    with open(seg, "ab") as f:
        f.write(b'{"tool": "x", "trunc\n')  # a write cut short by a full disk
    fill(j, tmp_path, 1, start=2)
    with open(seg, "ab") as f:
        f.write(b'{"tool": "partial')  # being written: no newline yet
    assert [c["call_id"] for c in every_call(j.directory(tmp_path))] == ["c2", "c1", "c0"]


# -- the tail -----------------------------------------------------------------------------


def test_tail_from_now_from_a_cursor_and_from_the_start(tmp_path: Path) -> None:
    j = CallJournal(tmp_path / "data")
    d = j.directory(tmp_path)
    before_any = Tail(d)  # the journal does not exist yet
    assert before_any.read() == []
    fill(j, tmp_path, 3)
    now = Tail(d)
    assert now.read() == []
    fill(j, tmp_path, 2, start=3)
    assert [c["call_id"] for c in now.read()] == ["c3", "c4"]
    assert now.read() == []
    assert [c["call_id"] for c in before_any.read()] == ["c0", "c1", "c2", "c3", "c4"]
    c1 = page(d)[0][3]["cursor"]
    assert [c["call_id"] for c in Tail(d, c1).read()] == ["c2", "c3", "c4"]
    assert [c["call_id"] for c in Tail(d, -1).read()] == ["c0", "c1", "c2", "c3", "c4"]
    for t in (now, before_any):
        t.close()


def test_tail_follows_across_rotation_and_skips_what_was_dropped(tmp_path: Path) -> None:
    j = CallJournal(tmp_path / "data", max_bytes=64 * 1024, segments=4)  # about 50 calls a segment
    d = j.directory(tmp_path)
    fill(j, tmp_path, 5)
    t = Tail(d, -1)
    got = [c["call_id"] for c in t.read()]
    fill(j, tmp_path, 60, start=5)  # about two segments: nothing dropped yet
    got += [c["call_id"] for c in t.read()]
    assert got == [f"c{i}" for i in range(65)]
    assert len(segments(d)) == 2
    fill(j, tmp_path, 1000, start=65)  # far behind: its position was dropped
    rest = [int(c["call_id"][1:]) for c in t.read()]
    while more := t.read():
        rest += [int(c["call_id"][1:]) for c in more]
    assert rest == list(range(rest[0], 1065)) and rest[0] > 65
    t.close()


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from worker.calls import CallJournal
    from worker.result import ToolResult
    data, root, who, n = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    j = CallJournal(data, max_bytes=64 * 1024, segments=8)
    r = ToolResult.ok("x", {}, [])
    for i in range(n):
        j.record(root, "write_file", {"path": f"{who}/{i}", "content": "z" * (i % 300)}, r, 1.0,
                 call_id=f"{who}-{i}", subtask_id=None, root=root)
    """
)


def test_several_processes_append_whole_lines_in_one_order(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(data), str(tmp_path), f"p{k}", "400"], env=env)
        for k in range(4)
    ]
    assert [p.wait(120) for p in procs] == [0, 0, 0, 0]
    d = CallJournal(data).directory(tmp_path)
    raw = b"".join((d / f"{b:016d}.jsonl").read_bytes() for b in segments(d))
    assert all(json.loads(line)["tool"] == "write_file" for line in raw.splitlines())  # none torn
    kept = every_call(d)
    assert 0 < len(kept) <= 1600
    per_writer: dict[str, list[int]] = {}
    for c in reversed(kept):
        who, i = c["call_id"].split("-")
        per_writer.setdefault(who, []).append(int(i))
    for who, seq in per_writer.items():  # each writer's calls in its own order, none missing
        assert seq == list(range(seq[0], 400)), who
    # the segments are contiguous: each starts where the previous one ended
    bases = segments(d)
    for a, b in itertools.pairwise(bases):
        assert a + os.stat(d / f"{a:016d}.jsonl").st_size == b


# -- written by the registry --------------------------------------------------------------


async def test_the_registry_records_every_call_with_an_id(tmp_path: Path, local_backend: LocalProcessBackend) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    reg = ToolRegistry(backend=local_backend)
    reg.journal = CallJournal(tmp_path / "data")
    woken: list[int] = []
    reg.journal.subscribe(ws, lambda: woken.append(1))
    await reg.execute("write_file", {"path": "a.txt", "content": "hello"}, ws)
    await reg.execute("read_file", {"path": "a.txt"}, str(ws), call_id="mine", subtask_id="s1")
    await reg.execute("read_file", {"nope": 1}, ws)  # refused by validation: still a call
    await reg.execute("no_such_tool", {}, ws)
    await reg.execute("read_file", {"path": "a.txt"}, tmp_path / "missing")  # no workspace: not recorded
    await reg.execute("read_file", {"path": "a.txt"})  # none given: not recorded
    await asyncio.sleep(0)  # written just after each call, at the loop's next turn
    calls = every_call(reg.journal.directory(ws))[::-1]
    assert [c["tool"] for c in calls] == ["write_file", "read_file", "read_file", "no_such_tool"]
    assert calls[0]["args"] == {"path": "a.txt", "content": "[5 chars]"} and calls[0]["files_changed"] == ["a.txt"]
    assert calls[0]["call_id"].startswith("call_") and len(calls[0]["call_id"]) == 21
    assert calls[1]["call_id"] == "mine" and calls[1]["subtask_id"] == "s1" and calls[1]["success"]
    assert not calls[2]["success"] and "Invalid arguments" in calls[2]["error"]
    assert 1 <= len(woken) <= 4  # one wake-up per write (calls queued in one turn share one)
    assert not (tmp_path / "data" / "workspaces").joinpath("missing").exists()


async def test_calls_without_an_id_are_recorded_in_the_changelog_under_the_new_id(
    tmp_path: Path, local_backend: LocalProcessBackend
) -> None:
    from worker.http.changelog import ChangelogPool

    ws = tmp_path / "ws"
    ws.mkdir()
    pool = ChangelogPool(tmp_path / "data")
    reg = ToolRegistry(backend=local_backend, recorder_factory=pool.recorder)
    reg.journal = CallJournal(tmp_path / "data")
    try:
        await reg.execute("write_file", {"path": "a.txt", "content": "1"}, ws)
        reg.journal.flush()
        (call,), _ = page(reg.journal.directory(ws))
        entries = await pool.recorder(ws).log()
        assert [e.call_id for e in entries] == [call["call_id"]]
    finally:
        await pool.aclose()


def test_default_registry_has_a_journal_under_the_data_dir(tmp_path: Path) -> None:
    from worker import default_registry

    reg = default_registry(data_dir=tmp_path, catalog=False, call_journal_bytes=1 << 20)
    assert isinstance(reg.journal, CallJournal)
    assert reg.journal.data_dir == tmp_path and reg.journal.max_bytes == 1 << 20


async def test_queued_calls_are_written_by_close_or_at_once_without_a_loop(tmp_path: Path) -> None:
    j = CallJournal(tmp_path / "data")
    j.record(tmp_path, "read_file", {"path": "a"}, OK, 1.0, call_id="queued", subtask_id=None)
    assert page(j.directory(tmp_path)) == ([], None)
    j.close()  # a process ending writes what it queued
    assert [c["call_id"] for c in page(j.directory(tmp_path))[0]] == ["queued"]
    args = {"path": "before"}
    j.record(tmp_path, "read_file", args, OK, 1.0, call_id="copied", subtask_id=None)
    args["path"] = "after"  # the caller reuses its dict: the journal kept what was called
    await asyncio.sleep(0)
    assert page(j.directory(tmp_path))[0][0]["args"] == {"path": "before"}
