"""The agent's serving loop (``sandbox.agent.main._serve``): the reading role passes
between threads, a slow request runs on the thread that read it while another reads on,
fast requests and notifications run inline in order, and the channel's end returns at once
even while a slow request still runs. Driven in-process over a pipe with stand-in ops."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.agent import channel, main

WAIT = 10.0  # seconds any one step may take before the test fails (never reached when it works)


class Rig:
    """A pipe the test writes requests into, ``_serve`` on a thread reading it, and the
    answers it sends, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.gates: dict[str, threading.Event] = {}
        self.threads: dict[str, int] = {}  # op id -> the thread that ran it
        self.notified: list[Any] = []

        def send(obj: dict[str, Any]) -> None:
            with self.cond:
                self.answers.append(obj)
                self.cond.notify_all()

        def slow(req: dict[str, Any]) -> dict[str, Any]:
            self.threads[req["tag"]] = threading.get_ident()
            gate = self.gates.get(req["tag"])
            if gate is not None:
                assert gate.wait(WAIT)
            return {"tag": req["tag"]}

        def fast(req: dict[str, Any]) -> dict[str, Any]:
            self.threads[req["tag"]] = threading.get_ident()
            return {"tag": req["tag"]}

        monkeypatch.setattr(channel, "send", send)
        monkeypatch.setattr(main.activity, "touch", lambda: None)
        monkeypatch.setattr(main, "SLOW_OPS", {"slow": slow})
        monkeypatch.setattr(main, "FAST_OPS", {"fast": fast})
        monkeypatch.setattr(main, "NOTIFY_OPS", {"note": lambda req: self.notified.append(req["tag"])})
        r, self.w = os.pipe()
        self.reader = os.fdopen(r, "rb")
        self.ended = threading.Event()
        self.serving = threading.Thread(target=self._serve, daemon=True)
        self.serving.start()
        self._ids = iter(range(1, 1 << 30))

    def _serve(self) -> None:
        main._serve(self.reader)
        self.ended.set()

    def send(self, op: str, tag: str, *, gate: bool = False, notify: bool = False) -> None:
        if gate:
            self.gates[tag] = threading.Event()
        req: dict[str, Any] = {"op": op, "tag": tag}
        if not notify:
            req["id"] = next(self._ids)
        os.write(self.w, json.dumps(req).encode() + b"\n")

    def answer(self, tag: str) -> dict[str, Any]:
        """Wait for the answer of the request tagged ``tag``."""
        deadline = time.monotonic() + WAIT
        with self.cond:
            while True:
                for a in self.answers:
                    if a.get("ok") and a["result"]["tag"] == tag:
                        return a
                left = deadline - time.monotonic()
                assert left > 0, f"no answer for {tag}: {self.answers}"
                self.cond.wait(left)

    def tags(self) -> list[str]:
        with self.cond:
            return [a["result"]["tag"] for a in self.answers if a.get("ok")]

    def close(self) -> None:
        for gate in self.gates.values():
            gate.set()
        os.close(self.w)


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    r = Rig(monkeypatch)
    yield r
    r.close()
    assert r.ended.wait(WAIT)


def test_a_fast_request_is_answered_while_a_slow_one_runs(rig: Rig) -> None:
    rig.send("slow", "s1", gate=True)
    rig.send("fast", "f1")
    rig.send("note", "n1", notify=True)
    rig.send("fast", "f2")
    rig.answer("f2")
    assert rig.tags() == ["f1", "f2"]  # in order, the slow one still held
    assert rig.notified == ["n1"]
    rig.gates["s1"].set()
    rig.answer("s1")
    assert rig.tags() == ["f1", "f2", "s1"]


def test_slow_requests_run_at_once_side_by_side(rig: Rig) -> None:
    for i in range(5):
        rig.send("slow", f"s{i}", gate=True)
    rig.send("fast", "after")
    rig.answer("after")  # read on, past five slow requests that all still run
    assert len({rig.threads[f"s{i}"] for i in range(5)}) == 5
    for i in reversed(range(5)):
        rig.gates[f"s{i}"].set()
        rig.answer(f"s{i}")
    assert rig.tags()[1:] == [f"s{i}" for i in reversed(range(5))]


def test_a_slow_request_runs_on_the_thread_that_read_it_and_threads_are_reused(rig: Rig) -> None:
    # Requests one after another, each answered before the next: the thread that reads a
    # slow one runs it (so does it reading the fast one before it), and the pool does not
    # grow past the two threads that take turns.
    seen = set()
    for i in range(30):
        rig.send("fast", f"f{i}")
        rig.send("slow", f"s{i}")
        rig.answer(f"s{i}")
        assert rig.threads[f"s{i}"] == rig.threads[f"f{i}"]
        seen.add(rig.threads[f"s{i}"])
    assert len(seen) <= 2


def test_the_end_of_the_channel_returns_while_a_slow_request_runs(rig: Rig) -> None:
    rig.send("slow", "stuck", gate=True)
    rig.send("fast", "f")
    rig.answer("f")
    os.close(rig.w)
    assert rig.ended.wait(WAIT)  # the caller's cleanup (killing what runs) is not held up
    rig.gates["stuck"].set()
    rig.answer("stuck")
    rig.w = os.open(os.devnull, os.O_WRONLY)  # (for the fixture's close)


def test_a_malformed_line_is_refused_and_serving_goes_on(rig: Rig) -> None:
    os.write(rig.w, b"not json\n")
    rig.send("fast", "f")
    rig.answer("f")
    assert rig.answers[0]["ok"] is False and rig.answers[0]["code"] == "invalid"


def test_a_command_environment_follows_the_configuration(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The base environment is made once per configuration (not per command), and a new
    configuration makes it again; a caller's variables never stick to it."""
    from sandbox.agent import environ, state

    for name, value in list(vars(state).items()):  # configure sets the module's globals
        if not name.startswith("__") and not callable(value):
            monkeypatch.setattr(state, name, value)
    monkeypatch.setattr(state, "image_env", {})
    monkeypatch.setattr(state, "path_prepend", [])
    state.configure({"root": str(tmp_path), "path_prepend": ["/opt/a/bin"]})
    env, cwd = environ.command_env_cwd({"cwd": ".", "env": {"X": "1"}})
    assert cwd == str(tmp_path) and env["X"] == "1" and ":/opt/a/bin:" in env["PATH"]
    env2, _ = environ.command_env_cwd({"cwd": "."})
    assert "X" not in env2
    (tmp_path / "sub").mkdir()
    state.configure({"root": str(tmp_path), "path_prepend": ["/opt/b/bin"]})
    env3, cwd3 = environ.command_env_cwd({"cwd": "sub"})
    assert cwd3 == str(tmp_path / "sub") and ":/opt/b/bin:" in env3["PATH"] and "/opt/a/bin" not in env3["PATH"]


def test_the_oom_count_is_read_again_each_time(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.agent import cgroup

    f = tmp_path / "memory.events"
    f.write_text("low 0\noom 2\noom_kill 3\noom_group_kill 0\n")
    monkeypatch.setattr(cgroup, "_OOM_FILES", (str(tmp_path / "absent"), str(f)))
    monkeypatch.setattr(cgroup, "_oom_fd", [])
    assert cgroup.oom_kills() == 3
    f.write_text("low 0\noom 4\noom_kill 14\noom_group_kill 0\n")  # (in place: the same file)
    assert cgroup.oom_kills() == 14
    monkeypatch.setattr(cgroup, "_OOM_FILES", (str(tmp_path / "absent"),))
    monkeypatch.setattr(cgroup, "_oom_fd", [])
    assert cgroup.oom_kills() is None


def test_with_no_thread_to_be_had_requests_take_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox's process limit reached (a command's fork bomb): no thread can be
    started, and the agent still serves, one request at a time."""
    real = main._thread.start_new_thread
    started: list[object] = []

    def refuse(fn, args):
        if started:
            raise RuntimeError("can't start new thread")
        started.append(fn)
        return real(fn, args)

    monkeypatch.setattr(main._thread, "start_new_thread", refuse)
    r = Rig(monkeypatch)
    try:
        for i in range(5):
            r.send("slow", f"s{i}")
            r.send("fast", f"f{i}")
        r.answer("f4")
        assert r.tags() == [t for i in range(5) for t in (f"s{i}", f"f{i}")]  # in turn
        assert len({r.threads[f"s{i}"] for i in range(5)}) == 1
    finally:
        r.close()
    assert r.ended.wait(WAIT)


def test_with_no_thread_at_all_the_caller_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fn, args):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(main._thread, "start_new_thread", refuse)
    r = Rig(monkeypatch)
    try:
        r.send("slow", "s")
        r.send("fast", "f")
        r.answer("f")
        assert r.tags() == ["s", "f"]
    finally:
        r.close()
    assert r.ended.wait(WAIT)
