"""E2B's control plane on the real engine, through E2B's own SDK (``e2b``): sandboxes
created, listed (metadata and state filters, pages), described, connected to, timed out,
paused and resumed, measured, snapshotted and forked, killed; E2B's conventions
(``/home/user`` is the workspace, env vars, templates); and the refusals, in E2B's shape.

What runs inside a sandbox is driven with loom's own harness API (``POST
/v1/workspaces/{id}/sandbox/exec``): a sandbox is the workspace of the same id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    SandboxException,
    SandboxNotFoundException,
)

from tests.docker.e2b.conftest import E2BServer

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


@pytest.fixture
def api(e2b_server: E2BServer) -> Iterator[httpx.Client]:
    """loom's own API on the same service (the token as a bearer token)."""
    with httpx.Client(
        base_url=e2b_server.url, headers={"Authorization": f"Bearer {e2b_server.token}"}, timeout=120
    ) as client:
        yield client


def run(api: httpx.Client, sandbox_id: str, cmd: str, cwd: str = "/home/user") -> dict[str, Any]:
    """A command in the sandbox, through loom's harness API."""
    r = api.post(f"/v1/workspaces/{sandbox_id}/sandbox/exec", json={"cmd": cmd, "cwd": cwd})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def running(api: httpx.Client, sandbox_id: str) -> bool:
    """Whether the sandbox's container runs (loom's own view; looking starts nothing)."""
    r = api.get(f"/v1/workspaces/{sandbox_id}/sandbox")
    assert r.status_code == 200, r.text
    return bool(r.json()["running"])


def until(check: Callable[[], bool], what: str, deadline: float = 60.0) -> None:
    """Poll ``check`` until it holds (the deadline only ends a test that hangs)."""
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.1)


def gone(sandbox_id: str) -> bool:
    try:
        Sandbox.get_info(sandbox_id)
    except SandboxNotFoundException:
        return True
    return False


def test_create_info_list_and_kill(e2b_server: E2BServer, api: httpx.Client) -> None:
    tag = f"t{time.monotonic_ns()}"
    a = Sandbox.create(metadata={"suite": tag, "role": "a b&c=d"}, envs={"GREETING": "hello"}, timeout=120)
    b = Sandbox.create(metadata={"suite": tag, "role": "b"})
    try:
        info = a.get_info()
        assert (info.sandbox_id, info.template_id, info.state) == (a.sandbox_id, "base", SandboxState.RUNNING)
        assert info.metadata == {"suite": tag, "role": "a b&c=d"}
        assert round((info.end_at - info.started_at).total_seconds()) == 120
        assert info.cpu_count >= 1 and info.memory_mb >= 128
        assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}
        # The sandbox is the workspace of the same id, with E2B's env vars and home.
        settings = api.get(f"/v1/workspaces/{a.sandbox_id}").json()["settings"]
        assert settings["env"] == {"GREETING": "hello"} and settings["home_mount"] == "/home/user"

        # Metadata filter (E2B's SDK quotes keys and values: the special characters pass).
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": tag, "role": "a b&c=d"})).next_items()
        assert [s.sandbox_id for s in listed] == [a.sandbox_id]
        assert listed[0].metadata["role"] == "a b&c=d"
        # Pages of one, newest first, until the X-Next-Token header is gone.
        paginator = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=1)
        pages = []
        while paginator.has_next:
            pages.append([s.sandbox_id for s in paginator.next_items()])
        assert pages == [[b.sandbox_id], [a.sandbox_id]]
        paused = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.PAUSED]))
        assert paused.next_items() == []

        assert a.kill() is True
        assert Sandbox.kill(a.sandbox_id) is False  # (404: already killed)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(a.sandbox_id)
        remaining = Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()
        assert [s.sandbox_id for s in remaining] == [b.sandbox_id]
        assert not running(api, a.sandbox_id)
        # Its files stay with its changelog (loom-worker log, undo); E2B no longer shows it.
        assert e2b_server.workspace(a.sandbox_id).is_dir()
    finally:
        b.kill()


def test_home_user_is_the_workspace(e2b_server_runtime: E2BServer) -> None:
    server = e2b_server_runtime
    sbx = Sandbox.create(envs={"GREETING": "hello"})
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=120) as api:
        try:
            out = run(api, sbx.sandbox_id, 'pwd; echo hi > /home/user/a.txt; echo "$HOME $USER $GREETING"; cd && pwd')
            assert out["stdout"] == "/home/user\n/home/user user hello\n/home/user\n", out
            assert (server.workspace(sbx.sandbox_id) / "a.txt").read_text() == "hi\n"
            # Recorded in the workspace's changelog like any change (so undo reverts it).
            log = api.get(f"/v1/workspaces/{sbx.sandbox_id}/changelog").json()
            assert [e["path"] for e in log] == ["a.txt"]
            assert api.post(f"/v1/workspaces/{sbx.sandbox_id}/undo", json={"all": True}).status_code == 200
            assert not (server.workspace(sbx.sandbox_id) / "a.txt").exists()
            # Paused: the container stops, the files stay; a connect resumes it.
            run(api, sbx.sandbox_id, "echo kept > /home/user/b.txt")
            assert sbx.pause() is True
            assert not running(api, sbx.sandbox_id)
            assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
            assert Sandbox.connect(sbx.sandbox_id).sandbox_id == sbx.sandbox_id
            assert run(api, sbx.sandbox_id, "cat b.txt")["stdout"] == "kept\n"
        finally:
            sbx.kill()


def test_timeouts_kill_and_connect_extends(e2b_server: E2BServer, api: httpx.Client) -> None:
    short = Sandbox.create(timeout=2)
    later = Sandbox.create(timeout=300)
    long = Sandbox.create(timeout=60)
    try:
        run(api, short.sandbox_id, "true")
        until(lambda: gone(short.sandbox_id), "a 2 s sandbox reached its timeout")
        until(lambda: not running(api, short.sandbox_id), "its container was removed")
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(short.sandbox_id)

        # set_timeout is a lifetime from now, shorter or longer.
        later.set_timeout(1)
        until(lambda: gone(later.sandbox_id), "set_timeout(1) ended it")

        # connect only ever extends: a longer timeout moves the end, a shorter one does not.
        before = long.get_info().end_at
        Sandbox.connect(long.sandbox_id, timeout=10)
        assert long.get_info().end_at == before
        Sandbox.connect(long.sandbox_id, timeout=600)
        assert long.get_info().end_at > before
    finally:
        long.kill()


def test_pause_resume_and_async_sdk(e2b_server: E2BServer) -> None:
    async def main(api: httpx.AsyncClient) -> None:
        async def run_async(sandbox_id: str, cmd: str) -> str:
            r = await api.post(f"/v1/workspaces/{sandbox_id}/sandbox/exec", json={"cmd": cmd, "cwd": "/home/user"})
            assert r.status_code == 200, r.text
            return str(r.json()["stdout"])

        sbx = await AsyncSandbox.create(metadata={"async": "yes"})
        try:
            await run_async(sbx.sandbox_id, "echo 1 > state.txt")
            assert await sbx.pause(mode="full") is True  # (asked with memory: loom keeps the files only)
            assert await sbx.pause() is False  # (409: paused already)
            info = await AsyncSandbox.get_info(sbx.sandbox_id)
            assert info.state == SandboxState.PAUSED
            listed = await AsyncSandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
            assert sbx.sandbox_id in [s.sandbox_id for s in listed]
            r = await api.get(f"/sandboxes/{sbx.sandbox_id}", headers={"X-API-KEY": e2b_server.token})
            assert r.json()["pauseMode"] == "filesystem"  # files kept, processes not
            resumed = await AsyncSandbox.connect(sbx.sandbox_id, timeout=60)
            assert resumed.sandbox_id == sbx.sandbox_id
            assert (await AsyncSandbox.get_info(sbx.sandbox_id)).state == SandboxState.RUNNING
            assert await run_async(sbx.sandbox_id, "cat state.txt") == "1\n"
        finally:
            await sbx.kill()

    async def with_client() -> None:
        headers = {"Authorization": f"Bearer {e2b_server.token}"}
        async with httpx.AsyncClient(base_url=e2b_server.url, headers=headers, timeout=120) as api:
            await main(api)

    asyncio.run(with_client())


def test_metrics(e2b_server: E2BServer, api: httpx.Client) -> None:
    sbx = Sandbox.create()
    try:
        run(api, sbx.sandbox_id, "head -c 100000 /dev/urandom > blob")
        metrics = sbx.get_metrics()
        assert len(metrics) == 1
        m = metrics[0]
        assert m.cpu_count >= 1 and 0 <= m.cpu_used_pct <= 100
        assert 0 < m.mem_used <= m.mem_total
        assert 100_000 <= m.disk_used < m.disk_total
        r = api.get("/sandboxes/metrics", params={"sandbox_ids": f"{sbx.sandbox_id},nosuch"})
        assert r.status_code == 200 and list(r.json()["sandboxes"]) == [sbx.sandbox_id]
        sbx.pause()
        assert sbx.get_metrics() == []  # (nothing runs: nothing measured)
    finally:
        sbx.kill()


def test_snapshots_and_forks(e2b_server_runtime: E2BServer) -> None:
    e2b_server = e2b_server_runtime
    sbx = Sandbox.create(metadata={"origin": "yes"})
    made: list[Sandbox] = []
    api = httpx.Client(base_url=e2b_server.url, headers={"Authorization": f"Bearer {e2b_server.token}"}, timeout=120)
    try:
        run(api, sbx.sandbox_id, "mkdir -p app && echo v1 > app/data.txt")
        snap = sbx.create_snapshot(name="e2b-snap")
        assert snap.snapshot_id and snap.names == ["e2b-snap"]
        mine = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()
        assert [s.snapshot_id for s in mine] == [snap.snapshot_id]
        assert [s.snapshot_id for s in Sandbox.list_snapshots(name="e2b-snap").next_items()] == [snap.snapshot_id]

        # A sandbox from the snapshot (by id, then by name): its own copy of the files.
        for template in (snap.snapshot_id, "e2b-snap"):
            copy = Sandbox.create(template)
            made.append(copy)
            assert copy.get_info().template_id == template
            assert run(api, copy.sandbox_id, "cat app/data.txt")["stdout"] == "v1\n"
        # A snapshot of a sandbox made from one (an overlay fork on an ext4 host, whose own
        # path is the engine's mountpoint): listed under that sandbox, and a template.
        child = made[0].create_snapshot(name="e2b-child")
        listed = Sandbox.list_snapshots(sandbox_id=made[0].sandbox_id).next_items()
        assert [s.snapshot_id for s in listed] == [child.snapshot_id]
        grand = Sandbox.create("e2b-child")
        made.append(grand)
        assert run(api, grand.sandbox_id, "cat app/data.txt")["stdout"] == "v1\n"
        assert Sandbox.delete_snapshot(child.snapshot_id) is True

        run(api, sbx.sandbox_id, "echo v2 > app/data.txt")
        forks = sbx.fork(count=2, timeout=60)
        assert all(isinstance(f, Sandbox) for f in forks) and len(forks) == 2
        made.extend(f for f in forks if isinstance(f, Sandbox))
        first, second = made[-2:]
        assert first.get_info().metadata == {"origin": "yes"}
        assert run(api, first.sandbox_id, "cat app/data.txt; echo fork > app/data.txt")["stdout"] == "v2\n"
        # Each fork's files are its own. (A fork's, through its sandbox: an overlay fork's
        # tree is the engine's volume, mounted on the host while a sandbox of it runs, and
        # one whose first start is retried is unmounted in between.)
        assert (e2b_server.workspace(sbx.sandbox_id) / "app/data.txt").read_text() == "v2\n"
        assert run(api, second.sandbox_id, "cat app/data.txt")["stdout"] == "v2\n"
        assert run(api, first.sandbox_id, "cat app/data.txt")["stdout"] == "fork\n"

        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
        assert Sandbox.delete_snapshot(snap.snapshot_id) is False
        sbx.kill()
        with pytest.raises(SandboxNotFoundException):
            sbx.fork()
    finally:
        for s in [sbx, *made]:
            s.kill()
        api.close()


def test_refusals(e2b_server: E2BServer, api: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SandboxException) as e:
        Sandbox.create("no-such-template")
    assert e.value.status_code == 404 and "LOOM_E2B_TEMPLATES" in str(e.value)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info("inosuchsandbox")
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("inosuchsandbox")
    with pytest.raises(NotFoundException):
        Sandbox.set_timeout("inosuchsandbox", 10)
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-the-token")
    with pytest.raises(SandboxException) as e:
        Sandbox.create(network={"egress_proxy": {"address": "proxy.example.com:1080"}})
    assert e.value.status_code == 501 and "network.egressProxy" in str(e.value)

    key = {"X-API-KEY": e2b_server.token}
    for method, path, body in [
        ("GET", "/templates", None),
        ("POST", "/v3/templates", {}),
        ("GET", "/volumes", None),
        ("GET", "/secrets/x", None),
        ("GET", "/sandboxes/inosuch/logs", None),
        ("POST", "/v2/sandboxes", {"templateID": "base", "mcp": {"exa": {}}}),
        ("POST", "/v2/sandboxes", {"templateID": "base", "network": {"allowOut": ["10.0.0.0/8"]}}),
    ]:
        r = api.request(method, path, json=body, headers=key)
        assert r.status_code == 501, (path, r.text)
        assert r.json()["code"] == 501 and "not offered by loom-worker" in r.json()["message"], r.text
    for method, path, status in [
        ("GET", "/sandboxes/inosuch/no/such/route", 404),
        ("GET", "/snapshots/x", 404),
        ("PATCH", "/sandboxes/inosuch", 405),
    ]:
        r = api.request(method, path, headers=key)
        assert (r.status_code, r.json()["code"]) == (status, status), r.text
        assert set(r.json()) == {"code", "message"}
    r = api.post("/v2/sandboxes", json={"templateID": "base", "timeout": 10**7}, headers=key)
    assert r.status_code == 400 and "LOOM_E2B_MAX_TIMEOUT" in r.json()["message"]
    r = api.post("/v2/sandboxes", json={"templateID": "base", "envVars": {"HOME": "/x"}}, headers=key)
    assert r.status_code == 400 and r.json()["message"].startswith("env")


class TestLimits:
    @pytest.fixture
    def e2b_settings(self) -> dict[str, object]:
        return {"e2b_max_sandboxes": 2, "egress_allow": "pypi"}

    def test_sandboxes_at_once_and_network(self, e2b_server: E2BServer, api: httpx.Client) -> None:
        a = Sandbox.create(allow_internet_access=False)
        b = Sandbox.create(network={"allow_out": ["example.com", "1.2.3.4/32"], "deny_out": ["0.0.0.0/0"]})
        try:
            with pytest.raises(SandboxException) as e:
                Sandbox.create()
            assert e.value.status_code == 429 and "LOOM_E2B_MAX_SANDBOXES" in str(e.value)
            # final: E2B's SDKs retry a 429 that does not say otherwise
            r = api.post("/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": e2b_server.token})
            assert (r.status_code, r.headers.get("should-retry")) == (429, "false"), r.text

            def egress(s: Sandbox) -> list[str]:
                return list(api.get(f"/v1/workspaces/{s.sandbox_id}").json()["effective"]["egress"])

            # No egress at all; only the hosts asked for; the operator's default allowlist.
            assert (egress(a), egress(b)) == ([], ["example.com", "1.2.3.4"])
            a.pause()  # (paused ones do not count)
            c = Sandbox.create(allow_internet_access=True)
            assert egress(c) == ["pypi"]
            c.kill()
        finally:
            a.kill()
            b.kill()


class TestWarm:
    @pytest.fixture
    def e2b_settings(self) -> dict[str, object]:
        return {"e2b_warm_sandboxes": 1}

    def test_a_plain_create_takes_a_sandbox_made_ahead(self, e2b_server: E2BServer, api: httpx.Client) -> None:
        first = Sandbox.create(envs={"A": "1"})  # (not the plain kind: made for it; the pool fills after)

        def warm() -> set[str]:
            ids = {w["id"] for w in api.get("/v1/workspaces").json()} - {first.sandbox_id}
            return {i for i in ids if running(api, i)}

        until(lambda: len(warm()) == 1, "a sandbox made ahead, its container running")
        ahead = warm()
        assert Sandbox.list().next_items()[0].sandbox_id == first.sandbox_id  # (E2B does not show it)
        second = Sandbox.create(metadata={"k": "v"}, timeout=30)
        try:
            assert {second.sandbox_id} == ahead
            info = second.get_info()
            assert (info.metadata, round((info.end_at - info.started_at).total_seconds())) == ({"k": "v"}, 30)
            assert run(api, second.sandbox_id, "pwd")["stdout"] == "/home/user\n"
            until(lambda: len(warm() - {second.sandbox_id}) == 1, "the pool filled again")
        finally:
            first.kill()
            second.kill()
