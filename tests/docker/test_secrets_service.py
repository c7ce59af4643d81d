"""Secrets through the HTTP service on the real engine (runc and gVisor): set without the
token refused; with it, used by the sandbox's requests; and the value in no answer of any
route, no log line, no metric, no refusal, and no file of the data directory but the
secrets files themselves."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import require_runtime
from tests.origins import Net
from tests.servers import serve_app

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TOKEN = "service-token-" + uuid.uuid4().hex


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    n = Net.start(tmp_path)
    try:
        yield n
    finally:
        n.stop()


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_the_value_is_in_no_answer_log_metric_or_error(
    runtime: str, docker_ready: None, net: Net, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from worker.http import create_app
    from worker.registry import default_registry
    from worker.settings import Settings

    require_runtime(runtime)
    value = "svc-" + uuid.uuid4().hex
    default_value = "dflt-" + uuid.uuid4().hex
    data = tmp_path / "data"
    settings = Settings(
        workspace_root=tmp_path / "root",
        data_dir=data,
        api_token=TOKEN,
        image=SANDBOX_IMAGE,
        runtime=runtime,  # type: ignore[arg-type]
        catalog=False,
        **net.settings(tmp_path),
    )

    @contextlib.asynccontextmanager
    async def registry_factory(s: Settings) -> AsyncIterator[Any]:
        async with default_registry(s) as reg:
            net.resolve_for(reg)
            yield reg

    answers: list[str] = []
    caplog.set_level(logging.DEBUG)
    with capture_logs() as logs:
        async with (
            serve_app(create_app(settings, registry_factory=registry_factory)) as url,
            httpx.AsyncClient(base_url=url, timeout=120) as anon,
            httpx.AsyncClient(base_url=url, timeout=120, headers={"Authorization": f"Bearer {TOKEN}"}) as api,
        ):
            r = await api.post("/v1/workspaces", json={"name": "w", "settings": {"egress": ["api.test"]}})
            assert r.status_code == 201, r.text
            good = {"value": value, "hosts": ["api.test"], "header": "Authorization: Bearer {value}"}
            r = await anon.put("/v1/workspaces/w/secrets/TOKEN", json=good)
            assert r.status_code == 401
            r = await api.get("/v1/workspaces/w/secrets")
            assert r.json()["secrets"] == []  # nothing was stored
            refusals = {
                "hosts": {"value": value, "hosts": ["*.com"], "header": "X: {}"},
                "hosts ": {"value": value},  # missing: FastAPI would have echoed the whole body
                "header": {"value": value, "hosts": ["api.test"], "header": "Authorization Bearer"},
                "value": {"value": value + "\n", "hosts": ["api.test"], "header": "X: {}"},
                "extra": {"value": value, "hosts": ["api.test"], "header": "X: {}", "extra": value},
            }
            for field, body in refusals.items():
                r = await api.put("/v1/workspaces/w/secrets/TOKEN", json=body)
                assert r.status_code == 422, (field, r.text)
                assert r.json()["detail"][0]["loc"][1] in (field.strip(), "extra"), r.text
                answers.append(r.text)
            r = await api.put("/v1/workspaces/w/secrets/TOKEN", content=b'{"value": "' + value.encode())
            assert r.status_code == 422
            answers.append(r.text)
            r = await api.put("/v1/workspaces/w/secrets/TOKEN", json=good)
            assert r.status_code == 200, r.text
            answers.append(r.text)
            placeholder = r.json()["secret"]["placeholder"]
            assert "next call" in r.json()["message"]
            r = await api.put(
                "/v1/secrets/SHARED", json={"value": default_value, "hosts": ["api.test"], "header": "X-Shared: {}"}
            )
            assert r.status_code == 200 and "allowlist" not in r.json()["message"], r.text
            answers.append(r.text)
            command = 'echo "$TOKEN"; curl -sS https://api.test/through-the-service; env'
            r = await api.post(
                "/v1/workspaces/w/execute", json={"tool": "shell_execute", "arguments": {"command": command}}
            )
            answers.append(r.text)
            assert placeholder in r.json()["output"] and "ok /through-the-service" in r.json()["output"], r.text
            seen = net.seen("api.test")[-1]
            assert seen.header("authorization") == [f"Bearer {value}"] and seen.header("x-shared") == [default_value]
            for _ in range(100):  # (the gateway logs a request just after relaying its answer)
                entries = (await api.get("/v1/workspaces/w/egress?limit=1000")).json()["entries"]
                if any(e["kind"] == "secret" and e["secret"] == "TOKEN" for e in entries):
                    break
                await asyncio.sleep(0.05)
            for path in (
                "/v1/workspaces/w/secrets",
                "/v1/secrets",
                "/v1/workspaces/w",
                "/v1/workspaces/w/egress?limit=1000",
                "/v1/workspaces/w/calls",
                "/v1/workspaces/w/sandbox",
                "/metrics",
            ):
                r = await api.get(path)
                assert r.status_code == 200, (path, r.text)
                answers.append(r.text)
            listed = (await api.get("/v1/workspaces/w/secrets")).json()["secrets"]
            assert {s["name"]: s["scope"] for s in listed} == {"SHARED": "default", "TOKEN": "workspace"}
            egress = (await api.get("/v1/workspaces/w/egress?limit=1000")).json()["entries"]
            use = next(e for e in egress if e["kind"] == "secret" and e["secret"] == "TOKEN")
            assert (use["method"], use["path"], use["status"], use["verdict"]) == (
                "GET",
                "/through-the-service",
                200,
                "allowed",
            )
            metrics = (await api.get("/metrics")).text
            assert 'loom_egress_secret_uses_total{secret="TOKEN",verdict="allowed"} 1.0' in metrics
            r = await api.delete("/v1/workspaces/w/secrets/TOKEN")
            assert r.status_code == 200
            assert (await api.delete("/v1/workspaces/w/secrets/TOKEN")).status_code == 404
            assert (await api.delete("/v1/secrets/SHARED")).status_code == 200
    for text in answers:
        assert value not in text and default_value not in text, text[:500]
    events = [e for e in logs if e.get("event") == "egress.secret"]
    assert events and all(value not in str(e) for e in logs)
    assert value not in caplog.text and default_value not in caplog.text
    # In the data directory the values were in the secrets files only (gone now), the key of
    # the workspace CA is the worker's alone, and the sandbox's bundle holds no key.
    holders = [p for p in data.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]
    assert holders == []
    key = next(data.rglob("secrets-ca.key"))
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    bundles = list((data / "egress").glob("*.ca-*.pem"))
    assert bundles and all(b"PRIVATE KEY" not in b.read_bytes() for b in bundles)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in data.rglob("secrets.json"))
    assert os.stat(data).st_mode  # (the directory exists: the checks above looked at something)
