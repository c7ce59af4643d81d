"""sandbox.docker.freezer: a container's freezer found from /proc/<pid>/cgroup (cgroup v1
and v2), and the thaw of a gVisor sandbox's runtime before its removal (a fake /proc and
cgroup tree)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.docker import freezer
from tests.unit.test_stuck_runtime import ID, LOG, OTHER, fake_proc

V1 = f"""12:pids:/docker/{ID}
6:freezer:/docker/{ID}
4:cpu,cpuacct:/docker/{ID}
0::/system.slice/containerd.service
"""
V2 = f"0::/system.slice/docker-{ID}.scope\n"


def test_the_freezer_file_of_each_cgroup_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(freezer, "CGROUP_ROOT", tmp_path)
    assert freezer.file_of(V1) == tmp_path / "freezer" / "docker" / ID / "freezer.state"
    assert freezer.file_of(V2) == tmp_path / "system.slice" / f"docker-{ID}.scope" / "cgroup.freeze"
    assert freezer.file_of("0::/\n") is None  # the root cgroup: never frozen for one sandbox
    assert freezer.file_of("garbage\n") is None
    assert freezer.of_pid(0) is None and freezer.of_pid("12") is None


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_freeze_thaw_and_the_state_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.setattr(freezer, "CGROUP_ROOT", tmp_path)
    path = freezer.file_of(V1 if version == "v1" else V2)
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_text("THAWED\n" if version == "v1" else "0\n")
    assert not freezer.frozen(path)
    freezer.freeze(path)
    assert path.read_text() == ("FROZEN" if version == "v1" else "1")
    assert freezer.frozen(path)
    freezer.thaw(path)
    assert not freezer.frozen(path)
    if version == "v1":
        path.write_text("FREEZING\n")  # (the kernel on its way: it counts as frozen)
        assert freezer.frozen(path)
    assert not freezer.frozen(tmp_path / "gone" / path.name)


def test_thaw_runtime_thaws_only_that_containers_frozen_cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cgroup"
    monkeypatch.setattr(freezer, "CGROUP_ROOT", root)
    proc = fake_proc(
        tmp_path,
        {
            "10": ["runsc-sandbox", LOG.format(ID)],
            "11": ["runsc-gofer", LOG.format(ID)],
            "12": ["runsc-sandbox", LOG.format(OTHER)],
        },
    )
    for pid, cid in (("10", ID), ("11", ID), ("12", OTHER)):
        (proc / pid / "cgroup").write_text(f"6:freezer:/docker/{cid}\n")
    mine = root / "freezer" / "docker" / ID / "freezer.state"
    other = root / "freezer" / "docker" / OTHER / "freezer.state"
    for path in (mine, other):
        path.parent.mkdir(parents=True)
        path.write_text("FROZEN\n")
    assert freezer.thaw_runtime(ID, proc) == [mine]  # (the Sentry and the gofer share one cgroup)
    assert mine.read_text() == "THAWED" and other.read_text() == "FROZEN\n"
    assert freezer.thaw_runtime(ID, proc) == []  # thawed already: nothing written
    assert freezer.thaw_runtime("f" * 64, proc) == []  # a runc container: no runtime process


def test_the_metrics_count_the_frozen_warm_sandboxes() -> None:
    """``/metrics``: the warm pool's ready, starting and (of the ready ones) frozen
    sandboxes, and its claims by result, from the pool's status."""
    from worker.metrics import Metrics

    status = {"ready": 3, "starting": 1, "frozen": 2, "claims": 5, "misses": 1, "declined": 4}
    text = Metrics(pool=lambda: status).render().decode()
    for want in (
        'loom_warm_sandboxes{state="ready"} 3.0',
        'loom_warm_sandboxes{state="starting"} 1.0',
        'loom_warm_sandboxes{state="frozen"} 2.0',
        'loom_warm_pool_claims_total{result="hit"} 5.0',
        'loom_warm_pool_claims_total{result="declined"} 4.0',
    ):
        assert want in text, text
    assert "loom_warm_sandboxes" not in Metrics().render().decode()  # no pool: no family
