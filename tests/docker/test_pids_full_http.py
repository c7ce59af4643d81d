"""A sandbox at its process limit is the sandbox's limit, never the service's failure: with
every process slot taken by the workspace's own background processes, each route that
needs a new process in the sandbox answers below 500 (a tool's failure, a 409 limit), the
routes that need none still work, and once those processes end everything works again.
(The HTTP fuzzer found a snapshot ``with_scratch`` answering 503 there.)"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.docker.conftest import served

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

TOKEN = "pids-full-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
W = "/v1/workspaces/w"
#: Start sleeps until a fork fails, then say how many and wait.
FILL = """
import subprocess, time
ps = []
while len(ps) < 500:
    try:
        ps.append(subprocess.Popen(["sleep", "600"]))
    except OSError:
        break
open("filled", "w").write(str(len(ps)))
time.sleep(600)
"""


@pytest.fixture
async def api(docker_ready: None, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with served(tmp_path, TOKEN, pids=48) as c:
        yield c


async def _call(api: httpx.AsyncClient, tool: str, arguments: dict[str, object]) -> dict[str, object]:
    r = await api.post(f"{W}/execute", json={"tool": tool, "arguments": arguments})
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_a_sandbox_at_its_process_limit_answers_below_500(api: httpx.AsyncClient) -> None:
    assert (await _call(api, "write_file", {"path": "a.txt", "content": "a\n"}))["success"]
    # Its own processes take every slot: sleeps started until a fork fails.
    filled = await _call(
        api,
        "shell_execute",
        {
            # (python: a shell exits at its first failed fork, leaving a slot free)
            "command": "python3 -c " + shlex.quote(FILL),
            "background": True,
        },
    )
    assert filled["success"], filled
    import asyncio

    for _ in range(600):
        if (await _call(api, "read_file", {"path": "filled"}))["success"]:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the sandbox's process slots were not filled")
    tries = {
        "a command": ("POST", f"{W}/execute", {"tool": "shell_execute", "arguments": {"command": "echo hi"}}),
        "a snapshot with its scratch": ("POST", f"{W}/snapshots", {"with_scratch": True}),
        "a terminal": ("POST", f"{W}/terminals", {"cols": 80, "rows": 24}),
        "a code context": ("POST", f"{W}/code/contexts", {}),
        "a harness command": ("POST", f"{W}/sandbox/exec", {"cmd": ["true"]}),
    }
    for what, (method, path, body) in tries.items():
        r = await api.request(method, path, json=body)
        assert r.status_code < 500, (what, r.status_code, r.text)
        if what != "a command" and r.status_code >= 400:  # a refusal that says why
            assert "process limit" in r.text, (what, r.text)
        if what == "a command":  # the model's answer: a failure that says why
            assert not r.json()["success"] and "process limit is reached" in r.json()["output"], r.text
    # What needs no new process still works.
    read = await _call(api, "read_file", {"path": "a.txt"})
    assert read["success"] and "a" in str(read["output"]), read
    assert (await _call(api, "edit_file", {"path": "a.txt", "old_str": "a", "new_str": "b"}))["success"]
    listed = await _call(api, "process_list", {})
    assert listed["success"], listed
    # Its processes ended, it works again.
    for p in (listed.get("data") or {}).get("processes", []):  # type: ignore[union-attr]
        await _call(api, "process_kill", {"process_id": p["process_id"]})
    again = await _call(api, "shell_execute", {"command": "echo back"})
    assert again["success"] and "back" in str(again["output"]), again
    r = await api.post(f"{W}/snapshots", json={"with_scratch": True})
    assert r.status_code == 201, r.text
