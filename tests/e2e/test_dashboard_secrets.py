"""The dashboard's Egress tab in a real browser (Debian's chromium through Playwright)
shows each use of a secret (its name, the request, the answer's status, the verdict) and
no page of the workspace shows its value; on the real engine under runc and gVisor, the
secret's host an HTTPS origin of the test's own (``tests/origins.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CHROMIUM, SANDBOX_IMAGE, require_chromium, require_docker
from tests.docker.conftest import require_runtime
from tests.e2e.test_dashboard import SHOTS, TOKEN, WIDE, Page
from tests.origins import Net
from tests.servers import free_port

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.timeout(300)]


@dataclass
class Service:
    url: str
    api: httpx.Client


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    n = Net.start(tmp_path)
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(params=["runc", "runsc"])
def service(request: pytest.FixtureRequest, tmp_path: Path, net: Net) -> Iterator[Service]:
    require_docker()
    require_chromium()
    require_runtime(request.param)
    from uvicorn import Config, Server

    from worker.http import create_app
    from worker.registry import default_registry
    from worker.settings import Settings

    settings = Settings(
        workspace_root=tmp_path / "root",
        data_dir=tmp_path / "data",
        api_token=TOKEN,
        image=SANDBOX_IMAGE,
        runtime=request.param,
        catalog=False,
        **net.settings(tmp_path),
    )

    @contextlib.asynccontextmanager
    async def registry_factory(s: Settings) -> AsyncIterator[Any]:
        async with default_registry(s) as reg:
            net.resolve_for(reg)
            yield reg

    port = free_port()
    app = create_app(settings, registry_factory=registry_factory)
    server = Server(Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    try:
        yield Service(url, api)
    finally:
        api.close()
        server.should_exit = True
        thread.join(60)


@pytest.fixture
def tab(service: Service) -> Iterator[Page]:
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        t = Page(browser, service, WIDE)  # type: ignore[arg-type]
        try:
            yield t
        finally:
            t.close()
            browser.close()


def test_the_egress_tab_shows_secret_uses_and_no_page_shows_a_value(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    value = "dash-" + uuid.uuid4().hex
    r = service.api.post("/v1/workspaces", json={"name": "net", "settings": {"egress": ["api.test"]}})
    assert r.status_code == 201, r.text
    secret = {"value": value, "hosts": ["api.test"], "header": "Authorization: Bearer {value}"}
    assert service.api.put("/v1/workspaces/net/secrets/TOKEN", json=secret).status_code == 200
    command = 'curl -sS https://api.test/dash; curl -sS "https://api.test/in-url?t=$TOKEN"; echo "$TOKEN"'
    out = service.api.post(
        "/v1/workspaces/net/execute", json={"tool": "shell_execute", "arguments": {"command": command}}
    ).json()
    assert "ok /dash" in out["output"] and value not in out["output"], out
    tab.sign_in()
    page = tab.page
    page.goto(f"{tab.service.url}/#/w/net/egress")
    rows = page.locator("table.egress tbody tr", has_text="TOKEN")
    expect(rows.filter(has_text="GET /dash → 200").first).to_contain_text("allowed")
    expect(rows.filter(has_text="the URL").first).to_contain_text("denied")
    tab.shot("egress-secrets")
    pages = [page.content()]
    for view in ("timeline", "sandbox", "run"):
        page.goto(f"{tab.service.url}/#/w/net/{view}")
        page.get_by_role("tabpanel").wait_for()
        page.wait_for_timeout(1000)  # (its data is fetched once it shows)
        pages.append(page.content())
    assert "loom-secret:TOKEN:" in "".join(pages)  # the placeholder is shown (the timeline's output)
    assert all(value not in html for html in pages)
