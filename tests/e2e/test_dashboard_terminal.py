"""The dashboard's Terminal tab in a real browser (Debian's chromium through Playwright,
the service in process on the real Docker backend, with a token: fixtures of
test_dashboard.py): open a terminal, type a command and see its output (in colour: the
terminal's styles are allowed by the page's nonce, no CSP violation), resize it with the
window, reload the page and find the terminal again with its output replayed, a second
terminal beside it, kill one, and on a phone. The token travels as the WebSocket's
``loom.bearer.`` subprotocol: never in a URL."""

from __future__ import annotations

import re
from typing import Any

import pytest

# The module-scoped service and browser of the dashboard's tests, shared.
from tests.e2e.test_dashboard import TOKEN, Page, Service, browser, phone, service, tab  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.timeout(300)]


def screen(page: Any) -> Any:
    """What the terminal on the page shows (xterm.js's rows, as text)."""
    return page.locator(".term-box .xterm-rows")


def stty_size(page: Any, marker: str) -> tuple[int, int]:
    """Type ``stty size`` (tagged) and read the rows and columns it prints."""
    from playwright.sync_api import expect

    page.keyboard.type(f"echo {marker}=$(stty size | tr ' ' x)\n")
    pattern = re.compile(rf"{marker}=(\d+)x(\d+)")
    expect(screen(page)).to_contain_text(pattern)
    found = pattern.findall(screen(page).inner_text())
    rows, cols = found[-1]
    return int(rows), int(cols)


def test_type_see_resize_reload_and_find_it_again(tab: Page, service: Service) -> None:  # noqa: F811 (fixtures)
    from playwright.sync_api import expect

    ws = service.workspace("termw")
    sockets: list[str] = []
    tab.page.on("websocket", lambda w: sockets.append(w.url))
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/termw/terminal")
    expect(page.get_by_text("No terminal open.")).to_be_visible()
    page.get_by_role("button", name="New terminal").first.click()
    expect(page.get_by_role("status").filter(has_text="Connected")).to_be_visible()
    expect(page).to_have_url(re.compile(r"#/w/termw/terminal/term-[0-9a-f]+$"))
    tid = page.url.rsplit("/", 1)[1]
    expect(screen(page)).to_contain_text(re.compile(r"[$#]"), timeout=20_000)  # the login shell's prompt

    page.locator(".term-box").click()
    page.keyboard.type("echo hello-$((6*7)) > made-here.txt; cat made-here.txt\n")
    expect(screen(page)).to_contain_text("hello-42")
    assert (ws / "made-here.txt").read_text() == "hello-42\n"
    # Colour: the theme's rules are in <style> elements xterm.js makes (the page's nonce).
    page.keyboard.type("printf '\\033[31m%s\\033[0m\\n' red-$((1+1))\n")
    red = page.locator(".term-box .xterm-rows span", has_text="red-2")
    expect(red).to_have_css("color", "rgb(204, 0, 0)")  # xterm.js 6's red (ANSI 1), from its theme's rules
    rows, cols = stty_size(page, "size1")
    assert cols > 80 and rows > 24, (rows, cols)  # fitted to the 1280 px page, not the default
    tab.shot("terminal")

    # The window narrower: the terminal follows it (fit, then a resize message).
    page.set_viewport_size({"width": 900, "height": 700})
    page.wait_for_timeout(300)
    rows2, cols2 = stty_size(page, "size2")
    assert cols2 < cols and rows2 < rows, ((rows, cols), (rows2, cols2))

    # A reload: the same terminal, its output replayed from the scrollback.
    page.reload()
    expect(page).to_have_url(re.compile(rf"/terminal/{tid}$"))
    expect(page.get_by_role("status").filter(has_text="Connected")).to_be_visible()
    expect(screen(page)).to_contain_text("hello-42")
    expect(page.locator(f'.term-list a[data-terminal="{tid}"]')).to_have_attribute("aria-current", "true")
    page.locator(".term-box").click()
    page.keyboard.type("echo after-reload-$((2*3))\n")
    expect(screen(page)).to_contain_text("after-reload-6")

    # The tab alone (no terminal in the address) opens the one open last.
    page.goto(f"{service.url}/#/w/termw/timeline")
    page.get_by_role("tab", name="Terminal").click()
    expect(page).to_have_url(re.compile(rf"/terminal/{tid}$"))
    expect(screen(page)).to_contain_text("after-reload-6")

    # A second terminal beside it; the list switches between them.
    page.get_by_role("button", name="New terminal").first.click()
    expect(page.locator(".term-list li")).to_have_count(2)
    expect(page).not_to_have_url(re.compile(rf"/terminal/{tid}$"))
    expect(screen(page)).not_to_contain_text("hello-42")
    page.locator(f'.term-list a[data-terminal="{tid}"]').click()
    expect(screen(page)).to_contain_text("after-reload-6")

    # Kill: the program ends, the list says so.
    page.get_by_role("button", name="Kill").click()
    expect(page.get_by_role("status").filter(has_text="ended by signal")).to_be_visible()
    expect(page.locator("li", has=page.locator(f'a[data-terminal="{tid}"]'))).to_contain_text("ended")
    tab.shot("terminal-killed")

    assert sockets and all(TOKEN not in url and "bearer" not in url for url in sockets), sockets


def test_a_terminal_on_a_phone(phone: Page, service: Service) -> None:  # noqa: F811 (fixtures)
    from playwright.sync_api import expect

    service.workspace("termphone")
    phone.sign_in()
    page = phone.page
    page.goto(f"{service.url}/#/w/termphone/terminal")
    page.get_by_role("button", name="New terminal").first.click()
    expect(page.get_by_role("status").filter(has_text="Connected")).to_be_visible()
    page.locator(".term-box").click()
    rows, cols = stty_size(page, "phone")
    assert 20 <= cols < 60, (rows, cols)  # fitted to the phone's width
    box = page.locator(".term-box").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    phone.shot("terminal")
