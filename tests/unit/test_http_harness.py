"""The harness API over HTTP (issue 26), in process on the local backend with the real
changelog: ``POST .../sandbox/exec``, ``GET``/``PUT .../sandbox/files``; bytes exactly,
recorded or not, the statuses of its errors, its own body limits."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_http import Service, recording_service

EVERY = bytes(range(256)) * 4


@pytest.fixture
async def svc(tmp_path: Path, local_backend: Any) -> AsyncIterator[Service]:
    async with recording_service(tmp_path, local_backend) as s:
        yield s


async def test_exec_argv_or_shell_with_stdin_env_and_cwd(svc: Service, tmp_path: Path) -> None:
    ws = await svc.workspace()
    url = "/v1/workspaces/w1/sandbox/exec"
    body = {"cmd": ["sh", "-c", "cat > in.bin; echo $X"], "stdin": base64.b64encode(EVERY).decode()}
    r = await svc.client.post(url, json={**body, "stdin_encoding": "base64", "env": {"X": "ok"}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["returncode"], out["stdout"], out["success"], out["outcome"]) == (0, "ok\n", True, "exit")
    assert out["files_changed"] == ["in.bin"] and out["call_id"].startswith("call_")
    assert (ws / "in.bin").read_bytes() == EVERY
    r = await svc.client.post(url, json={"cmd": "cat in.bin", "output_encoding": "base64", "cwd": str(ws)})
    assert r.status_code == 200 and base64.b64decode(r.json()["stdout"]) == EVERY
    r = await svc.client.post(url, json={"cmd": "head -c 5000 /dev/zero", "max_output": 1000})
    out = r.json()
    assert out["truncated"] is True and out["stdout_bytes"] == 5000
    r = await svc.client.post(url, json={"cmd": "rm -rf /"})
    assert r.status_code == 200 and r.json()["outcome"] == "refused" and r.json()["returncode"] == 126
    r = await svc.client.post(url, json={"cmd": ["no-such-program"]})
    assert (r.json()["returncode"], r.json()["launch_error"]) == (127, "not_found")


async def test_exec_errors_are_statuses(svc: Service) -> None:
    await svc.workspace()
    url = "/v1/workspaces/w1/sandbox/exec"
    r = await svc.client.post(url, json={"cmd": "id", "user": "root"})
    assert r.status_code == 403 and r.json()["error"] == "user_unsupported"
    r = await svc.client.post(url, json={"cmd": "true", "timeout": 0})
    assert r.status_code == 422
    r = await svc.client.post(url, json={"cmd": "true", "stdin": "%%", "stdin_encoding": "base64"})
    assert r.status_code == 422 and "base64" in r.json()["detail"]
    r = await svc.client.post(url, json={"cmd": []})
    assert r.status_code == 422
    r = await svc.client.post("/v1/workspaces/nope/sandbox/exec", json={"cmd": "true"})
    assert r.status_code == 404


async def test_files_raw_both_ways_recorded_inside_only(svc: Service, tmp_path: Path) -> None:
    ws = await svc.workspace()
    url = "/v1/workspaces/w1/sandbox/files"
    r = await svc.client.put(url, params={"path": "d/all.bin"}, content=EVERY)
    assert r.status_code == 200, r.text
    assert r.json()["recorded"] is True and r.json()["size"] == len(EVERY) and r.json()["created"] is True
    assert (ws / "d" / "all.bin").read_bytes() == EVERY
    r = await svc.client.get(url, params={"path": "d/all.bin"})
    assert r.status_code == 200 and r.content == EVERY
    assert r.headers["content-type"] == "application/octet-stream"
    outside = tmp_path / "outside" / "x.bin"  # (the local backend's "sandbox" is this host)
    r = await svc.client.put(url, params={"path": str(outside)}, content=b"\x00\xff")
    assert r.status_code == 200 and r.json()["recorded"] is False and outside.read_bytes() == b"\x00\xff"
    log = (await svc.client.get("/v1/workspaces/w1/changelog")).json()
    assert [e["path"] for e in log] == ["d", "d/all.bin"]  # the directory the write made, then the file


async def test_file_errors_are_statuses(svc: Service, tmp_path: Path) -> None:
    ws = await svc.workspace()
    url = "/v1/workspaces/w1/sandbox/files"
    r = await svc.client.get(url, params={"path": "missing.txt"})
    assert r.status_code == 404 and r.json()["error"] == "not_found" and "missing.txt" in r.json()["detail"]
    (ws / "dir").mkdir()
    r = await svc.client.get(url, params={"path": "dir"})
    assert r.status_code == 409 and r.json()["error"] == "is_a_directory"
    r = await svc.client.put(url, params={"path": "dir"}, content=b"x")
    assert r.status_code == 409 and r.json()["error"] == "is_a_directory"
    (ws / "big.txt").write_bytes(b"x" * 100)
    r = await svc.client.get(url, params={"path": "big.txt", "max_bytes": 10})
    assert r.status_code == 413 and "100 bytes" in r.json()["detail"]


async def test_a_file_larger_than_the_services_body_limit(tmp_path: Path, local_backend: Any) -> None:
    from tests.unit.test_http import running
    from worker.registry import ToolRegistry

    async with running(tmp_path / "r", ToolRegistry(backend=local_backend), max_body_bytes=4096) as svc:
        ws = await svc.workspace()
        data = bytes(range(256)) * 64  # 16 KiB: over the 4 KiB of tool calls, under the files route's 1 GiB
        r = await svc.client.put("/v1/workspaces/w1/sandbox/files", params={"path": "f.bin"}, content=data)
        assert r.status_code == 200, r.text
        assert (ws / "f.bin").read_bytes() == data
        big = {"tool": "write_file", "arguments": {"path": "g", "content": "x" * 8192}}
        r = await svc.client.post("/v1/workspaces/w1/execute", json=big)
        assert r.status_code == 413
