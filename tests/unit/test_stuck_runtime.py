"""sandbox.docker.stuck: which host processes are a gVisor sandbox's runtime (a fake /proc)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.docker import stuck

ID = "3a677ca585aade12bc982de9a067857cb4ec5c73a54d022b9e43371dc78b0f68"
OTHER = "0202eac0c9f8e14683910acbac6ade5b6b77ac0e86e33f03e512b25ff3c3a9bc"
LOG = "--log=/var/run/docker/containerd/daemon/io.containerd.runtime.v2.task/moby/{}/log.json"


def fake_proc(tmp_path: Path, procs: dict[str, list[str]]) -> Path:
    proc = tmp_path / "proc"
    for pid, argv in procs.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (proc / "self").mkdir()  # (not a pid)
    (proc / "77").mkdir()  # (a process that went away: no cmdline)
    return proc


def test_the_sentry_and_gofer_of_that_container_only(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        {
            "10": ["runsc-sandbox", "--root=/var/run/docker/runtime-runc/moby", LOG.format(ID), "boot"],
            "11": ["runsc-gofer", LOG.format(ID), "gofer"],
            "12": ["runsc-sandbox", LOG.format(OTHER), "boot"],  # another sandbox
            "13": ["/usr/bin/containerd-shim-runc-v2", "-namespace", "moby", "-id", ID],  # its shim: not killed
            "14": ["runsc", "kill", ID, "9"],  # the waiting runsc kill: it ends on its own
            "15": ["sh", "-c", f"echo runsc-sandbox {ID}"],  # a command naming both
        },
    )
    assert sorted(stuck.runtime_pids(ID, proc)) == [10, 11]
    assert stuck.runtime_pids("f" * 64, proc) == []


def test_kill_signals_what_it_finds_and_skips_what_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = fake_proc(tmp_path, {"10": ["runsc-sandbox", LOG.format(ID)], "11": ["runsc-gofer", LOG.format(ID)]})
    sent: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        if pid == 11:
            raise ProcessLookupError(pid)
        sent.append((pid, sig))

    monkeypatch.setattr(os, "kill", kill)
    assert stuck.kill_runtime(ID, proc) == [10]
    assert sent == [(10, 9)]
