"""The dashboard's serving and the service's browser-facing defences, in process: the page
and its assets without a token and with a strict CSP, data routes still behind the token,
cross-site writes refused (CSRF), loopback-only Host names without a token (DNS
rebinding), and the shipped assets themselves (no HTML injection sinks, every import
present and packaged, small)."""

from __future__ import annotations

import re
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.test_http import AUTH, Service, lifespan_task, running
from worker.dashboard import STATIC
from worker.registry import ToolRegistry
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def svc(tmp_path: Path, local_backend: Any) -> AsyncIterator[Service]:
    async with running(tmp_path / "root", ToolRegistry(backend=local_backend)) as s:
        yield s


def anonymous(svc: Service, base: str = "http://127.0.0.1:8080") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=svc.app), base_url=base)


# -- the page and its assets --------------------------------------------------------------


async def test_the_page_and_assets_need_no_token_and_carry_a_strict_csp(svc: Service) -> None:
    async with anonymous(svc) as c:
        for url, kind in [("/", "text/html"), ("/ui/app.css", "text/css"), ("/ui/js/main.js", "javascript")]:
            r = await c.get(url)
            assert r.status_code == 200, url
            assert kind in r.headers["content-type"]
            csp = r.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src 'self'" in csp and "style-src 'self'" in csp
            assert "frame-ancestors 'none'" in csp and "connect-src 'self'" in csp
            assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["referrer-policy"] == "no-referrer"
            assert r.headers["cache-control"] == "no-cache"
        assert (await c.get("/ui/nope.js")).status_code == 404
        # (with the token: without one, a path outside the public ones is a 401 first)
        assert (await c.get("/ui/../http.py", headers=AUTH)).status_code == 404
        assert (await c.get("/ui/%2e%2e/http.py")).status_code == 404
        # data is still behind the token
        for url in ["/v1/workspaces", "/v1/workspaces/w/calls", "/v1/workspaces/w/sandbox", "/metrics"]:
            assert (await c.get(url)).status_code == 401, url
        # the API's own pages keep their headers (Swagger UI loads its own scripts)
        assert "content-security-policy" not in (await c.get("/docs")).headers
        r = await c.get("/ui/index.html")
        assert r.status_code == 200 and "content-security-policy" in r.headers


async def test_the_page_allows_only_style_elements_with_its_own_nonce(svc: Service) -> None:
    # xterm.js writes its colours and sizes into <style> elements; the page's scripts give
    # those the nonce of its response. Style attributes and other inline styles stay refused.
    async with anonymous(svc) as c:
        pages = [await c.get("/") for _ in range(2)]
        nonces = []
        for r in pages:
            csp = r.headers["content-security-policy"]
            assert r.headers.get_list("content-security-policy") == [csp]  # its own, not the default too
            found = re.search(r"style-src 'self' 'nonce-([A-Za-z0-9_-]{20,})';", csp)
            assert found, csp
            assert f'<link rel="stylesheet" href="/ui/app.css" nonce="{found[1]}">' in r.text
            assert "{{style-nonce}}" not in r.text and "etag" not in r.headers
            nonces.append(found[1])
        assert nonces[0] != nonces[1]  # one per answer
        asset = await c.get("/ui/app.css")
        assert "nonce" not in asset.headers["content-security-policy"]
        assert "style-src 'self';" in asset.headers["content-security-policy"]


async def test_a_conditional_reload_is_a_304(svc: Service) -> None:
    async with anonymous(svc) as c:
        first = await c.get("/ui/js/api.js")
        again = await c.get("/ui/js/api.js", headers={"If-None-Match": first.headers["etag"]})
        assert again.status_code == 304


# -- CSRF -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "http://127.0.0.1:9999"},  # another service on the same host
        {"Origin": "null"},
        {"Origin": "not a url"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
)
async def test_cross_site_writes_are_refused_token_or_not(svc: Service, headers: dict[str, str]) -> None:
    async with anonymous(svc) as c:
        r = await c.post("/v1/workspaces", json={"name": "x"}, headers={**AUTH, **headers})
        assert r.status_code == 403 and "Cross-site request refused" in r.json()["detail"]
        assert not (svc.root / "x").exists()
        (svc.root / "keep").mkdir(exist_ok=True)
        r = await c.delete("/v1/workspaces/keep", params={"delete_files": True}, headers={**AUTH, **headers})
        assert r.status_code == 403 and (svc.root / "keep").is_dir()
    metrics = (await svc.client.get("/metrics")).text
    assert 'loom_http_rejected_total{reason="origin"}' in metrics


@pytest.mark.parametrize(
    "headers",
    [
        {},  # a script: no Origin
        {"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"},  # the dashboard itself
        {"Origin": "http://127.0.0.1:8080/"},
    ],
)
async def test_same_origin_and_scripts_may_write(svc: Service, headers: dict[str, str]) -> None:
    async with anonymous(svc) as c:
        r = await c.post("/v1/workspaces", json={"name": "x"}, headers={**AUTH, **headers})
        assert r.status_code == 201, r.text


async def test_behind_a_tls_proxy_the_page_origin_is_https(svc: Service) -> None:
    async with anonymous(svc, "http://loom.example.com") as c:
        r = await c.post("/v1/workspaces", json={"name": "y"}, headers={**AUTH, "Origin": "https://loom.example.com"})
        assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},  # a script's read, from a browser without Fetch Metadata
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"},  # fetch()
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"},  # <img>
        {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"},  # another port
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "object"},  # <object>
    ],
)
async def test_cross_site_reads_are_refused(svc: Service, headers: dict[str, str]) -> None:
    # Not an answer a foreign page could read (no CORS headers), but without a token it
    # could still open the streams, start sandboxes and time the answers.
    async with anonymous(svc) as c:
        for url in ["/v1/workspaces", "/v1/workspaces/w/calls/stream", "/healthz", "/ui/js/api.js"]:
            r = await c.get(url, headers={**AUTH, **headers})
            assert r.status_code == 403 and "Cross-site request refused" in r.json()["detail"], (url, r.text)
    assert 'loom_http_rejected_total{reason="origin"}' in (await svc.client.get("/metrics")).text


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},  # a link
        {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},  # typed
        {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"},  # the dashboard
        {"Origin": "http://127.0.0.1:8080"},
    ],
)
async def test_navigations_and_same_origin_reads_are_answered(svc: Service, headers: dict[str, str]) -> None:
    async with anonymous(svc) as c:
        assert (await c.get("/", headers=headers)).status_code == 200
        r = await c.get("/v1/workspaces", headers={**AUTH, **headers})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


# -- DNS rebinding (no token: loopback only) ----------------------------------------------


@pytest.fixture
async def open_app(tmp_path: Path, local_backend: Any) -> AsyncIterator[Any]:
    from worker.http import create_app

    app = create_app(Settings(workspace_root=tmp_path / "root"), ToolRegistry(backend=local_backend))
    async with lifespan_task(app):
        yield app


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.nip.io", "10.0.0.1:8080"])
async def test_without_a_token_only_loopback_names_are_answered(open_app: Any, host: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=open_app), base_url="http://127.0.0.1") as c:
        for url in ["/v1/workspaces", "/"]:
            r = await c.get(url, headers={"Host": host})
            assert r.status_code == 403 and "DNS rebinding" in r.json()["detail"], (url, host)


@pytest.mark.parametrize("host", ["127.0.0.1:8080", "localhost:8080", "[::1]:8080", "localhost"])
async def test_without_a_token_loopback_names_open_directly(open_app: Any, host: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=open_app), base_url="http://127.0.0.1") as c:
        r = await c.get("/v1/workspaces", headers={"Host": host})
        assert r.status_code == 200, r.text


async def test_with_a_token_any_host_name_is_answered(svc: Service) -> None:
    async with anonymous(svc, "http://worker.internal:8080") as c:
        assert (await c.get("/v1/workspaces", headers=AUTH)).status_code == 200


# -- the shipped assets -------------------------------------------------------------------


def _assets() -> list[Path]:
    return sorted(p for p in STATIC.rglob("*") if p.is_file())


VENDOR = STATIC / "vendor"


def _own_assets() -> list[Path]:
    """The dashboard's own files (the vendored ones: tests/unit/test_dashboard_vendor.py)."""
    return [p for p in _assets() if not p.is_relative_to(VENDOR)]


def test_no_html_sinks_no_inline_script_or_style() -> None:
    for p in _own_assets():
        if p.suffix != ".js":
            continue
        text = re.sub(r"^\s*//.*$", "", p.read_text(), flags=re.M)  # code, not its comments
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in text, (p.name, sink)
        assert "setAttribute('style'" not in text and ".style." not in text, p.name
    html = (STATIC / "index.html").read_text()
    assert " style=" not in html and "<style" not in html
    for tag in re.findall(r"<script[^>]*>", html):
        assert 'src="/ui/' in tag
    assert re.findall(r"<script[^>]*>([^<]+)</script>", html) == []


def test_every_import_is_shipped_and_packaged() -> None:
    files = {p.relative_to(STATIC).as_posix() for p in _assets()}
    for p in _own_assets():
        if p.suffix == ".js":
            for target in re.findall(r"(?:from |import\()'(\.{1,2}/[^']+)'", p.read_text()):
                resolved = (p.parent / target).resolve().relative_to(STATIC.resolve()).as_posix()
                assert resolved in files, (p.name, target)
    for ref in re.findall(r'(?:src|href)="/ui/([^"]+)"', (STATIC / "index.html").read_text()):
        assert ref in files, ref
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "worker.dashboard"
    ]
    packaged = {p.relative_to(STATIC.parent).as_posix() for pat in patterns for p in STATIC.parent.glob(pat)}
    assert packaged == {f"static/{f}" for f in files}


def test_the_assets_are_small() -> None:
    # The budget for the first load is 300 KB with the API's answers; the
    # assets alone stay far below it (bench_dashboard measures the real transfer). The
    # vendored terminal (xterm.js) is loaded by the Terminal tab only, never at first load.
    assert sum(p.stat().st_size for p in _own_assets()) < 150_000
    assert "vendor/" not in (STATIC / "index.html").read_text()
    users = [p.name for p in (STATIC / "js").rglob("*.js") if "vendor/" in p.read_text()]
    assert users == ["terminal.js"]  # (its dynamic import, when the tab opens)
    assert sum(p.stat().st_size for p in _assets() if p.is_relative_to(VENDOR)) < 400_000
