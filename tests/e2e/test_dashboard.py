"""The dashboard in a real browser: Debian's chromium driven by Playwright, against the
service running in process (uvicorn on a free port) on the real Docker backend.

Scenarios (the issue's list): sign in (a wrong token refused), see a workspace, changes
made through the API (and by another process, the CLI) appearing without a reload, a
diff, undo of one call with its preview and confirmation and the file restored on disk,
a conflict shown (and forced), file names holding a newline and markup shown harmlessly,
a long-running command's output arriving live, a background process's output followed
and the process killed from its card, the phone width, the keyboard. Every screen is
saved under ``tests/e2e/screenshots/`` (git-ignored; CI keeps it as an artifact).

Firefox is not installable on this machine (Debian's firefox-esr has no Playwright
driver, and Playwright's own builds are a download): Chromium only, at 1280 and 390 px.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CHROMIUM, SANDBOX_IMAGE, require_chromium, require_docker
from tests.servers import free_port

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.timeout(300)]

TOKEN = "browser-test-token"
SHOTS = Path(__file__).parent / "screenshots"
REPO = Path(__file__).resolve().parents[2]
WIDE = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


@dataclass
class Service:
    url: str
    root: Path
    data: Path
    api: httpx.Client

    def workspace(self, name: str) -> Path:
        r = self.api.post("/v1/workspaces", json={"name": name})
        assert r.status_code == 201, r.text
        return Path(r.json()["path"])

    def call(self, ws: str, tool: str, call_id: str | None = None, **arguments: Any) -> dict[str, Any]:
        r = self.api.post(
            f"/v1/workspaces/{ws}/execute", json={"tool": tool, "arguments": arguments, "call_id": call_id}
        )
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


def run_service(root: Path, data: Path, token: str | None) -> tuple[Any, threading.Thread, str]:
    from uvicorn import Config, Server

    from worker.http import create_app
    from worker.settings import Settings

    settings = Settings(workspace_root=root, data_dir=data, api_token=token, image=SANDBOX_IMAGE, catalog=False)
    port = free_port()
    server = Server(
        Config(
            create_app(settings),
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=2,
        )
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    require_docker()
    require_chromium()
    root, data = tmp_path_factory.mktemp("dash-root"), tmp_path_factory.mktemp("dash-data")
    server, thread, url = run_service(root, data, TOKEN)
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    try:
        yield Service(url, root, data, api)
    finally:
        api.close()
        server.should_exit = True  # its lifespan stops the sandboxes it started
        thread.join(60)
        from tests.docker.fork_volumes import remove_fork_volumes

        remove_fork_volumes(data)  # the engine's volumes of the forks made (overlay forks)


@pytest.fixture(scope="module")
def browser(service: Service) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A browser tab on the dashboard that fails the test on a script error, a CSP
    violation or an alert/prompt (what an injected script would open)."""

    def __init__(self, browser: Any, service: Service, viewport: dict[str, int]) -> None:
        self.context = browser.new_context(viewport=viewport)
        self.page = self.context.new_page()
        self.service = service
        self.width = viewport["width"]
        self.problems: list[str] = []
        self.page.on("pageerror", lambda e: self.problems.append(f"script error: {e}"))
        self.page.on("dialog", lambda d: (self.problems.append(f"a {d.type} opened: {d.message}"), d.dismiss()))
        self.page.on(
            "console",
            lambda m: (
                self.problems.append(f"console: {m.text}")
                if "Content Security Policy" in m.text or "Refused to" in m.text
                else None
            ),
        )

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(SHOTS / f"{name}-{self.width}.png"), full_page=True)

    def sign_in(self) -> None:
        self.page.goto(self.service.url + "/")
        self.page.get_by_label("API token").fill(TOKEN)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.get_by_role("heading", name="Workspaces").wait_for()

    def close(self) -> None:
        self.context.close()
        assert self.problems == []


@pytest.fixture
def tab(browser: Any, service: Service) -> Iterator[Page]:
    t = Page(browser, service, WIDE)
    yield t
    t.close()


@pytest.fixture
def phone(browser: Any, service: Service) -> Iterator[Page]:
    t = Page(browser, service, PHONE)
    yield t
    t.close()


# -- the scenarios ------------------------------------------------------------------------


def test_sign_in_refuses_a_wrong_token_and_shows_the_workspaces(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    service.workspace("first")
    page = tab.page
    page.goto(service.url + "/")
    token = page.get_by_label("API token")
    expect(token).to_be_focused()
    expect(page.locator("table")).to_have_count(0)  # nothing but the form without a token
    tab.shot("signin")
    token.fill("not-the-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("That token was refused.")
    expect(page.locator("table")).to_have_count(0)
    tab.shot("signin-refused")
    token.fill(TOKEN)
    token.press("Enter")
    expect(page.get_by_role("link", name="first")).to_be_visible()
    expect(page.locator("tr[data-ws=first]")).to_contain_text(str(service.root / "first"))
    # the token: this tab's sessionStorage only, never a cookie or the URL
    assert page.evaluate("sessionStorage.getItem('loom-worker.token')") == TOKEN
    assert TOKEN not in page.evaluate("document.cookie") and TOKEN not in page.url
    assert tab.context.cookies() == []
    tab.shot("workspaces")
    # a new tab (a new session) must sign in again
    other = tab.context.browser.new_context().new_page()
    other.goto(service.url + "/")
    expect(other.get_by_label("API token")).to_be_visible()
    other.context.close()


def test_a_workspace_its_sandbox_and_settings(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    service.workspace("state")
    service.api.patch("/v1/workspaces/state", json={"memory": "512m"}).raise_for_status()
    service.call("state", "shell_execute", command="true")
    tab.sign_in()
    tab.page.get_by_role("link", name="state").click()
    tab.page.get_by_role("tab", name="Sandbox").click()
    panel = tab.page.get_by_role("tabpanel")
    expect(panel.locator("h2", has_text="Sandbox")).to_contain_text("running")
    expect(panel).to_contain_text(SANDBOX_IMAGE)
    expect(panel.locator("tr", has_text="Memory limit")).to_contain_text("512 MiB")  # its own setting
    expect(panel.locator("tr", has_text="Memory now")).to_contain_text("of 512 MiB")
    expect(panel.locator(".settings tr", has_text="memory")).to_contain_text("512 MiB512m")
    tab.shot("sandbox")


def test_calls_appear_live_without_a_reload_also_from_the_cli(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    ws = service.workspace("live")
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/live/timeline")
    expect(page.get_by_role("status").filter(has_text="Live")).to_be_visible()
    page.evaluate("window.__notReloaded = true")
    service.call("live", "write_file", "api-1", path="src/app.py", content="print('hi')\n")
    row = page.locator('tr.call[data-call-id="api-1"]')
    expect(row).to_contain_text("write_file")
    expect(row).to_contain_text("src/app.py")
    service.call("live", "shell_execute", "api-2", command="exit 3")
    expect(page.locator('tr.call[data-call-id="api-2"]')).to_contain_text("failed")
    # another process: the CLI, through its own registry and the same journal
    env = {**os.environ, "LOOM_DATA_DIR": str(service.data), "LOOM_IMAGE": SANDBOX_IMAGE, "LOOM_CATALOG": "false"}
    cli = shutil.which("loom-worker") or str(REPO / ".venv" / "bin" / "loom-worker")
    done = subprocess.run(
        [cli, "call", "write_file", "--workspace", str(ws), "--args", '{"path": "cli.txt", "content": "x"}'],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    cli_row = page.locator("tr.call", has_text="cli.txt")
    expect(cli_row).to_be_visible()
    assert cli_row.get_attribute("data-call-id", timeout=1000).startswith("call_")
    rows = page.locator("tr.call:not(.ui-call)")
    expect(rows).to_have_count(3)
    assert "cli.txt" in rows.nth(0).inner_text()  # newest first
    assert page.evaluate("window.__notReloaded") is True
    tab.shot("timeline")
    # the details of a call, with the keyboard
    row.focus()
    row.press("Enter")
    expect(row).to_have_attribute("aria-expanded", "true")
    expect(page.locator("tr.detail")).to_contain_text("content")
    expect(page.locator("tr.detail")).to_contain_text("[12 chars]")  # the content is never shown
    tab.shot("timeline-details")


def test_a_diff_then_undo_of_one_call_restores_the_file(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    ws = service.workspace("undo")
    service.call("undo", "write_file", "create-1", path="calc.py", content="def add(a, b):\n    return a + b\n")
    service.call("undo", "edit_file", "edit-1", path="calc.py", old_str="a + b", new_str="a - b  # oops")
    service.call("undo", "write_file", "other-1", path="notes.txt", content="keep me\n")
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/undo/changes")
    group = page.locator('article.group[data-call-id="edit-1"]')
    group.get_by_role("button", name="Diff").first.click()
    diff = group.locator(".diff")
    expect(diff.locator(".dl.del")).to_contain_text("return a + b")
    expect(diff.locator(".dl.add")).to_contain_text("return a - b  # oops")
    expect(diff.locator(".dl.add .tok-kw")).to_contain_text("return")  # highlighted
    tab.shot("changes-diff")
    group.get_by_role("button", name="Undo", exact=True).click()
    dialog = page.locator("dialog")
    expect(dialog).to_contain_text("Nothing has changed yet")
    expect(dialog.locator(".dl.add")).to_contain_text("return a + b")
    expect(dialog.locator(".dl.del")).to_contain_text("return a - b  # oops")
    tab.shot("undo-preview")
    assert "a - b" in (ws / "calc.py").read_text()  # the preview changed nothing
    dialog.get_by_role("button", name="Confirm").click()
    expect(dialog).to_contain_text("Undone.")
    tab.shot("undo-done")
    assert (ws / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert (ws / "notes.txt").read_text() == "keep me\n"  # only that call
    dialog.get_by_role("button", name="Close").click()
    expect(group.locator("li.entry").first).to_contain_text("undone")


def test_a_conflict_is_shown_with_the_choice_to_force(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    ws = service.workspace("conflict")
    service.call("conflict", "write_file", "w-1", path="a.txt", content="one\n")
    service.call("conflict", "edit_file", "w-2", path="a.txt", old_str="one", new_str="two")
    service.call("conflict", "edit_file", "w-3", path="a.txt", old_str="two", new_str="three")
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/conflict/timeline")
    row = page.locator('tr.call[data-call-id="w-2"]')
    row.click()
    page.locator("tr.detail").get_by_role("button", name="Undo").click()
    dialog = page.locator("dialog")
    expect(dialog.get_by_role("alert")).to_contain_text("Conflict")
    expect(dialog.locator("ul.conflicts")).to_contain_text("a.txt: entry")
    tab.shot("undo-conflict")
    assert (ws / "a.txt").read_text() == "three\n"
    dialog.get_by_role("button", name="Force").click()
    expect(dialog).to_contain_text("Forced")
    expect(dialog.locator(".dl.del")).to_contain_text("three")
    dialog.get_by_role("button", name="Confirm").click()
    expect(dialog).to_contain_text("Undone")
    assert (ws / "a.txt").read_text() == "one\n"
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)


HOSTILE = [
    "evil\n<script>window.__pwned = 1<!--",  # a newline and a script tag (a name holds no '/')
    '<img src=x onerror="window.__pwned = 2">.txt',
]


def test_hostile_file_names_are_shown_quoted_and_harmless(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    ws = service.workspace("names")
    script = "; ".join(f"printf x > '{n}'" for n in HOSTILE)
    service.call("names", "shell_execute", "hostile", command=script)
    assert {p.name for p in ws.iterdir()} == set(HOSTILE)
    quoted = '"evil\\n<script>window.__pwned = 1<!--"'  # as the API quotes them
    quoted_img = '"<img src=x onerror=\\"window.__pwned = 2\\">.txt"'
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/names/timeline")
    row = page.locator('tr.call[data-call-id="hostile"]')
    expect(row).to_contain_text(quoted)
    row.click()
    expect(page.locator("tr.detail ul.paths")).to_contain_text(quoted_img)
    tab.shot("names-timeline")
    page.goto(f"{service.url}/#/w/names/changes")
    expect(page.locator("li.entry").filter(has_text=quoted)).to_have_count(1)
    page.locator("li.entry").filter(has_text=quoted).get_by_role("button", name="Diff").click()
    expect(page.locator(".diff-head")).to_contain_text(quoted)
    tab.shot("names-changes")
    page.goto(f"{service.url}/#/w/names/files")
    link = page.get_by_role("link", name=quoted)
    expect(link).to_be_visible()
    link.click()
    expect(page.locator(".code-view")).to_contain_text("x")
    tab.shot("names-files")
    # nothing of the names became markup or ran
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img[src=x], script:not([src])").count() == 0


def test_create_and_delete_a_workspace_keeping_its_files(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    tab.sign_in()
    page = tab.page
    page.get_by_label("Name", exact=True).fill("made-in-ui")
    page.get_by_label("Memory", exact=True).fill("lots")
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("alert")).to_contain_text("memory")  # the refused field, named
    page.get_by_label("Memory", exact=True).fill("256m")
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("link", name="made-in-ui")).to_be_visible()
    (service.root / "made-in-ui" / "kept.txt").write_text("kept")
    page.get_by_role("button", name="Delete workspace made-in-ui").click()
    dialog = page.locator("dialog")
    expect(dialog).to_contain_text("files are kept")
    expect(dialog.get_by_label("Also delete its files (this cannot be undone)")).not_to_be_checked()
    tab.shot("delete-confirm")
    dialog.get_by_role("button", name="Delete").click()
    expect(dialog).to_have_count(0)
    assert (service.root / "made-in-ui" / "kept.txt").read_text() == "kept"


def test_run_a_command_and_browse_the_files(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    service.workspace("run")
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/run/run")
    page.get_by_role("textbox", name="Command").fill("mkdir -p pkg && echo 'x = 1' > pkg/mod.py && echo made && ls pkg")
    page.get_by_role("button", name="Run").click()
    expect(page.locator("#run-output")).to_contain_text("made\nmod.py")
    expect(page.locator(".run-status")).to_contain_text("Done")
    tab.shot("run")
    page.get_by_role("tab", name="Files").click()
    page.get_by_role("link", name="pkg/").click()
    page.get_by_role("link", name="mod.py").click()
    expect(page.locator(".code-view")).to_contain_text("x = 1")
    tab.shot("files")
    page.get_by_role("tab", name="Egress").click()
    expect(page.get_by_role("tabpanel")).to_contain_text("No network")
    tab.shot("egress")
    # the command run here is in the timeline; the file views only when asked for
    page.get_by_role("tab", name="Timeline").click()
    expect(page.locator("tr.call:visible")).to_have_count(1)
    expect(page.locator("tr.call:visible")).to_contain_text("echo made")
    page.get_by_label("Show the dashboard's own reads").check()
    expect(page.locator("tr.call:visible", has_text="list_directory").first).to_be_visible()
    expect(page.locator("tr.call:visible", has_text="read_file")).to_have_count(1)


def test_long_running_output_arrives_live(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    service.workspace("stream")
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/stream/run")
    page.get_by_role("textbox", name="Command").fill("for i in 1 2 3 4; do echo tick $i; sleep 1; done")
    page.get_by_role("button", name="Run").click()
    expect(page.locator("#run-output")).to_contain_text("tick 1", timeout=10_000)
    # the first line is there while the command still runs
    expect(page.locator(".run-status")).to_contain_text("Running")
    tab.shot("run-live")
    expect(page.locator(".run-status")).to_contain_text("Done", timeout=30_000)
    expect(page.locator("#run-output")).to_contain_text("tick 4")


def test_background_process_followed_and_killed(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    service.workspace("bg")
    started = service.call(
        "bg",
        "shell_execute",
        "bg-1",
        command="i=0; while true; do i=$((i+1)); echo beat $i; sleep 0.5; done",
        background=True,
    )
    assert started["success"], started
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/bg/run")
    card = page.locator("article.proc")
    expect(card).to_have_count(1)
    expect(card).to_contain_text("running")
    # its output is followed: a later line arrives without a reload
    expect(card.locator("pre")).to_contain_text("beat 1", timeout=10_000)
    expect(card.locator("pre")).to_contain_text("beat 4", timeout=10_000)
    tab.shot("process-live")
    card.get_by_role("button", name="Kill").click()
    expect(card.locator("pre")).to_contain_text("[exited", timeout=15_000)
    expect(card).to_contain_text("ended", timeout=10_000)
    listed = service.api.get("/v1/workspaces/bg/processes").json()["processes"]
    assert [p["running"] for p in listed] == [False]


def test_egress_log_shows_the_allowlist_and_a_refusal(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    service.workspace("net")
    r = service.api.patch("/v1/workspaces/net", json={"egress": ["pypi.org"]})
    assert r.status_code == 200, r.text
    # a destination off the list, harmless were the gateway wrong (another package registry)
    out = service.call(
        "net", "shell_execute", "net-1", command="curl -s -o /dev/null -w '%{http_code}' http://registry.npmjs.org/"
    )
    assert "403" in out["output"], out
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/net/egress")
    panel = page.get_by_role("tabpanel")
    expect(panel).to_contain_text("pypi.org")
    row = page.locator("table.egress tbody tr", has_text="registry.npmjs.org:80")
    expect(row.first).to_contain_text("denied")
    tab.shot("egress-log")
    page.get_by_label("Verdict").select_option("allowed")
    expect(page.locator("table.egress tbody tr", has_text="registry.npmjs.org")).to_have_count(0)


APP_PAGE = """<!doctype html><meta charset="utf-8"><title>loading</title>
<p id="out">the agent's app</p>
<script>
let stolen;
try { stolen = 'token:' + sessionStorage.getItem('loom-worker.token'); } catch (e) { stolen = 'blocked:' + e.name; }
let sw = 'none';
try { sw = navigator.serviceWorker ? 'available' : 'none'; } catch (e) { sw = 'blocked'; }
fetch('/v1/workspaces', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"name": "evil"}' })
  .then((r) => r.status, () => 'failed')
  .then((api) => {
    document.title = 'done';
    document.getElementById('out').textContent = stolen + ' sw:' + sw + ' api:' + api;
  });
</script>
"""


def test_the_agents_app_through_the_proxy_cannot_act_as_the_dashboard(browser: Any, service: Service) -> None:
    from playwright.sync_api import expect

    # The app a sandbox serves is opened from the service's own origin, in the very tab the
    # user signed in with: its scripts must get neither the token nor the API.
    ws = service.workspace("app")
    (ws / "index.html").write_text(APP_PAGE)
    started = service.call(
        "app", "shell_execute", "app-1", command="python3 -m http.server 8000 --bind 127.0.0.1", background=True
    )
    assert started["success"], started
    context = browser.new_context(viewport=WIDE, http_credentials={"username": "me", "password": TOKEN})
    try:
        page = context.new_page()
        page.goto(service.url + "/")
        page.get_by_label("API token").fill(TOKEN)
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("heading", name="Workspaces").wait_for()
        assert page.evaluate("sessionStorage.getItem('loom-worker.token')") == TOKEN  # the dashboard keeps it
        url = f"{service.url}/v1/workspaces/app/ports/8000/index.html"
        for _ in range(50):  # the server in the sandbox may still be starting
            if service.api.get("/v1/workspaces/app/ports/8000/index.html").status_code == 200:
                break
            time.sleep(0.2)
        page.goto(url)
        expect(page).to_have_title("done", timeout=15_000)
        result = page.locator("#out").inner_text()
        page.screenshot(path=str(SHOTS / "proxied-app-1280.png"))
        assert result.startswith("blocked:"), result  # no storage of the service's origin
        assert TOKEN not in result
        assert " api:403" in result or " api:failed" in result, result  # the guard refuses Origin: null
        names = [w["id"] for w in service.api.get("/v1/workspaces").json()]
        assert "evil" not in names
    finally:
        context.close()
        service.call("app", "shell_execute", command="true")
        for p in service.api.get("/v1/workspaces/app/processes").json()["processes"]:
            if p["running"]:
                service.api.post(f"/v1/workspaces/app/processes/{p['id']}/kill", json={})


def test_on_a_phone(phone: Page, service: Service) -> None:
    from playwright.sync_api import expect

    service.workspace("phone")
    service.call("phone", "write_file", "p-1", path="a.py", content="a = 1\n")
    service.call("phone", "edit_file", "p-2", path="a.py", old_str="a = 1", new_str="a = 2")
    phone.sign_in()
    page = phone.page
    phone.shot("workspaces")
    page.goto(f"{service.url}/#/w/phone/timeline")
    expect(page.locator('tr.call[data-call-id="p-2"]')).to_be_visible()
    phone.shot("timeline")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page is {width} px wide on a {PHONE['width']} px screen"
    page.get_by_role("tab", name="Changes").click()
    page.locator('article.group[data-call-id="p-2"]').get_by_role("button", name="Undo", exact=True).click()
    expect(page.locator("dialog").get_by_role("button", name="Confirm")).to_be_in_viewport()
    phone.shot("undo-preview")
    page.locator("dialog").get_by_role("button", name="Confirm").click()
    expect(page.locator("dialog")).to_contain_text("Undone")
    assert (service.root / "phone" / "a.py").read_text() == "a = 1\n"


def test_tabs_by_keyboard(tab: Page, service: Service) -> None:
    from playwright.sync_api import expect

    service.workspace("keys")
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/keys/timeline")
    page.get_by_role("tab", name="Timeline").focus()
    page.keyboard.press("ArrowRight")
    expect(page.get_by_role("tab", name="Changes")).to_have_attribute("aria-selected", "true")
    expect(page.get_by_role("tab", name="Changes")).to_be_focused()
    page.keyboard.press("End")
    expect(page.get_by_role("tab", name="Egress")).to_have_attribute("aria-selected", "true")


def test_without_a_token_the_dashboard_opens_directly(browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    server, thread, url = run_service(tmp_path / "root", tmp_path / "data", None)
    try:
        context = browser.new_context(viewport=WIDE)
        page = context.new_page()
        page.goto(url + "/")
        expect(page.get_by_role("heading", name="Workspaces")).to_be_visible()
        expect(page.get_by_text("no API token: loopback only")).to_be_visible()
        expect(page.get_by_label("API token")).to_have_count(0)
        page.screenshot(path=str(SHOTS / "open-mode-1280.png"))
        context.close()
    finally:
        server.should_exit = True
        thread.join(60)
