"""The code routes on the real engine (runc; the kernels under gVisor: test_code.py): the
service (uvicorn on a free port, a token) creates, lists, restarts and deletes contexts,
and streams an execution as NDJSON: the output line before the code finished, the result
with a PNG, the execution last; what refuses a request is a status."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import sandboxes_under
from tests.docker.conftest import served

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

TOKEN = "code-docker-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "/v1/workspaces/w/code"


@pytest.fixture
async def api(docker_ready: None, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with served(tmp_path, TOKEN) as c:
        yield c


async def test_contexts_and_a_streamed_execution(api: httpx.AsyncClient, tmp_path: Path) -> None:
    workspace = tmp_path / "root" / "w"
    assert (await api.get(f"{BASE}/contexts")).json() == {"contexts": []}  # (no sandbox started for a look)
    for method, url in (("DELETE", f"{BASE}/contexts/ctx-x"), ("POST", f"{BASE}/contexts/ctx-x/restart")):
        r = await api.request(method, url)  # none, the sandbox not running: nor started to say so
        assert r.status_code == 404 and "not running" in r.json()["detail"], r.text
    assert sandboxes_under(tmp_path / "root") == []
    r = await api.post(f"{BASE}/contexts", json={"language": "python"})
    assert r.status_code == 201, r.text
    ctx = r.json()
    assert ctx["id"].startswith("ctx-") and ctx["cwd"] == "/workspace" and ctx["running"]
    body = {
        # it waits for a file the test writes once it has read the first line: that line
        # came while the code ran
        "code": "import os, time\nprint('first', flush=True)\n"
        "for _ in range(600):\n    if os.path.exists('go'):\n        break\n    time.sleep(0.1)\n"
        "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n6 * 7",
        "context": ctx["id"],
        "call_id": "http-1",
    }
    lines: list[dict] = []
    async with api.stream("POST", f"{BASE}/execute", json=body) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/x-ndjson")
        async for line in resp.aiter_lines():
            if line:
                lines.append(json.loads(line))
                if len(lines) == 1:
                    assert lines[0] == {"type": "stdout", "text": "first\n", "timestamp": lines[0]["timestamp"]}
                    (workspace / "go").write_text("")
    kinds = [line["type"] for line in lines]
    assert kinds == ["stdout", "result", "result", "execution"], kinds
    assert lines[1]["png"] and not lines[1]["is_main_result"]
    assert lines[2] == {"type": "result", "text": "42", "is_main_result": True}
    ex = lines[-1]
    assert ex["outcome"] == "ok" and ex["call_id"] == "http-1" and ex["context_id"] == ctx["id"], ex
    assert ex["files_changed"] == ["go"]
    assert ex["results"][1]["text"] == "42" and ex["logs"] == {"stdout": ["first\n"], "stderr": []}

    listed = (await api.get(f"{BASE}/contexts")).json()["contexts"]
    assert [c["id"] for c in listed] == [ctx["id"]]
    r = await api.post(f"{BASE}/contexts/{ctx['id']}/restart")
    assert r.status_code == 200 and r.json()["id"] == ctx["id"], r.text
    r = await api.post(f"{BASE}/execute", json={"code": "plt", "context": ctx["id"]})
    last = json.loads(r.text.splitlines()[-1])
    assert last["outcome"] == "error" and last["error"]["name"] == "NameError", last
    assert (await api.delete(f"{BASE}/contexts/{ctx['id']}")).status_code == 204

    # the default context, made at its first use
    r = await api.post(f"{BASE}/execute", json={"code": "1 + 1"})
    assert json.loads(r.text.splitlines()[-1])["context_id"] == "ctx-python"
    # an unknown process, followed or not, is a 404 (not a 200 whose stream errs)
    for follow in ("false", "true"):
        r = await api.get("/v1/workspaces/w/processes/proc-nope/output", params={"follow": follow})
        assert r.status_code == 404, (follow, r.status_code, r.text)
    # refusals before anything runs
    r = await api.post(f"{BASE}/execute", json={"code": "1", "context": "ctx-gone"})
    assert r.status_code == 404 and "No code context ctx-gone" in r.json()["detail"], r.text
    r = await api.post(f"{BASE}/execute", json={"code": "1", "language": "cobol"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "language"], r.text
    r = await api.post(f"{BASE}/execute", json={"code": "1", "timeout": 0})
    assert r.status_code == 422, r.text
    r = await api.delete(f"{BASE}/contexts/ctx-gone")
    assert r.status_code == 404, r.text


async def test_an_execution_whose_client_left_keeps_its_slot_and_is_journaled(
    docker_ready: None, tmp_path: Path
) -> None:
    """A client that leaves mid-execution does not stop it: the execution keeps its slot
    until it ends (a service of one slot answers 429 meanwhile) and its call is in the
    journal when it ends, with nobody reading."""
    async with served(tmp_path, TOKEN, max_concurrent_calls=1) as api:
        workspace = tmp_path / "root" / "w"
        body = {
            "code": "import os, time\nprint('first', flush=True)\n"
            "for _ in range(600):\n    if os.path.exists('go'):\n        break\n    time.sleep(0.1)\n"
            "open('done', 'w').close()\n'ok'",
            "call_id": "left-1",
        }
        async with api.stream("POST", f"{BASE}/execute", json=body) as resp:
            assert resp.status_code == 200, await resp.aread()
            async for line in resp.aiter_lines():
                if line:
                    assert json.loads(line)["type"] == "stdout"
                    break  # the client leaves while the code waits
        r = await api.post(f"{BASE}/execute", json={"code": "1"})
        assert r.status_code == 429, r.text  # the slot is still the running execution's
        (workspace / "go").write_text("")
        for _ in range(600):
            r = await api.post(f"{BASE}/execute", json={"code": "1"})
            if r.status_code != 429:
                break
            await asyncio.sleep(0.1)
        assert r.status_code == 200 and json.loads(r.text.splitlines()[-1])["outcome"] == "ok", r.text
        assert (workspace / "done").exists()  # it ran to its end
        calls = (await api.get("/v1/workspaces/w/calls")).json()["calls"]
        left = [c for c in calls if c.get("call_id") == "left-1"]
        assert len(left) == 1, calls


async def test_an_execution_refused_for_want_of_room_is_a_507_before_the_stream(
    docker_ready: None, tmp_path: Path
) -> None:
    """The changelog's reserve refuses an execution before it runs: a 507 status naming
    the setting, as every refusal before the stream is (not a 200 whose first line says
    it), and nothing ran."""
    async with served(tmp_path, TOKEN, changelog_reserve_bytes=1 << 60) as api:
        r = await api.post(f"{BASE}/execute", json={"code": "open('ran', 'w').close()"})
        assert r.status_code == 507, r.text
        assert "LOOM_CHANGELOG_RESERVE_BYTES" in r.json()["detail"], r.text
        assert not (tmp_path / "root" / "w" / "ran").exists()
