"""E2B's JavaScript SDK (npm ``e2b``, pinned by js/package-lock.json, unchanged) against
loom on the real engine: ``js/round_trip.mjs`` creates a sandbox, runs a command
(``sbx.commands.run``), writes and reads a file back (``sbx.files``) and kills it; the
file is the workspace's, recorded in its changelog. The SDK is installed by
:mod:`tests.docker.e2b.npm` (Node >= 20.18.1 and npm needed)."""

from __future__ import annotations

import httpx
import pytest

from tests.docker.e2b.conftest import E2BServer
from tests.docker.e2b.npm import run_script

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def test_js_sdk_command_and_file_round_trip(e2b_server: E2BServer) -> None:
    report = run_script("round_trip.mjs")
    said = {name: step.get("error") for name, step in report.items() if not step["ok"]}

    # The sandbox's life: created (a workspace of its id), killed, then found no more.
    assert report["create"]["ok"], said
    sandbox_id = report["create"]["value"]["sandboxId"]
    assert e2b_server.workspace(sandbox_id).is_dir()
    assert report["kill"] == {"ok": True, "value": True}, said
    assert report["killAgain"] == {"ok": True, "value": False}, said

    # A command, with its environment; a file written and read back.
    assert report["command"]["ok"], said
    assert report["command"]["value"] == {"stdout": "hello from js\n", "stderr": "to-stderr\n", "exitCode": 0}
    assert report["write"] == {"ok": True, "value": {"path": "/home/user/from_js.txt", "name": "from_js.txt"}}, said
    assert report["read"] == {"ok": True, "value": "written by the JS SDK"}, said
    assert (e2b_server.workspace(sandbox_id) / "from_js.txt").read_text() == "written by the JS SDK"
    r = httpx.get(
        f"{e2b_server.url}/v1/workspaces/{sandbox_id}/changelog",
        params={"path": "from_js.txt"},
        headers={"Authorization": f"Bearer {e2b_server.token}"},
        timeout=60,
    )
    r.raise_for_status()
    assert [e["op"] for e in r.json()] == ["create"]
