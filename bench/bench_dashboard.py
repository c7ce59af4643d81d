"""Dashboard benchmark: from a tool call finishing to its row in an open dashboard, and
the bytes of the dashboard's first load.

Starts the real service (``loom-worker serve``, Docker backend, changelog and call
journal on) and Debian's chromium (Playwright, headless) on the workspace's timeline.
Then, 0.2 s apart:

- ``--calls`` calls through the service's HTTP API (the stream is woken by the write);
- ``--other`` calls by **another process** (this script's own registry on the same data
  directory, as the CLI or the Python API would make them: the stream finds them by
  polling the journal).

For each call, the time it finished is the journal's ``ts`` (written by the registry as
the call returns); the row's time is taken in the page, on the first animation frame
after the row is inserted (a MutationObserver, then requestAnimationFrame: when it can
be painted). The same-run baseline is a plain SSE client (``httpx``, as ``curl -N``)
reading the same stream: the browser's share is the difference.

First load: a new browser context (empty cache) signs in and opens a timeline of 100
calls; every response's encoded size (headers included) is summed, assets and API
answers apart.

    .venv/bin/python bench/bench_dashboard.py [--calls 100] [--other 30]

Targets (issue 19): row p50 <= 200 ms; first load <= 300 KB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from common import free_port

CHROMIUM = os.environ.get("LOOM_TEST_CHROMIUM", "/usr/bin/chromium")

# Installed before any page script: the time each call's row can first be painted.
OBSERVER = """
window.__rows = {};
new MutationObserver((records) => {
  for (const r of records) for (const n of r.addedNodes) {
    if (n.nodeType === 1 && n.matches('tr.call') && n.dataset.callId && !(n.dataset.callId in window.__rows)) {
      const id = n.dataset.callId;
      window.__rows[id] = null;
      requestAnimationFrame(() => { window.__rows[id] = performance.timeOrigin + performance.now(); });
    }
  }
}).observe(document, {childList: true, subtree: true});
"""


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def row(label: str, xs: list[float], target: str = "") -> str:
    return f"| {label} | {len(xs)} | {statistics.median(xs):.1f} | {pct(xs, 0.9):.1f} | {max(xs):.1f} | {target} |"


class RawStream:
    """A plain SSE client on the calls stream (the baseline): call_id -> arrival (s)."""

    def __init__(self, base: str, headers: dict[str, str], ws: str) -> None:
        self.seen: dict[str, float] = {}
        self.ready = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(base, headers, ws), daemon=True)
        self._thread.start()
        self.ready.wait(30)

    def _run(self, base: str, headers: dict[str, str], ws: str) -> None:
        try:
            with httpx.Client(base_url=base, headers=headers, timeout=None) as c:
                with c.stream("GET", f"/v1/workspaces/{ws}/calls/stream") as r:
                    self.ready.set()
                    for line in r.iter_lines():
                        if self._stop:
                            return
                        if line.startswith("data: "):
                            self.seen.setdefault(json.loads(line[6:])["call_id"], time.time())
        except httpx.TransportError:
            pass  # the service stopped at the end of the run

    def stop(self) -> None:
        self._stop = True


def other_process_calls(settings: Any, ws: Path, n: int, gap: float) -> list[str]:
    """``n`` calls by this process's own registry (another process than the service)."""
    from worker.registry import default_registry

    async def go() -> list[str]:
        ids = []
        async with default_registry(settings, catalog=False) as reg:
            for i in range(n):
                cid = f"other-{i}-{secrets.token_hex(3)}"
                r = await reg.execute("write_file", {"path": f"other/{i}.txt", "content": f"{i}\n"}, ws, call_id=cid)
                assert r.success, r.error
                ids.append(cid)
                await asyncio.sleep(gap)
        return ids

    return asyncio.run(go())


def main() -> int:
    import logging

    import structlog

    # this script's own registry (the "other process") would print every call
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--other", type=int, default=30)
    ap.add_argument("--gap", type=float, default=0.2, help="seconds between calls")
    ap.add_argument("--image", default=os.environ.get("LOOM_IMAGE", "loom-sandbox:latest"))
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from worker.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-dash-")).resolve()
    token = secrets.token_urlsafe(16)
    port = free_port()
    env = {
        **os.environ,
        "LOOM_WORKSPACE_ROOT": str(tmp / "ws"),
        "LOOM_DATA_DIR": str(tmp / "data"),
        "LOOM_API_TOKEN": token,
        "LOOM_PORT": str(port),
        "LOOM_LOG_FORMAT": "json",
        "LOOM_LOG_LEVEL": "warning",
        "LOOM_CATALOG": "false",
        "LOOM_IMAGE": args.image,
    }
    loom = str(Path(sys.executable).with_name("loom-worker"))
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([loom, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}"}
    api = httpx.Client(base_url=base, headers=headers, timeout=120)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if api.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"service did not start; see {tmp / 'server.log'}")
            time.sleep(0.1)
        ws = Path(api.post("/v1/workspaces", json={"name": "bench"}).json()["path"])

        def call(cid: str, i: int) -> None:
            body = (
                {"tool": "write_file", "arguments": {"path": f"f{i % 10}.txt", "content": f"{i}\n"}}
                if i % 2
                else {"tool": "shell_execute", "arguments": {"command": f"echo {i} > s.txt"}}
            )
            r = api.post("/v1/workspaces/bench/execute", json={**body, "call_id": cid})
            assert r.status_code == 200 and r.json()["success"], r.text

        for i in range(100):  # a realistic timeline for the first load (and a warm sandbox)
            call(f"warm-{i}", i)

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            # -- first load: empty cache, sign in, the timeline of 100 calls -------------------
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            sizes: list[tuple[str, int]] = []
            cdp = ctx.new_cdp_session(page)
            cdp.send("Network.enable")
            urls: dict[str, str] = {}
            cdp.on("Network.requestWillBeSent", lambda e: urls.__setitem__(e["requestId"], e["request"]["url"]))
            cdp.on(
                "Network.loadingFinished",
                lambda e: sizes.append((urls.get(e["requestId"], "?"), int(e["encodedDataLength"]))),
            )
            page.goto(base + "/")
            page.get_by_label("API token").fill(token)
            page.get_by_role("button", name="Sign in").click()
            page.get_by_role("link", name="bench").click()
            page.locator('tr.call[data-call-id="warm-99"]').wait_for()
            page.get_by_role("status").filter(has_text="Live").wait_for()
            time.sleep(1.0)  # (never "network idle": the calls stream stays open; its few bytes are not counted)
            assets = sum(n for u, n in sizes if "/v1/" not in u)
            api_bytes = sum(n for u, n in sizes if "/v1/" in u)
            n_assets = sum(1 for u, _ in sizes if "/v1/" not in u)
            ctx.close()

            # -- latency: call finished -> row paintable ---------------------------------------
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})
            ctx.add_init_script(OBSERVER)
            page = ctx.new_page()
            page.goto(base + "/")
            page.get_by_label("API token").fill(token)
            page.get_by_role("button", name="Sign in").click()
            page.goto(f"{base}/#/w/bench/timeline")
            page.get_by_role("status").filter(has_text="Live").wait_for()
            raw = RawStream(base, headers, "bench")
            ids = []
            for i in range(args.calls):
                cid = f"api-{i}"
                call(cid, i)
                ids.append(cid)
                time.sleep(args.gap)
            settings = Settings(data_dir=tmp / "data", image=args.image, catalog=False)
            result: dict[str, list[str]] = {}
            t = threading.Thread(
                target=lambda: result.__setitem__("ids", other_process_calls(settings, ws, args.other, args.gap))
            )
            t.start()
            t.join()
            others = result["ids"]
            page.locator(f'tr.call[data-call-id="{others[-1]}"]').wait_for()
            time.sleep(0.5)
            rows_at: dict[str, float | None] = page.evaluate("window.__rows")
            raw.stop()
            ctx.close()
            browser.close()

        finished: dict[str, float] = {}
        before = None
        while True:
            params = {"limit": 500} if before is None else {"limit": 500, "before": before}
            pg = api.get("/v1/workspaces/bench/calls", params=params).json()
            for c in pg["calls"]:
                finished[c["call_id"]] = c["ts"]
            before = pg["next"]
            if before is None:
                break

        def lat(ids_: list[str], seen: dict[str, Any], scale: float) -> list[float]:
            out = []
            for cid in ids_:
                at = seen.get(cid)
                if at is None:
                    raise SystemExit(f"call {cid} never reached the dashboard or the stream")
                out.append((at / scale - finished[cid]) * 1000)
            return out

        print(f"\nservice: loom-worker serve (Docker, {args.image}); chromium {CHROMIUM}; calls {args.gap} s apart\n")
        print("| call finished -> | n | p50 ms | p90 ms | max ms | target |")
        print("|---|---|---|---|---|---|")
        print(row("row paintable in the dashboard (calls through the service)", lat(ids, rows_at, 1000), "p50 <= 200"))
        print(row("  baseline: event at a plain SSE client (same calls)", lat(ids, raw.seen, 1)))
        print(
            row("row paintable in the dashboard (calls by another process)", lat(others, rows_at, 1000), "p50 <= 200")
        )
        print(row("  baseline: event at a plain SSE client (same calls)", lat(others, raw.seen, 1)))
        print()
        print("| first load (empty cache, sign in, a timeline of 100 calls) | bytes | target |")
        print("|---|---|---|")
        print(f"| static assets ({n_assets} responses, headers included) | {assets:,} | |")
        print(f"| API answers | {api_bytes:,} | |")
        print(f"| total | {assets + api_bytes:,} | <= 300,000 |")
        return 0
    finally:
        api.close()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
