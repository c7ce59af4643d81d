"""The host-side OOM-kill count of a container's memory cgroup (sandbox.docker.memcg)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.docker import memcg


def test_cgroup_v1_and_v2_lines_name_their_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(memcg, "CGROUP_ROOT", tmp_path)
    v1 = "12:pids:/docker/abc\n9:memory:/docker/abc\n1:name=systemd:/docker/abc\n"
    assert memcg.files_of(v1) == [tmp_path / "memory/docker/abc/memory.oom_control"]
    v2 = "0::/system.slice/docker-abc.scope\n"
    assert memcg.files_of(v2) == [tmp_path / "system.slice/docker-abc.scope/memory.events"]
    assert memcg.files_of("garbage\n\n") == []


def test_the_count_is_read_and_follows_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(memcg, "CGROUP_ROOT", tmp_path)
    events = tmp_path / "memory/docker/abc/memory.oom_control"
    events.parent.mkdir(parents=True)
    events.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    monkeypatch.setattr(memcg, "_files", lambda pid: memcg.files_of("9:memory:/docker/abc\n"))
    counter = memcg.oom_counter(1234)
    assert counter is not None and counter() == 3
    events.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    assert counter() == 4
    events.unlink()
    assert counter() is None  # the container is gone: nothing to compare, never an error


def test_no_counter_without_a_process_or_a_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert memcg.oom_counter(0) is None
    assert memcg.oom_counter(2**22 + 12345) is None  # no such process
    monkeypatch.setattr(memcg, "CGROUP_ROOT", tmp_path)  # a kernel without the files
    assert memcg.oom_counter(os.getpid()) is None
