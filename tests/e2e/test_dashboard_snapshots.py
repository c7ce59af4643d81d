"""The dashboard's Snapshots tab in a real browser (Debian's chromium through Playwright,
the service in process on the real Docker backend; fixtures of test_dashboard.py): take a
snapshot, fork it, see the fork tree, restore with its preview and Confirm (the file back
on disk), deleting a snapshot with live forks asks first, and on a phone."""

from __future__ import annotations

import pytest

# The module-scoped service and browser of the dashboard's tests, shared.
from tests.e2e.test_dashboard import PHONE, Page, Service, browser, phone, service, tab  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.timeout(300)]


def test_snapshot_fork_restore_and_delete(tab: Page, service: Service) -> None:  # noqa: F811 (fixtures)
    from playwright.sync_api import expect

    ws = service.workspace("snapw")
    service.call("snapw", "write_file", "s-1", path="calc.py", content="def add(a, b):\n    return a + b\n")
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/snapw/snapshots")
    expect(page.get_by_text("No snapshots yet.")).to_be_visible()
    expect(page.locator("#snap-origin")).to_have_text("Not a fork.")
    page.get_by_label("Name").fill("prepared")
    page.get_by_role("button", name="Take snapshot").click()
    row = page.locator("tr[data-snapshot]")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("prepared")
    sid = row.get_attribute("data-snapshot")
    assert sid and sid.startswith("snap-")

    row.get_by_label(f"Forks of {sid}").fill("2")
    row.get_by_role("button", name="Fork").click()
    tree = page.get_by_label("Fork tree")
    expect(tree.locator("a")).to_have_count(2)  # the two forks, links to their workspaces
    expect(row.locator("td[data-label=Forks]")).to_have_text("2")
    tab.shot("snapshots")

    # change the workspace, then restore: the preview first, nothing changed until Confirm
    service.call("snapw", "edit_file", "s-2", path="calc.py", old_str="a + b", new_str="a - b  # oops")
    row.get_by_role("button", name="Restore…").click()
    dialog = page.locator("dialog")
    expect(dialog).to_contain_text("Nothing has changed yet")
    expect(dialog.locator(".dl.add")).to_contain_text("return a + b")
    expect(dialog.locator(".dl.del")).to_contain_text("return a - b  # oops")
    tab.shot("restore-preview")
    assert "a - b" in (ws / "calc.py").read_text()
    dialog.get_by_role("button", name="Confirm").click()
    expect(dialog).to_contain_text("Restored.")
    expect(dialog.locator("code")).to_contain_text("restore_")
    assert (ws / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    dialog.get_by_role("button", name="Close").click()

    # a fork's own tab names where it came from
    fork = tree.locator("a").first
    fork_id = fork.inner_text()
    fork.click()
    expect(page).to_have_url(f"{service.url}/#/w/{fork_id}/snapshots")
    expect(page.locator("#snap-origin")).to_contain_text(f"Forked from snapshot {sid} of snapw")
    assert (service.root / fork_id / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"

    # deleting a snapshot with live forks asks, names them, and only then deletes
    page.goto(f"{service.url}/#/w/snapw/snapshots")
    page.locator("tr[data-snapshot]").get_by_role("button", name="Delete…").click()
    dialog.get_by_role("button", name="Delete", exact=True).click()
    expect(dialog).to_contain_text("Forks made from this snapshot still live")
    expect(dialog.locator("li")).to_have_count(2)
    tab.shot("delete-refused")
    dialog.get_by_role("button", name="Delete anyway").click()
    expect(page.get_by_text("No snapshots yet.")).to_be_visible()
    assert (service.root / fork_id / "calc.py").exists()  # the forks stay


def test_snapshots_on_a_phone(phone: Page, service: Service) -> None:  # noqa: F811 (fixtures)
    from playwright.sync_api import expect

    service.workspace("snapphone")
    service.call("snapphone", "write_file", "sp-1", path="a.py", content="a = 1\n")
    r = service.api.post("/v1/workspaces/snapphone/snapshots", json={"name": "base"})
    assert r.status_code == 201, r.text
    phone.sign_in()
    page = phone.page
    page.goto(f"{service.url}/#/w/snapphone/snapshots")
    expect(page.locator("tr[data-snapshot]")).to_contain_text("base")
    phone.shot("snapshots")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page is {width} px wide on a {PHONE['width']} px screen"
    page.locator("tr[data-snapshot]").get_by_role("button", name="Restore…").click()
    expect(page.locator("dialog")).to_contain_text("already as the snapshot")
    expect(page.locator("dialog").get_by_role("button", name="Confirm")).to_be_disabled()
