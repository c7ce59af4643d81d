"""The routes the dashboard added to the public API, in process on LocalProcessBackend:
the call history (pages and the live SSE stream, also of calls made by another process),
the diff of one entry or call, and the sandbox state."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from sandbox.local import LocalProcessBackend
from tests.servers import free_port
from tests.unit.test_http import AUTH, TOKEN, Service, running
from worker.calls import CallJournal
from worker.http import create_app
from worker.http.changelog import ChangelogPool
from worker.registry import ToolRegistry
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def journal_service(tmp_path: Path, backend: Any, *, journal: bool = True) -> AsyncIterator[Service]:
    pool = ChangelogPool(tmp_path / "data")
    reg = ToolRegistry(backend=backend, recorder_factory=pool.recorder)
    if journal:
        reg.journal = CallJournal(tmp_path / "data")
    try:
        async with running(tmp_path / "root", reg) as s:
            yield s
    finally:
        await pool.aclose()


@pytest.fixture
async def svc(tmp_path: Path, local_backend: Any) -> AsyncIterator[Service]:
    async with journal_service(tmp_path, local_backend) as s:
        await s.workspace("w1")
        yield s


# -- GET .../calls --------------------------------------------------------------------------


async def test_calls_are_paged_newest_first(svc: Service) -> None:
    for i in range(7):
        await svc.execute("w1", "write_file", path=f"f{i}.txt", content="secret content")
    r = await svc.client.get("/v1/workspaces/w1/calls", params={"limit": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["args"]["path"] for c in body["calls"]] == ["f6.txt", "f5.txt", "f4.txt"]
    seen = body["calls"]
    while body["next"] is not None:
        body = (await svc.client.get("/v1/workspaces/w1/calls", params={"limit": 3, "before": body["next"]})).json()
        seen += body["calls"]
    assert [c["args"]["path"] for c in seen] == [f"f{i}.txt" for i in range(6, -1, -1)]
    assert all(c["args"]["content"] == "[14 chars]" for c in seen)
    assert "secret content" not in r.text
    first = seen[0]
    assert first["tool"] == "write_file" and first["success"] and first["files_changed"] == ["f6.txt"]
    assert first["call_id"].startswith("call_") and isinstance(first["cursor"], int)


async def test_calls_errors(svc: Service, tmp_path: Path, local_backend: Any) -> None:
    assert (await svc.client.get("/v1/workspaces/nope/calls")).status_code == 404
    for bad in ({"limit": 0}, {"limit": 501}, {"before": -1}, {"before": "x"}):
        r = await svc.client.get("/v1/workspaces/w1/calls", params=bad)
        assert r.status_code == 422, bad
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=svc.app), base_url="http://127.0.0.1") as c:
        assert (await c.get("/v1/workspaces/w1/calls")).status_code == 401
        assert (await c.get("/v1/workspaces/w1/calls/stream")).status_code == 401
    async with journal_service(tmp_path / "other", local_backend, journal=False) as s:
        await s.workspace("w1")
        r = await s.client.get("/v1/workspaces/w1/calls")
        assert r.status_code == 409 and "no call history" in r.json()["detail"]


async def test_an_empty_history(svc: Service) -> None:
    r = await svc.client.get("/v1/workspaces/w1/calls")
    assert r.json() == {"calls": [], "next": None}


# -- GET .../changelog/diff ---------------------------------------------------------------


async def test_the_diff_of_one_call_and_one_entry(svc: Service) -> None:
    ws = svc.root / "w1"
    (ws / "a.py").write_text("x = 1\n")
    r = await svc.client.post(
        "/v1/workspaces/w1/execute",
        json={
            "tool": "edit_file",
            "arguments": {"path": "a.py", "old_str": "x = 1", "new_str": "x = 2"},
            "call_id": "E1",
        },
    )
    assert r.json()["success"], r.text
    await svc.client.post(
        "/v1/workspaces/w1/execute",
        json={
            "tool": "shell_execute",
            "arguments": {"command": "echo y >> a.py; printf '\\000\\001' > b.bin; mv a.py c.py"},
            "call_id": "S1",
        },
    )
    one = (await svc.client.get("/v1/workspaces/w1/changelog/diff", params={"call_id": "E1"})).json()["diff"]
    assert "-x = 1\n+x = 2\n" in one and "a/a.py" in one
    shell = (await svc.client.get("/v1/workspaces/w1/changelog/diff", params={"call_id": "S1"})).json()["diff"]
    assert "Binary files /dev/null and b/b.bin differ" in shell
    assert "c.py" in shell
    # What E1 did stays what it did, whatever came later.
    again = (await svc.client.get("/v1/workspaces/w1/changelog/diff", params={"call_id": "E1"})).json()["diff"]
    assert again == one
    entries = (await svc.client.get("/v1/workspaces/w1/changelog", params={"call_id": "E1"})).json()
    by_entry = await svc.client.get("/v1/workspaces/w1/changelog/diff", params={"entry": entries[0]["id"]})
    assert by_entry.json()["diff"] == one


async def test_the_diff_route_refuses_a_bad_selection(svc: Service) -> None:
    url = "/v1/workspaces/w1/changelog/diff"
    for params in ({}, {"entry": 1, "call_id": "x"}, {"entry": 0}):
        r = await svc.client.get(url, params=params)
        assert r.status_code == 422, params
    assert (await svc.client.get(url, params={"call_id": "never"})).status_code == 404
    assert (await svc.client.get(url, params={"entry": 99})).status_code == 404


async def test_names_in_diffs_and_conflicts_are_quoted(svc: Service) -> None:
    name = "evil\n<script>alert(1)<!--.txt"
    await svc.client.post(
        "/v1/workspaces/w1/execute",
        json={"tool": "shell_execute", "arguments": {"command": f"printf x > '{name}'"}, "call_id": "N1"},
    )
    d = (await svc.client.get("/v1/workspaces/w1/changelog/diff", params={"call_id": "N1"})).json()["diff"]
    assert '"b/evil\\n<script>alert(1)<!--.txt"' in d and "\nline" not in d
    (svc.root / "w1" / name).write_text("changed on the host")
    r = await svc.client.post("/v1/workspaces/w1/undo", json={"call_id": "N1", "dry_run": True})
    assert r.status_code == 409
    (conflict,) = r.json()["conflicts"]
    assert conflict.startswith('"evil\\n<script>alert(1)<!--.txt": entry ')


# -- GET .../sandbox ----------------------------------------------------------------------


async def test_sandbox_state_without_a_docker_backend(svc: Service) -> None:
    r = await svc.client.get("/v1/workspaces/w1/sandbox")
    assert r.status_code == 200
    assert r.json()["backend"] is None and r.json()["running"] is False
    assert (await svc.client.get("/v1/workspaces/nope/sandbox")).status_code == 404


# -- the live stream (a real server: a stream needs a real connection) --------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The service on a free port (its own thread and loop), on LocalProcessBackend."""

    @asynccontextmanager
    async def factory(settings: Settings) -> AsyncIterator[Any]:
        backend = LocalProcessBackend()
        pool = ChangelogPool(settings.data_dir)
        reg = ToolRegistry(backend=backend, recorder_factory=pool.recorder)
        reg.journal = CallJournal(settings.data_dir)
        try:
            yield reg
        finally:
            await pool.aclose()
            await backend.aclose()

    settings = Settings(workspace_root=tmp_path / "root", data_dir=tmp_path / "data", api_token=TOKEN)
    port = free_port()
    app = create_app(settings, registry_factory=factory)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, timeout_graceful_shutdown=1))
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", tmp_path
    finally:
        srv.should_exit = True
        thread.join(30)


class Events:
    """The events of an open SSE response, read as they come: [{event, id, data}]."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()

    async def next(self, n: int, timeout: float = 20) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        cur: dict[str, Any] = {}
        async with asyncio.timeout(timeout):
            while len(out) < n:
                line = await anext(self.lines)
                if line == "":
                    if "data" in cur:
                        out.append(cur)
                    cur = {}
                elif not line.startswith(":"):
                    field, _, value = line.partition(": ")
                    cur[field] = json.loads(value) if field == "data" else value
        return out


OTHER_PROCESS = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from sandbox.local import LocalProcessBackend
    from worker.calls import CallJournal
    from worker.registry import ToolRegistry

    async def main():
        backend = LocalProcessBackend()
        reg = ToolRegistry(backend=backend)
        reg.journal = CallJournal(Path(sys.argv[1]))
        r = await reg.execute("write_file", {"path": "from-cli.txt", "content": "hi"}, sys.argv[2], call_id="other")
        assert r.success, r.error
        await backend.aclose()

    asyncio.run(main())
    """
)


async def test_the_stream_sends_new_calls_also_from_another_process_and_resumes(
    server: tuple[str, Path],
) -> None:
    base, tmp = server
    async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=30) as c:
        ws = Path((await c.post("/v1/workspaces", json={"name": "w1"})).json()["path"])
        await c.post("/v1/workspaces/w1/execute", json={"tool": "list_directory", "arguments": {}, "call_id": "old"})
        async with c.stream("GET", "/v1/workspaces/w1/calls/stream") as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = Events(r)
            await c.post(
                "/v1/workspaces/w1/execute",
                json={"tool": "write_file", "arguments": {"path": "a.txt", "content": "1"}, "call_id": "here"},
            )
            (ev,) = await events.next(1)  # the older call is not sent: the stream starts now
            assert ev["event"] == "call" and ev["data"]["call_id"] == "here" and ev["id"] == str(ev["data"]["cursor"])
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", OTHER_PROCESS, str(tmp / "data"), str(ws), env=env
            )
            assert await proc.wait() == 0
            (ev2,) = await events.next(1)
            assert ev2["data"]["call_id"] == "other" and ev2["data"]["pid"] == proc.pid
            assert ev2["data"]["files_changed"] == ["from-cli.txt"]
        # A client that reconnects gets what it missed, from Last-Event-ID or ?after=.
        for i in range(3):
            await c.post(
                "/v1/workspaces/w1/execute", json={"tool": "list_directory", "arguments": {}, "call_id": f"m{i}"}
            )
        async with c.stream("GET", "/v1/workspaces/w1/calls/stream", headers={"Last-Event-ID": ev2["id"]}) as r:
            assert [e["data"]["call_id"] for e in await Events(r).next(3)] == ["m0", "m1", "m2"]
        async with c.stream("GET", "/v1/workspaces/w1/calls/stream", params={"after": -1}) as r:
            got = [e["data"]["call_id"] for e in await Events(r).next(6)]
            assert got == ["old", "here", "other", "m0", "m1", "m2"]


async def test_a_new_call_reaches_an_open_stream_quickly(server: tuple[str, Path]) -> None:
    """In-process calls wake the stream at once (no waiting for the next poll); the
    bound is loose on purpose, the timing itself is bench_dashboard's."""
    base, _tmp = server
    async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=30) as c:
        await c.post("/v1/workspaces", json={"name": "w1"})
        async with c.stream("GET", "/v1/workspaces/w1/calls/stream") as r:
            events = Events(r)
            for i in range(5):
                await c.post(
                    "/v1/workspaces/w1/execute", json={"tool": "list_directory", "arguments": {}, "call_id": f"q{i}"}
                )
                (ev,) = await events.next(1, timeout=10)
                assert ev["data"]["call_id"] == f"q{i}"
