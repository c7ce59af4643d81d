"""``loom-worker secret`` and the HTTP routes of secrets, without Docker: write-only, the
value never on the command line or in an answer, refusals naming the field."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.test_http import running
from worker.cli import main
from worker.egress.provision import SecretsHost
from worker.registry import ToolRegistry
from worker.workspace_settings import Caps, Configs, SettingsStore

VALUE = "cli-value-" + "x" * 16


@pytest.fixture
def data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("LOOM_LOG_LEVEL", "warning")
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str, stdin: str = ""
) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_set_list_delete(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data_dir: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    assert run(capsys, monkeypatch, "workspace", "set", "-w", str(ws), "--egress", "api.example.com")[0] == 0
    hosts = ["--host", "api.example.com", "--host", "*.example.org"]
    code, out, err = run(
        capsys,
        monkeypatch,
        "secret",
        "set",
        "-w",
        str(ws),
        "TOKEN",
        *hosts,
        "--header",
        "Authorization: Bearer {value}",
        stdin=VALUE + "\n",
    )
    assert code == 0, err
    assert "$TOKEN in the sandbox: loom-secret:TOKEN:" in out and "*.example.org" in out  # not on the allowlist
    stored = json.loads(next(data_dir.rglob("secrets.json")).read_text())["secrets"]["TOKEN"]
    assert stored["value"] == VALUE  # the trailing newline of stdin is not part of it
    value_file = tmp_path / "tok"
    value_file.write_text("from-the-file-123\n")
    code, out, err = run(
        capsys,
        monkeypatch,
        "secret",
        "set",
        "-w",
        str(ws),
        "GIT",
        "--host",
        "github.com",
        "--basic",
        "x-access-token",
        "--value-file",
        str(value_file),
    )
    assert code == 0, err
    code, out, err = run(capsys, monkeypatch, "secret", "list", "-w", str(ws))
    assert code == 0 and "TOKEN" in out and "Basic {x-access-token:value}" in out
    assert VALUE not in out + err and "from-the-file" not in out + err
    code, out, err = run(capsys, monkeypatch, "secret", "list", "-w", str(ws), "--json")
    assert {s["name"] for s in json.loads(out)} == {"TOKEN", "GIT"} and VALUE not in out
    code, out, err = run(capsys, monkeypatch, "secret", "delete", "-w", str(ws), "GIT")
    assert code == 0 and "Deleted GIT" in out
    assert run(capsys, monkeypatch, "secret", "delete", "-w", str(ws), "GIT")[0] == 2
    # process-wide defaults
    code, out, err = run(
        capsys,
        monkeypatch,
        "secret",
        "set",
        "--default",
        "SHARED",
        "--host",
        "a.example.com",
        "--query",
        "key",
        stdin=VALUE,
    )
    assert code == 0, err
    assert "SHARED" in run(capsys, monkeypatch, "secret", "list", "--default")[1]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--host", "a.example.com", "--header", "X: {}", "--value", VALUE], "never the command line"),
        (["--host", "a.example.com", "--header", "X: {}", f"--value={VALUE}"], "never the command line"),
        (["--host", "*.co.uk", "--header", "X: {}"], "public suffix"),
        (["--host", "a.example.com"], "say how it is used"),
        (["--host", "a.example.com", "--header", "X: {}", "--query", "k"], "say how it is used"),
        (["--host", "a.example.com", "--header", "Authorization Bearer {}"], "valid header name"),
    ],
)
def test_cli_refusals_exit_2_without_the_value(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    data_dir: Path,
    argv: list[str],
    words: str,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    code, out, err = run(capsys, monkeypatch, "secret", "set", "-w", str(ws), "TOKEN", *argv, stdin=VALUE)
    assert code == 2 and words in err, err
    assert VALUE not in out + err
    assert not list(data_dir.rglob("secrets.json"))


@pytest.fixture
async def svc(tmp_path: Path, local_backend: Any) -> AsyncIterator[Any]:
    data = tmp_path / "data"
    configs = Configs(SettingsStore(data), {}, Caps(), secrets=SecretsHost(data))
    async with running(tmp_path / "root", ToolRegistry(backend=local_backend, configs=configs)) as s:
        yield s


async def test_http_routes_are_write_only(svc: Any) -> None:
    await svc.workspace("w")
    body = {"value": VALUE, "hosts": ["api.example.com"], "header": "X-Key: {value}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=svc.app), base_url="http://127.0.0.1") as anon:
        r = await anon.put("/v1/workspaces/w/secrets/TOKEN", json=body)
        assert r.status_code == 401
        r = await anon.put("/v1/secrets/TOKEN", json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
    texts = []
    r = await svc.client.put("/v1/workspaces/w/secrets/TOKEN", json=body)
    assert r.status_code == 200, r.text
    texts.append(r.text)
    assert r.json()["secret"]["name"] == "TOKEN" and "no egress allowlist" in r.json()["message"]
    r = await svc.client.put("/v1/workspaces/w/secrets/TOKEN", json={**body, "value": "rotated-1234567"})
    assert "next request" in r.json()["message"]
    texts.append(r.text)
    for path in ("/v1/workspaces/w/secrets", "/v1/secrets", "/openapi.json"):
        r = await svc.client.get(path)
        assert r.status_code == 200
        texts.append(r.text)
    assert [s["name"] for s in json.loads(texts[2])["secrets"]] == ["TOKEN"]
    schema = json.loads(texts[-1])["paths"]["/v1/workspaces/{workspace_id}/secrets/{name}"]["put"]
    assert "value" in json.dumps(schema["requestBody"])
    for bad, field in (
        ({"hosts": ["a.example.com"], "header": "X: {}"}, "value"),
        ({"value": VALUE, "header": "X: {}"}, "hosts"),
        ({"value": VALUE, "hosts": "a.example.com", "header": "X: {}"}, "hosts"),
        ({"value": VALUE, "hosts": ["a.example.com"], "header": "X: {}", "value_file": "/etc/shadow"}, "value_file"),
        ({"value": VALUE, "hosts": ["a.example.com"]}, "header"),
        ({"value": 12345, "hosts": ["a.example.com"], "header": "X: {}"}, "value"),
        ([VALUE], "body"),
    ):
        r = await svc.client.put("/v1/workspaces/w/secrets/OTHER", json=bad)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field], (bad, r.text)
        assert VALUE not in r.text
    assert (await svc.client.put("/v1/workspaces/w/secrets/9bad", json=body)).status_code == 422
    assert (await svc.client.put("/v1/workspaces/nope/secrets/TOKEN", json=body)).status_code == 404
    assert (await svc.client.delete("/v1/workspaces/w/secrets/TOKEN")).status_code == 200
    assert (await svc.client.delete("/v1/workspaces/w/secrets/TOKEN")).status_code == 404
    assert all(VALUE not in t and "rotated-1234567" not in t for t in texts)


def test_egress_log_prints_secret_uses(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data_dir: Path
) -> None:
    from worker.egress.log import EgressLog, EgressRecord

    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    assert run(capsys, monkeypatch, "workspace", "set", "-w", str(ws), "--egress", "api.example.com")[0] == 0
    log = EgressLog(data_dir)
    rec = EgressRecord(str(ws), "secret", "api.example.com", 443, "allowed", "header Authorization added")
    rec.secret, rec.method, rec.path, rec.status = "TOKEN", "GET", "/user", 200
    log.append(ws, rec)
    log.close()
    code, out, _err = run(capsys, monkeypatch, "egress-log", "-w", str(ws))
    assert code == 0 and "secret      api.example.com:443 TOKEN GET /user -> 200  header Authorization added" in out
    code, out, _err = run(capsys, monkeypatch, "egress-log", "-w", str(ws), "--json")
    entry = json.loads(out)["entries"][0]
    assert (entry["secret"], entry["status"], entry["kind"]) == ("TOKEN", 200, "secret")
