"""API fuzzing with schemathesis against the service's own OpenAPI document: zero 5xx.

The service runs for real (uvicorn on loopback, the Docker sandbox backend, the changelog),
because fuzzed ``execute`` calls may reach ``shell_execute`` with arbitrary commands: they
must run in a sandbox, never on the host. Bounded for CI by ``LOOM_FUZZ_EXAMPLES``
(default 15 examples per operation). Most cases use a real workspace ("fuzz"), so tool
calls get past the 404 and reach the registry.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.conftest import SANDBOX_IMAGE, require_docker
from tests.servers import free_port
from worker.http import create_app
from worker.settings import Settings
from worker.snapshots import MAX_FORKS
from worker.workspace_settings import WorkspaceSettings

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TOKEN = "fuzz-token"
EXAMPLES = int(os.environ.get("LOOM_FUZZ_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_docker()
    root = tmp_path_factory.mktemp("fuzz-root")
    (root / "fuzz").mkdir()
    settings_ = Settings(
        workspace_root=root,
        data_dir=tmp_path_factory.mktemp("fuzz-data"),
        api_token=TOKEN,
        image=SANDBOX_IMAGE,
        max_body_bytes=256 * 1024,
        pull="never",  # fuzzed image names must not fetch anything (POST /v1/images/pull, settings)
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings_), host="127.0.0.1", port=port, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True  # its lifespan stops the sandboxes it started
        thread.join(60)


@pytest.fixture(scope="module")
def api_schema(base_url: str) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json")


def test_no_server_errors(api_schema: schemathesis.BaseSchema, base_url: str) -> None:
    # Hypothesis directly (schemathesis' pytest plugin does not support this pytest yet).
    seen: list[str] = []
    for result in api_schema.get_all_operations():
        op = result.ok()
        seen.append(f"{op.method.upper()} {op.path}")
        if op.path.endswith("/calls/stream") or op.path == "/v1/images/pulls":
            continue  # endless Server-Sent Events streams: test_http_calls.py, test_image_pull.py cover them

        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case: schemathesis.Case) -> None:
            params = case.path_parameters
            if params and "workspace_id" in params and case.method.upper() != "DELETE":
                params["workspace_id"] = "fuzz"
            body = case.body
            if case.path.endswith("/fork") and isinstance(body, dict) and _valid_many(body.get("count")):
                # A valid count forks (and starts) that many sandboxes: one fuzzed {"count": 37}
                # put ~115 gVisor sandboxes on CI's 2 cores and a request past 120 s, and so
                # did {"count": 44.0} (a whole float is a valid integer). Counts inside the
                # range become 1; those outside it still reach the 422.
                body["count"] = 1
            response = case.call(base_url=base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
            try:
                assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
                case.validate_response(response, checks=[not_a_server_error])
            finally:
                if case.path.endswith("/fork") and response.status_code == 201:
                    _remove_forks(base_url, response.json())
                if case.method.upper() in ("POST", "PUT", "PATCH"):
                    _end_started(base_url)

        run()
    assert "POST /v1/workspaces/{workspace_id}/execute" in seen
    assert "POST /v1/workspaces/{workspace_id}/execute/stream" in seen  # it ends: fuzzed like execute
    assert "POST /v1/workspaces/{workspace_id}/tool_calls" in seen


def _valid_many(count: object) -> bool:
    """Whether the service takes ``count`` as a number of forks above one: an int or a
    whole float (JSON Schema's integer, pydantic's lax int), or a string of one."""
    if isinstance(count, bool):
        return False
    try:
        n = float(count)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return False
    return n.is_integer() and 1 < n <= MAX_FORKS


def _remove_forks(base_url: str, forked: dict) -> None:
    """Remove a fuzzed fork's workspaces (and stop their sandboxes) at once: an overlay
    fork's sandbox starts with it (its tree shows on the host while it runs), and when a
    fuzzed setting had made "fuzz" a gVisor workspace, the forks of one run (more while
    Hypothesis shrinks a failure) were 73 idle gVisor sandboxes on CI's 2 cores (each
    costs CPU while idle: docs/sandbox.md), a load average of 350 and the test past its
    timeout."""
    for ws in forked.get("workspaces", []):
        r = httpx.delete(
            f"{base_url}/v1/workspaces/{ws['id']}",
            params={"delete_files": "true"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=120,
        )
        assert r.status_code == 200, r.text[:500]


def _end_started(base_url: str) -> None:
    """End what a fuzzed case left running in "fuzz": terminals (a login shell each),
    code contexts (a kernel and its threads each) and background processes (a fuzzed
    ``process_start``) are all valid requests that outlive them, and a run's worth of
    them, under a pids limit a fuzzed PATCH may have lowered, once filled the sandbox's
    process limit so the last test's ``echo`` could not fork. Each must end when asked."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    base = f"{base_url}/v1/workspaces/fuzz"
    ended: list[httpx.Response] = []
    with httpx.Client(headers=auth, timeout=120) as client:
        for t in _listed(client, f"{base}/terminals", "terminals"):
            if t["running"]:
                ended.append(client.delete(f"{base}/terminals/{t['id']}"))
        for c in _listed(client, f"{base}/code/contexts", "contexts"):
            ended.append(client.delete(f"{base}/code/contexts/{c['id']}"))
        for p in _listed(client, f"{base}/processes", "processes"):
            if p["running"]:
                ended.append(client.post(f"{base}/processes/{p['id']}/kill", json={"signal": "KILL"}))
    for r in ended:  # 404: it ended between the listing and the request
        assert r.status_code in (200, 204, 404), (r.request.method, r.request.url, r.text[:500])


_RUNNING = (("terminals", "terminals"), ("code/contexts", "contexts"), ("processes", "processes"))


def _listed(client: httpx.Client, url: str, key: str) -> list[dict]:
    r = client.get(url)
    if r.status_code == 404:  # a fuzzed DELETE removed "fuzz"
        return []
    assert r.status_code == 200, (url, r.text[:500])
    return list(r.json()[key])


def test_fuzzed_workspace_still_answers(base_url: str) -> None:
    with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client:
        # Fuzzed PATCHes may have left "fuzz" any valid settings (a pids limit of 16, a tenth
        # of a CPU, an image this machine lacks): back to the defaults, then it must answer.
        reset = client.patch(f"{base_url}/v1/workspaces/fuzz", json=dict.fromkeys(WorkspaceSettings.model_fields))
        assert reset.status_code in (200, 404), reset.text[:500]  # 404: a fuzzed DELETE removed it
        r = client.post(
            f"{base_url}/v1/workspaces/fuzz/execute",
            json={"tool": "shell_execute", "arguments": {"command": "echo alive"}},
        )
        assert r.status_code == reset.status_code, r.text[:500]
        if r.status_code == 200:
            left = {  # what still runs there, should it not answer
                key: _listed(client, f"{base_url}/v1/workspaces/fuzz/{where}", key) for where, key in _RUNNING
            }
            assert "alive" in r.json()["output"], (r.json(), left)
