"""The record an agent run writes before it changes its workspace's configuration."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from worker.agents import pending


def test_claim_is_exclusive_private_and_released(tmp_path: Path) -> None:
    ws = tmp_path / "ws-data"
    assert pending.claim(ws, {"run_id": "r1", "secret_name": "K"}) is None
    assert stat.S_IMODE(os.stat(pending.path(ws)).st_mode) == 0o600
    found = pending.claim(ws, {"run_id": "r2"})
    assert found is not None and found["run_id"] == "r1"
    assert pending.owner_alive(found)  # this process wrote it
    pending.release(ws)
    pending.release(ws)  # (twice is fine)
    assert pending.load(ws) is None


def test_an_owner_that_is_gone_or_a_reused_pid_is_not_alive(tmp_path: Path) -> None:
    pending.claim(tmp_path, {"run_id": "r"})
    record = pending.load(tmp_path)
    assert record is not None
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not pending.owner_alive({**record, "owner": {**record["owner"], "pid": gone.pid}})
    # the pid of a live process started at another time (a reused pid)
    assert not pending.owner_alive({**record, "owner": {**record["owner"], "pid": 1}})
    assert not pending.owner_alive({**record, "owner": {**record["owner"], "boot": "another-boot"}})
    assert not pending.owner_alive({"run_id": "r"}) and not pending.owner_alive({"owner": "x"})


def test_a_torn_record_reads_as_empty(tmp_path: Path) -> None:
    pending.path(tmp_path).write_text('{"run_id": "r", "own')
    assert pending.load(tmp_path) == {}
    pending.path(tmp_path).write_text(json.dumps([1]))
    assert pending.load(tmp_path) == {}
