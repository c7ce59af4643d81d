"""Executions of code in the dashboard, in a real browser (Debian's chromium through
Playwright, the service in process on the real Docker backend; fixtures of
test_dashboard.py): a ``run_code`` call's chart is in the timeline (the image loads, at the
figure's size), a DataFrame's HTML renders in a sandboxed frame whose script never runs
and never reaches the page, stdout and the error show as text; and on a phone."""

from __future__ import annotations

from typing import Any

import pytest

# The module-scoped service and browser of the dashboard's tests, shared.
from tests.e2e.test_dashboard import Page, Service, browser, phone, service, tab  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.timeout(300)]

CHART = (
    "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
    "import matplotlib.pyplot as plt\n"
    "print('drawing')\n"
    "fig = plt.figure(figsize=(4, 3), dpi=100)\n"
    "_ = plt.plot([1, 3, 2])\n"
)
# A DataFrame, and HTML that tries to reach the page: a script, a handler, a style.
TABLE = (
    "import pandas as pd\n"
    "from IPython.display import HTML, display\n"
    'display(HTML(\'<p id="hostile" onclick="alert(1)">hi</p><script>parent.document.title = "owned";'
    ' alert(2)</script><img src=x onerror="alert(3)">\'))\n'
    "pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [4, 19]})\n"
)


def image_state(page: Any, selector: str) -> dict[str, Any]:
    state: dict[str, Any] = page.eval_on_selector(
        selector,
        "img => ({complete: img.complete, w: img.naturalWidth, h: img.naturalHeight, src: img.src.slice(0, 22)})",
    )
    return state


def test_a_chart_and_a_table_from_run_code_in_the_timeline(tab: Page, service: Service) -> None:  # noqa: F811
    from playwright.sync_api import expect

    service.workspace("codew")
    r = service.call("codew", "run_code", "chart-1", code=CHART)
    assert r["success"] and r["images"][0]["width"] == 400, r["output"]
    r = service.call("codew", "run_code", "table-1", code=TABLE)
    assert r["success"], r["output"]
    r = service.call("codew", "run_code", "error-1", code="1/0")
    assert not r["success"]
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/codew/timeline")

    chart = page.locator("tr.outputs-row[data-call-id='chart-1']")
    expect(chart.locator("pre.out-text.stdout")).to_have_text("drawing\n")
    img = chart.locator("img.out-image")
    expect(img).to_have_count(1)
    page.wait_for_function("document.querySelector(\"tr[data-call-id='chart-1'] img.out-image\").complete")
    assert image_state(page, "tr[data-call-id='chart-1'] img.out-image") == {
        "complete": True,
        "w": 400,
        "h": 300,
        "src": "data:image/png;base64,",
    }

    table = page.locator("tr.outputs-row[data-call-id='table-1']")
    frames = table.locator("iframe.out-html")
    expect(frames).to_have_count(2)  # the HTML display, then the DataFrame
    for i in range(2):
        assert frames.nth(i).get_attribute("sandbox") == ""  # no allow-scripts, an opaque origin
    df = table.frame_locator("iframe.out-html >> nth=1")
    expect(df.locator("td")).to_have_text(["Oslo", "4", "Lima", "19"])
    hostile = table.frame_locator("iframe.out-html >> nth=0")
    expect(hostile.locator("#hostile")).to_have_text("hi")
    hostile.locator("#hostile").click()  # its onclick is gone, and could not run anyway
    assert page.title() == "loom-worker"
    assert table.locator("iframe.out-html").first.get_attribute("srcdoc").count("script") == 0  # type: ignore[union-attr]
    # the page itself never got the markup
    assert page.locator("#hostile").count() == 0 and page.locator("main script").count() == 0

    error = page.locator("tr.outputs-row[data-call-id='error-1'] pre.out-error")
    expect(error).to_contain_text("ZeroDivisionError: division by zero")
    tab.shot("timeline-code")


def test_a_chart_on_a_phone(phone: Page, service: Service) -> None:  # noqa: F811
    from playwright.sync_api import expect

    service.workspace("codephone")
    service.call("codephone", "run_code", "phone-chart", code=CHART)
    phone.sign_in()
    page = phone.page
    page.goto(f"{service.url}/#/w/codephone/timeline")
    img = page.locator("tr[data-call-id='phone-chart'] img.out-image")
    expect(img).to_be_visible()
    box = img.bounding_box()
    assert box is not None and box["width"] <= 390 and box["width"] / box["height"] == pytest.approx(4 / 3, 0.02)
    phone.shot("timeline-code")


def test_the_code_tab_runs_cells_in_a_kernel_that_keeps_its_state(tab: Page, service: Service) -> None:  # noqa: F811
    from playwright.sync_api import expect

    ws = service.workspace("notebook")
    tab.sign_in()
    page = tab.page
    page.goto(f"{service.url}/#/w/notebook/code")
    code = page.get_by_label("Code (runs in")
    run = page.get_by_role("button", name="Run", exact=True)
    cells = page.locator("article.cell")

    code.fill("a = 6 * 7")
    run.click()
    expect(cells.nth(0).locator(".cell-status")).to_contain_text("Done")
    code.fill("print('the answer')\na")
    code.press("Control+Enter")
    second = cells.nth(1)
    expect(second.locator("pre.out-text.stdout")).to_have_text("the answer\n")
    expect(second.locator(".out-result")).to_contain_text("42")
    expect(second.locator(".out-prompt").last).to_have_text("Out[2]:")
    expect(second.locator(".cell-in .out-prompt")).to_have_text("In [2]:")

    # output arrives while the cell runs: it waits for a file the test makes
    code.fill(
        "import os, time\nprint('waiting', flush=True)\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\n'went'"
    )
    run.click()
    third = cells.nth(2)
    expect(third.locator("pre.out-text.stdout")).to_have_text("waiting\n")
    expect(third.locator(".cell-status")).to_contain_text("Running")
    (ws / "go").write_text("")
    expect(third.locator(".out-result")).to_contain_text("'went'")

    code.fill(CHART)
    run.click()
    img = cells.nth(3).locator("img.out-image")
    expect(img).to_be_visible()
    assert image_state(page, "article.cell:nth-of-type(4) img.out-image")["w"] == 400

    code.fill("1/0")
    run.click()
    expect(cells.nth(4).locator("pre.out-error")).to_contain_text("ZeroDivisionError: division by zero")
    expect(cells.nth(4).locator(".cell-status")).to_contain_text("ZeroDivisionError")

    # a new context has its own state; the default one (the model's too) keeps 'a'
    page.get_by_role("button", name="New context").click()
    expect(page.locator("#code-context option")).to_have_count(2)
    expect(page.locator("#code-context")).not_to_have_value("")
    code.fill("'a' in dir()")
    run.click()
    expect(cells.nth(5).locator(".out-result")).to_contain_text("False")
    r = service.call("notebook", "run_code", "model-1", code="a")
    assert r["success"] and r["output"].endswith(": 42"), r["output"]

    tab.shot("code-cells")

    # each run is in the timeline with its outputs
    page.get_by_role("tab", name="Timeline").click()
    chart_row = page.locator("tr.outputs-row img.out-image")
    expect(chart_row).to_have_count(1)
    expect(page.locator("tr.call", has_text="sandbox.run_code")).to_have_count(6)
    tab.shot("code-tab")
