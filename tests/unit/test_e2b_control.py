"""E2B's control plane without Docker: the records (atomic, surviving a restart), the
mapping of E2B's conventions onto loom's (templates, network, env vars, /home/user, the
refusals), lists' filters and pages, and the routes over raw HTTP on a service with the
in-process backend, the older paths (``POST /sandboxes``, ``GET /sandboxes``, connect
and resume under ``/sandboxes``) included."""

from __future__ import annotations

import asyncio
import json
import stat
import urllib.parse
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.datastructures import QueryParams
from starlette.requests import Request
from structlog.testing import capture_logs

from sandbox.docker.config import container_mounts
from sandbox.spec import SandboxSpec
from tests.unit.test_http import running
from worker.http.changelog import ChangelogPool
from worker.integrations.e2b import routes
from worker.integrations.e2b.answers import E2BError, error, translate
from worker.integrations.e2b.conventions import (
    NewSandbox,
    egress_of,
    plan_create,
    template_image,
    unknown_template,
)
from worker.integrations.e2b.listing import page, parse_metadata, parse_query
from worker.integrations.e2b.plane import plane_of
from worker.integrations.e2b.records import RecordStore, SandboxRecord
from worker.integrations.e2b.target import SandboxNotFound, target_of
from worker.registry import ToolRegistry
from worker.service import Busy
from worker.settings import Settings
from worker.snapshots.errors import SnapshotLimitError
from worker.workspace_settings import Caps, Configs, SettingsStore, WorkspaceSettings, parse

# -- the records ------------------------------------------------------------------------------


async def test_records_are_written_whole_and_read_again_after_a_restart(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "e2b")
    await store.load()
    rec = SandboxRecord(id="iabc", template="base", started_at=100.0, end_at=400.0, metadata={"k": "v"})
    await store.put(rec)
    await store.put(rec.model_copy(update={"state": "paused", "paused_at": 200.0}))
    path = tmp_path / "e2b" / "iabc.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["iabc.json"]  # (no temporary left)
    (path.parent / "ibad.json").write_text("{not json")
    (path.parent / "iother.json").write_text(json.dumps(rec.model_dump()))  # (named for another id)

    again = RecordStore(tmp_path / "e2b")
    with capture_logs() as logs:
        await again.load()
    assert [r.id for r in again.all()] == ["iabc"]
    assert again.get("iabc") == rec.model_copy(update={"state": "paused", "paused_at": 200.0})
    assert [e["event"] for e in logs] == ["e2b.record_unreadable"]
    await again.drop("iabc")
    assert not path.exists() and again.get("iabc") is None


def test_a_record_is_alive_until_killed_or_its_time_is_up() -> None:
    rec = SandboxRecord(id="i1", template="base", started_at=0.0, end_at=10.0)
    assert rec.alive(9.9) and not rec.expired(9.9)
    assert rec.expired(10.0) and not rec.alive(10.0)
    paused = rec.model_copy(update={"state": "paused"})
    assert paused.alive(1e9) and not paused.expired(1e9)  # (a paused sandbox does not age)
    for state in ("killed", "warm"):
        assert not rec.model_copy(update={"state": state}).alive(0.0)
    assert SandboxRecord.adopted_view("ws1", "img", 5.0).alive(1e12)  # (no end)


# -- conventions --------------------------------------------------------------------------------


def _settings(**more: Any) -> Settings:
    return Settings(image="loom-sandbox:latest", egress_allow="pypi,github", **more)


def test_templates_are_images() -> None:
    s = _settings(e2b_templates={"py": "python:3.12-slim", "base": "debian:bookworm"})
    assert template_image(s, "code-interpreter-v1") == "loom-sandbox:latest"
    assert template_image(s, "code-interpreter") == "loom-sandbox:latest"
    assert template_image(s, "base") == "debian:bookworm"  # (the setting names it)
    assert template_image(s, "py:latest") == "python:3.12-slim"
    assert template_image(s, "nope") is None
    e = unknown_template(s, "nope")
    assert e.status == 404 and "'nope'" in e.message and "LOOM_E2B_TEMPLATES" in e.message and "py" in e.message


@pytest.mark.parametrize(
    ("allow", "network", "egress"),
    [
        (None, None, None),  # the operator's default, left as it is
        (True, None, None),
        (False, None, []),
        (
            None,
            {"allowOut": ["Example.com", "*.example.org", "1.2.3.4", "5.6.7.8/32"]},
            ["pypi", "github", "example.com", "*.example.org", "1.2.3.4", "5.6.7.8"],
        ),
        (None, {"allowOut": ["0.0.0.0/0"], "denyOut": ["0.0.0.0/0"]}, ["pypi", "github"]),
        (None, {"denyOut": ["0.0.0.0/0"]}, []),
        (None, {"allowOut": ["example.com"], "denyOut": ["0.0.0.0/0"]}, ["example.com"]),
        (False, {"allowOut": ["2001:db8::1"]}, ["[2001:db8::1]"]),
        (None, {"denyOut": ["9.9.9.9", "1.2.3.4"], "allowOut": ["1.2.3.4"]}, ["pypi", "github", "1.2.3.4", "!9.9.9.9"]),
    ],
)
def test_network_maps_onto_the_egress_allowlist(
    allow: bool | None, network: dict[str, Any] | None, egress: list[str] | None
) -> None:
    assert egress_of(_settings(), allow, network) == egress


@pytest.mark.parametrize(
    ("network", "status", "named"),
    [
        ({"allowOut": ["10.0.0.0/8"]}, 501, "network.allowOut '10.0.0.0/8'"),
        ({"denyOut": ["10.0.0.0/8"]}, 501, "network.denyOut"),
        ({"denyOut": ["example.com"]}, 400, "deny rules take addresses"),
        ({"allowOut": ["*"]}, 400, "'*'"),
        ({"allowOut": "example.com"}, 400, "a list of strings"),
        ({"egressProxy": {"address": "p:1080"}}, 501, "network.egressProxy"),
        ({"rules": {"a.com": [{}]}}, 501, "network.rules"),
        ({"dnsServers": ["1.1.1.1"]}, 501, "network.dnsServers"),
        ({"maskRequestHost": "${PORT}-x"}, 501, "network.maskRequestHost"),
        ({"allowPublicTraffic": True}, 501, "network.allowPublicTraffic"),
    ],
)
def test_network_fields_loom_has_not_are_refused_naming_them(network: dict[str, Any], status: int, named: str) -> None:
    with pytest.raises(E2BError) as e:
        egress_of(_settings(), None, network)
    assert e.value.status == status and named in e.value.message


def test_a_create_plans_the_workspace_settings_and_refuses_what_loom_has_not() -> None:
    s = _settings(e2b_max_timeout=600)
    plan = plan_create(s, NewSandbox.model_validate({"templateID": "base", "envVars": {"A": "1"}}))
    assert plan.settings == {"home_mount": "/home/user", "env": {"A": "1"}} and plan.timeout == 300
    assert parse(plan.settings) == WorkspaceSettings(home_mount="/home/user", env={"A": "1"})
    rooted = plan_create(_settings(e2b_allow_root=True), NewSandbox.model_validate({"templateID": "base"}))
    assert rooted.settings == {"home_mount": "/home/user", "allow_root": True}
    paused = plan_create(
        s,
        NewSandbox.model_validate({"templateID": "b", "autoPause": True, "autoResume": {"enabled": True}}),
        default_timeout=15,
    )
    assert (paused.auto_pause, paused.auto_resume, paused.timeout) == (True, True, 15)
    for body, status, named in [
        ({"mcp": {"exa": {}}}, 501, "mcp"),
        ({"iam": {"tokens": {"aws": {}}}}, 501, "iam"),
        ({"volumeMounts": [{"name": "v", "path": "/data"}]}, 501, "volumeMounts"),
        ({"timeout": 601}, 400, "LOOM_E2B_MAX_TIMEOUT"),
    ]:
        with pytest.raises(E2BError) as e:
            plan_create(s, NewSandbox.model_validate({"templateID": "base", **body}))
        assert e.value.status == status and named in e.value.message, body


def test_the_home_mount_is_the_workspace_again_with_its_git_protected(tmp_path: Path) -> None:
    (tmp_path / ".git" / "hooks").mkdir(parents=True)
    (tmp_path / ".git" / "config").write_text("")
    spec = SandboxSpec(home_mount="/home/user")
    assert spec.environment(1000)["HOME"] == "/home/user" and spec.environment(1000)["USER"] == "user"
    mounts = {m["Target"]: (m["Source"], m["ReadOnly"]) for m in container_mounts(tmp_path, spec, None)}
    assert mounts["/home/user"] == (str(tmp_path), False) == mounts["/workspace"]
    assert mounts["/home/user/.git/hooks"] == (str(tmp_path / ".git/hooks"), True)
    assert mounts["/home/user/.git/config"] == (str(tmp_path / ".git/config"), True)
    assert "/home/user" not in {m["Target"] for m in container_mounts(tmp_path, SandboxSpec(), None)}
    for bad in ("/etc", "/home/sandbox", "/home/user/", "/home/a/b", "/home/User", "/home/user\n"):
        with pytest.raises(ValueError):
            SandboxSpec(home_mount=bad)
        with pytest.raises(ValueError):
            WorkspaceSettings(home_mount=bad)


# -- lists ----------------------------------------------------------------------------------------


def test_the_metadata_filter_reads_what_e2b_sdks_send() -> None:
    wanted = {"user": "a b", "q&x": "1=2%", "ü": ""}
    # E2B's SDK: each key and value quoted, the whole url-encoded (and sent as one parameter).
    sent = urllib.parse.urlencode({urllib.parse.quote(k): urllib.parse.quote(v) for k, v in wanted.items()})
    query = QueryParams(urllib.parse.urlencode({"metadata": sent}))
    assert parse_query(query).metadata == wanted
    assert parse_metadata("a=1&b=2") == {"a": "1", "b": "2"}
    with pytest.raises(E2BError):
        parse_metadata("no-equals-sign")


def test_query_parameters_are_checked_naming_them() -> None:
    asked = "state=running,paused&limit=5&order=asc&template=base&startedAfter=2030-01-01T00:00:00Z"
    q = parse_query(QueryParams(asked))
    assert (q.states, q.limit, q.descending, q.template) == (frozenset({"running", "paused"}), 5, False, "base")
    assert q.started_after == 1893456000.0
    assert parse_query(QueryParams("state=running&state=paused")).states == frozenset({"running", "paused"})
    for bad, named in [
        ("state=dead", "state"),
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("order=up", "order"),
        ("startedAfter=yesterday", "startedAfter"),
    ]:
        with pytest.raises(E2BError) as e:
            parse_query(QueryParams(bad))
        assert e.value.status == 400 and e.value.message.startswith(named)
    assert parse_query(QueryParams("metadata=a%3D1"), paged=False).states == frozenset({"running"})


def test_pages_follow_the_cursor_in_either_order() -> None:
    items = [(float(t), f"i{t}") for t in (3, 1, 2, 5, 4)]
    for descending, expected in ((True, ["i5", "i4", "i3", "i2", "i1"]), (False, ["i1", "i2", "i3", "i4", "i5"])):
        seen, token = [], None
        while True:
            shown, token = page(items, lambda i: i, descending=descending, limit=2, token=token)
            seen.extend(i[1] for i in shown)
            if token is None:
                break
        assert seen == expected
    with pytest.raises(E2BError):
        page(items, lambda i: i, descending=True, limit=2, token="garbage!")


# -- the routes, over raw HTTP ------------------------------------------------------------------


@pytest.fixture
async def e2b(tmp_path: Path, local_backend: Any) -> AsyncIterator[Any]:
    data = tmp_path / "data"
    pool = ChangelogPool(data)
    configs = Configs(SettingsStore(data), Settings().sandbox_spec_kwargs(), Caps())
    registry = ToolRegistry(backend=local_backend, configs=configs, recorder_factory=pool.recorder)
    settings = {"data_dir": data, "e2b_warm_sandboxes": 0}
    try:
        async with running(tmp_path / "root", registry, routes=routes(Settings(**settings)), **settings) as svc:
            svc.client.headers["X-API-KEY"] = svc.client.headers.pop("Authorization").split()[1]
            try:
                yield svc
            finally:
                await plane_of(svc.app).aclose()  # (no start left running past the test)
    finally:
        await registry.aclose()
        await pool.aclose()


async def test_the_older_paths_and_the_newer_ones(e2b: Any) -> None:
    c = e2b.client
    r = await c.post("/sandboxes", json={"templateID": "base", "metadata": {"v": "1"}})
    assert r.status_code == 201, r.text
    old = r.json()
    assert set(old) == {
        "templateID", "sandboxID", "alias", "clientID", "envdVersion", "envdAccessToken", "trafficAccessToken", "domain"
    }  # fmt: skip
    sid = old["sandboxID"]
    info = (await c.get(f"/sandboxes/{sid}")).json()
    assert info["state"] == "running" and info["metadata"] == {"v": "1"}
    started, ends = (datetime.fromisoformat(info[k].replace("Z", "+00:00")) for k in ("startedAt", "endAt"))
    assert (ends - started).total_seconds() == 15  # (the older create's default lifetime)
    new = (await c.post("/v2/sandboxes", json={"templateID": "code-interpreter-v1", "timeout": 60})).json()

    assert [s["sandboxID"] for s in (await c.get("/sandboxes")).json()] == [new["sandboxID"], sid]
    assert (await c.get("/sandboxes", params={"metadata": "v=1"})).json()[0]["sandboxID"] == sid
    r = await c.get("/v2/sandboxes", params={"limit": 1})
    assert [s["sandboxID"] for s in r.json()] == [new["sandboxID"]] and r.headers["x-total-running"] == "2"
    r = await c.get("/v2/sandboxes", params={"limit": 1, "nextToken": r.headers["x-next-token"]})
    assert [s["sandboxID"] for s in r.json()] == [sid] and "x-next-token" not in r.headers

    r = await c.post(f"/sandboxes/{sid}/connect", json={"timeout": 600})
    assert r.status_code == 200 and r.json()["sandboxID"] == sid
    assert (await c.post(f"/sandboxes/{sid}/resume", json={})).status_code == 409  # (running)
    assert (await c.post(f"/sandboxes/{sid}/pause")).status_code == 204
    assert [s["sandboxID"] for s in (await c.get("/sandboxes")).json()] == [new["sandboxID"]]  # (running only)
    assert (await c.post(f"/sandboxes/{sid}/pause")).status_code == 409
    r = await c.post(f"/sandboxes/{sid}/resume", json={"timeout": 30})
    assert r.status_code == 201 and r.json()["sandboxID"] == sid
    r = await c.post(f"/v2/sandboxes/{new['sandboxID']}/connect", json={"timeout": 30})
    assert r.status_code == 200
    assert (await c.post(f"/sandboxes/{sid}/refreshes", json={"duration": 3601})).status_code == 400
    assert (await c.post(f"/sandboxes/{sid}/timeout", json={})).status_code == 400
    assert (await c.post(f"/sandboxes/{sid}/timeout", json={"timeout": 5})).status_code == 204
    assert (await c.delete(f"/sandboxes/{sid}")).status_code == 204
    r = await c.delete(f"/sandboxes/{sid}")
    assert (r.status_code, r.json()["code"]) == (404, 404) and "was not found" in r.json()["message"]
    r = await c.post("/sandboxes", content=b"{not json")
    assert (r.status_code, set(r.json())) == (400, {"code", "message"})
    for method, path in [("PUT", "/sandboxes"), ("POST", "/snapshots")]:
        r = await c.request(method, path)
        assert (r.status_code, r.json()["code"]) == (405, 405), (path, r.text)
        assert "allowed: GET" in r.json()["message"] and "GET" in r.headers["allow"]


async def test_connect_and_resume_give_e2b_s_default_lifetimes(e2b: Any) -> None:
    """A connect without a timeout gives 300 s (E2B's ConnectSandbox default: the SDK sends
    none), the older resume 15 s (ResumedSandbox); X-Total-Running only when running
    sandboxes were asked for; a limit's 429 says not to retry (E2B's SDKs retry one that
    does not say)."""
    c = e2b.client

    async def left(sid: str) -> float:
        end = (await c.get(f"/sandboxes/{sid}")).json()["endAt"]
        return (datetime.fromisoformat(end.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds()

    sid = (await c.post("/sandboxes", json={"templateID": "base"})).json()["sandboxID"]  # 15 s
    assert await left(sid) <= 15
    r = await c.post(f"/v2/sandboxes/{sid}/connect", json={})
    assert r.status_code == 200, r.text
    assert 240 < await left(sid) <= 300
    assert (await c.post(f"/sandboxes/{sid}/pause")).status_code == 204
    r = await c.get("/v2/sandboxes", params={"state": "paused"})
    assert [s["sandboxID"] for s in r.json()] == [sid] and "x-total-running" not in r.headers
    assert (await c.get("/v2/sandboxes")).headers["x-total-running"] == "0"
    r = await c.post(f"/sandboxes/{sid}/resume", json={})
    assert r.status_code == 201, r.text
    assert 0 < await left(sid) <= 15
    assert (await c.delete(f"/sandboxes/{sid}")).status_code == 204
    limit = error_of(SnapshotLimitError("at most 2 snapshots (LOOM_MAX_SNAPSHOTS)"))
    assert (limit.status_code, limit.headers["should-retry"]) == (429, "false")
    busy = error_of(Busy("calls at once"))
    assert busy.status_code == 429 and "should-retry" not in busy.headers


def error_of(e: Exception) -> Any:
    """The answer the E2B routes give for ``e``."""
    known = translate(e)
    assert known is not None
    return error(known.status, known.message, retry=known.retry)


async def test_a_workspace_of_loom_s_own_api_is_a_sandbox_too(e2b: Any) -> None:
    c = e2b.client
    ws = (await c.post("/v1/workspaces", json={}, headers={"Authorization": f"Bearer {c.headers['X-API-KEY']}"})).json()
    listed = (await c.get("/v2/sandboxes")).json()
    assert [(s["sandboxID"], s["templateID"], s["endAt"]) for s in listed] == [
        (ws["id"], "loom-sandbox:latest", "9999-12-31T23:59:59Z")
    ]
    r = await c.post(f"/v2/sandboxes/{ws['id']}/connect", json={"timeout": 60})
    assert r.status_code == 200 and r.json()["templateID"] == "loom-sandbox:latest"
    assert (await c.post(f"/sandboxes/{ws['id']}/timeout", json={"timeout": 0})).status_code == 204
    assert (await c.get(f"/sandboxes/{ws['id']}")).status_code == 404  # (its time is up)
    store = plane_of(e2b.app).store
    for _ in range(200):  # (and the reaper kills it)
        if store.get(ws["id"]).state == "killed":
            break
        await asyncio.sleep(0.05)
    assert store.get(ws["id"]).state == "killed" and store.get(ws["id"]).adopted
    # With on_timeout "pause" (autoPause) its time being up pauses it instead.
    made = await c.post("/v2/sandboxes", json={"templateID": "base", "autoPause": True, "timeout": 0})
    sid = made.json()["sandboxID"]
    for _ in range(200):
        if store.get(sid).state == "paused":
            break
        await asyncio.sleep(0.05)
    info = (await c.get(f"/sandboxes/{sid}")).json()
    assert (info["state"], info["lifecycle"], info["pauseMode"]) == (
        "paused",
        {"autoResume": False, "onTimeout": "pause"},
        "filesystem",
    )


async def test_a_create_with_an_idempotency_key_is_made_once(e2b: Any) -> None:
    c = e2b.client
    first = await c.post("/v2/sandboxes", json={"templateID": "base"}, headers={"Idempotency-Key": "k-1"})
    again = await c.post("/v2/sandboxes", json={"templateID": "base"}, headers={"Idempotency-Key": "k-1"})
    other = await c.post("/v2/sandboxes", json={"templateID": "base"}, headers={"Idempotency-Key": "k-2"})
    assert first.json()["sandboxID"] == again.json()["sandboxID"] != other.json()["sandboxID"]
    bad = await c.post("/v2/sandboxes", json={"templateID": "base"}, headers={"Idempotency-Key": "UPPER"})
    assert bad.status_code == 400


def _request(app: Any, sandbox_id: str) -> Request:
    return Request({"type": "http", "app": app, "headers": [(b"e2b-sandbox-id", sandbox_id.encode())]})


async def test_a_sandbox_s_own_api_is_refused_once_it_is_killed_or_paused(e2b: Any) -> None:
    c = e2b.client
    plain = (await c.post("/v2/sandboxes", json={"templateID": "base"})).json()["sandboxID"]
    wakes = (
        await c.post("/v2/sandboxes", json={"templateID": "base", "autoPause": True, "autoResume": {"enabled": True}})
    ).json()["sandboxID"]
    assert (await target_of(_request(e2b.app, plain))).sandbox_id == plain
    for sid in (plain, wakes):
        assert (await c.post(f"/sandboxes/{sid}/pause")).status_code == 204
    with pytest.raises(SandboxNotFound, match="was not found: it is paused"):
        await target_of(_request(e2b.app, plain))
    # autoResume: the next use resumes it.
    assert (await target_of(_request(e2b.app, wakes))).sandbox_id == wakes
    assert (await c.get(f"/sandboxes/{wakes}")).json()["state"] == "running"
    assert (await c.delete(f"/sandboxes/{plain}")).status_code == 204
    with pytest.raises(SandboxNotFound, match="was not found: it was killed"):
        await target_of(_request(e2b.app, plain))
    with pytest.raises(SandboxNotFound, match="was not found"):
        await target_of(_request(e2b.app, "inosuch"))
