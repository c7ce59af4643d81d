"""The background-process supervisor (``sandbox/agent/supervisor.py``) as the program it
is, run on the host: its output log (head and tail with cursors, what was dropped), "done"
only once both pipes are read to their end, stdin, the tree killed (setsid and double-forked
children included), the timeout, release. The same program runs in every sandbox; the
Docker tier (tests/docker/test_processes.py) covers it through the agent under runc and
gVisor."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.agent.supervisor import Stream

SUPERVISOR = Path(__file__).resolve().parents[2] / "sandbox" / "agent" / "supervisor.py"


# -- the log ---------------------------------------------------------------------------


def test_stream_keeps_head_and_tail_and_says_what_was_dropped() -> None:
    s = Stream(head=4, tail=6)
    for piece in (b"abc", b"defg", b"hijkl", b"mnop"):
        s.add(piece)
    assert s.total == 16
    assert s.read(0, 100) == (b"abcd", 4, 0)  # the head, then the caller asks again
    assert s.read(4, 100) == (b"klmnop", 16, 6)  # 6 bytes (efghij) fell out between
    assert s.read(12, 2) == (b"mn", 14, 0)
    assert s.read(16, 100) == (b"", 16, 0)
    assert s.read(99, 100) == (b"", 16, 0)  # a cursor past the end is held to it


def test_stream_with_nothing_dropped_reads_back_exactly() -> None:
    s = Stream(head=8, tail=1 << 20)
    data = bytes(range(256)) * 40
    for i in range(0, len(data), 97):
        s.add(data[i : i + 97])
    got, cursor = b"", 0
    while cursor < s.total:
        chunk, cursor, dropped = s.read(cursor, 1000)
        assert dropped == 0
        got += chunk
    assert got == data


# -- the program -----------------------------------------------------------------------


class Sup:
    def __init__(self, tmp: Path, command: str, **cfg: Any) -> None:
        self.path = tmp / "p1.sock"
        conf = {"id": "p1", "dir": str(tmp), "marker": "m-" + tmp.name, "command": command, "cwd": str(tmp)}
        conf.update(cfg)
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPERVISOR)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(conf).encode() + b"\n")
        self.proc.stdin.flush()
        ready = json.loads(self.proc.stdout.readline())
        assert ready["ok"], ready
        self.info = ready["info"]
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(str(self.path))
        self.reader = self.sock.makefile("rb")

    def op(self, op: str, **req: Any) -> dict[str, Any]:
        self.sock.sendall(json.dumps({"op": op, **req}).encode() + b"\n")
        answer = json.loads(self.reader.readline())
        assert answer["ok"], answer
        result: dict[str, Any] = answer["result"]
        return result

    def read_all(self, seconds: float = 30) -> tuple[bytes, bytes, dict[str, Any]]:
        out = err = b""
        deadline = time.monotonic() + seconds
        while True:
            r = self.op("output", wait_ms=500)
            out += base64.b64decode(r["stdout"])
            err += base64.b64decode(r["stderr"])
            if r["done"]:
                return out, err, r
            assert time.monotonic() < deadline, "never done"

    def close(self) -> None:
        try:
            self.op("release")
        except (OSError, ValueError, AssertionError):
            pass
        self.sock.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Any]:
    made: list[Sup] = []

    def start(command: str, **cfg: Any) -> Sup:
        s = Sup(tmp_path, command, **cfg)
        made.append(s)
        return s

    yield start
    for s in made:
        s.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_output_in_order_nothing_lost_and_done_only_at_the_end(sup: Any) -> None:
    s = sup("for i in $(seq 1 2000); do echo out-$i; echo err-$i >&2; done; exit 3")
    out, err, last = s.read_all()
    assert out.split() == [f"out-{i}".encode() for i in range(1, 2001)]
    assert err.split() == [f"err-{i}".encode() for i in range(1, 2001)]
    assert last["exit_code"] == 3 and last["outcome"] == "exit" and not last["running"]
    # read from the start again by cursor: the log is kept, not consumed
    again = s.op("output", since=[0, 0])
    assert base64.b64decode(again["stdout"]).split()[:2] == [b"out-1", b"out-2"]


def test_a_child_left_holding_the_pipes_is_killed_and_its_output_read(sup: Any) -> None:
    # The main process exits at once; the child it left holds stdout open. It is killed
    # with the tree, and "done" comes only after both pipes ended, with all it printed.
    s = sup("(echo child; sleep 300) & sleep 0.2; echo main")
    out, _err, last = s.read_all()
    assert sorted(out.split()) == [b"child", b"main"]
    assert last["done"] and not last["running"] and last["exit_code"] == 0
    assert last["stdout_bytes"] == len(out)


def test_stdin_and_eof(sup: Any) -> None:
    s = sup("read name; echo hello $name; cat; echo bye")
    s.op("input", data=base64.b64encode(b"loom\nmore\n").decode())
    s.op("input", data="", eof=True)
    out, _err, last = s.read_all()
    assert out == b"hello loom\nmore\nbye\n"
    assert last["exit_code"] == 0


def test_kill_ends_the_whole_tree_setsid_and_double_fork_included(sup: Any, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    s = sup(
        f"sleep 300 & echo $! >> {pids}; setsid sleep 301 & echo $! >> {pids}; "
        f"(sh -c 'sleep 302 & echo $! >> {pids}' &); sleep 303"
    )
    deadline = time.monotonic() + 10
    while not (pids.exists() and len(pids.read_text().split()) == 3):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    children = [int(p) for p in pids.read_text().split()]
    assert all(alive(p) for p in children)
    info = s.op("kill", grace=0.2)
    # TERM: the shell dies of it, or of its waited-for sleep's death (then it exits 143)
    assert not info["running"] and info["exit_code"] == 128 + signal.SIGTERM
    deadline = time.monotonic() + 5
    while any(alive(p) for p in children):
        assert time.monotonic() < deadline, [p for p in children if alive(p)]
        time.sleep(0.05)


def test_timeout_kills_and_says_so(sup: Any) -> None:
    s = sup("echo started; sleep 300", timeout=0.5)
    out, _err, last = s.read_all()
    assert out == b"started\n"
    assert last["outcome"] == "timeout" and last["exit_code"] == 128 + signal.SIGTERM


def test_flood_is_bounded_and_the_gap_is_said(sup: Any) -> None:
    s = sup("head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END", head=1000, tail=10000)
    out, _err, last = s.read_all()
    assert last["stdout_bytes"] == 3000000 + 5
    assert out.endswith(b"x\nEND\n") and set(out[:-5]) == {ord("x")}  # read as it came: what was kept
    first = s.op("output", since=[0, 0])
    assert base64.b64decode(first["stdout"]) == b"x" * 1000
    rest = s.op("output", since=[1000, 0])
    assert rest["dropped"][0] == 3000005 - 1000 - 10000
    assert base64.b64decode(rest["stdout"]).endswith(b"x\nEND\n")


def test_release_ends_the_supervisor(sup: Any) -> None:
    s = sup("sleep 300")
    s.op("release")
    s.proc.wait(10)
    assert s.proc.returncode == 0
    assert not s.path.exists()


def test_the_zygote_forks_supervisors_that_outlive_it(tmp_path: Path) -> None:
    """``supervisor.py zygote``: one config line in, one forked supervisor (its own session,
    not waited for) and its answer line out; the supervisors go on when the zygote ends."""
    zygote = subprocess.Popen(
        [sys.executable, str(SUPERVISOR), "zygote"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    answers = []
    for i in (1, 2):
        conf = {"id": f"z{i}", "dir": str(tmp_path), "marker": f"m-z{i}", "command": f"echo zygote-{i}; sleep 300"}
        zygote.stdin.write(json.dumps({**conf, "cwd": str(tmp_path)}).encode() + b"\n")
        zygote.stdin.flush()
        answers.append(json.loads(zygote.stdout.readline()))
    assert all(a["ok"] for a in answers), answers
    pids = [a["supervisor"] for a in answers]
    assert len(set(pids)) == 2 and zygote.pid not in pids
    for pid in pids:
        assert os.getsid(pid) == pid  # a session of its own
    zygote.stdin.close()  # its agent went: the zygote ends, the supervisors do not
    assert zygote.wait(10) == 0
    deadline = time.monotonic() + 10
    while _in_session(zygote.pid):  # (nor the child it had forked ahead, which ends)
        assert time.monotonic() < deadline, "the zygote left a child behind"
        time.sleep(0.05)
    for i, pid in enumerate(pids, 1):
        assert alive(pid)
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(tmp_path / f"z{i}.sock"))
            reader = s.makefile("rb")
            s.sendall(json.dumps({"op": "output", "since": [0, 0], "wait_ms": 5000}).encode() + b"\n")
            out = json.loads(reader.readline())["result"]
            assert base64.b64decode(out["stdout"]) == f"zygote-{i}\n".encode()
            s.sendall(json.dumps({"op": "kill", "signal": 9, "grace": 0}).encode() + b"\n")
            assert json.loads(reader.readline())["result"]["running"] is False
            s.sendall(b'{"op": "release"}\n')
            reader.readline()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, "the released supervisors did not exit"
        time.sleep(0.05)


def _in_session(sid: int) -> list[int]:
    """The live processes of session ``sid``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and alive(int(name)):
            try:
                with open(f"/proc/{name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:
                found.append(int(name))
    return found
