"""``docker compose up`` end to end (testcontainers' DockerCompose).

Brings up compose.yaml (images built with the classic builder from the offline base and a
host-built wheelhouse), plays a scripted agent session over HTTP through ``tool_calls``:
write a small Python project, run its tests in the sandbox, fix the bug with ``edit_file``,
run again, undo; asserts every result; tears down and checks that no sandbox container of
this run is left behind.

Workspace paths are the same inside and outside the worker container: the test reads on
the host, at the path the API reports, the files the sandbox wrote.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import require_docker
from tests.servers import free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SECRET_MARKER = "sekret-file-content-" + secrets.token_hex(4)


def sandboxes_for(root: Path) -> list[str]:
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            "label=dev.loom.worker=1",
            "--format",
            '{{.Names}} {{.Label "dev.loom.workspace"}}',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if str(root) in line]


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)

    def tool_calls(self, ws: str, *calls: tuple[str, str, dict[str, Any] | str]) -> list[str]:
        body = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
            for cid, name, args in calls
        ]
        r = self.http.post(f"/v1/workspaces/{ws}/tool_calls", json=body)
        assert r.status_code == 200, r.text
        msgs = r.json()
        assert [m["tool_call_id"] for m in msgs] == [c[0] for c in calls]
        assert all(m["role"] == "tool" for m in msgs)
        return [m["content"] for m in msgs]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Path, Any]]:
    require_docker()
    from testcontainers.compose import DockerCompose

    env = {**os.environ, "LOOM_SKIP_ENV": "1"}
    subprocess.run([str(REPO / "scripts/compose-setup.sh")], cwd=REPO, env=env, check=True, capture_output=True)
    root = tmp_path_factory.mktemp("compose-ws").resolve()
    token = secrets.token_urlsafe(16)
    port = free_port()
    env_file = root.parent / "compose-e2e.env"
    env_file.write_text(
        f"LOOM_API_TOKEN={token}\nLOOM_WORKSPACE_ROOT={root}\nLOOM_PORT={port}\nLOOM_UID=1000\nLOOM_GID=1000\n"
        f"LOOM_EGRESS_DIR={root.parent / 'egress'}\n"
    )
    # A project name of our own, so a developer's `docker compose up` is never touched;
    # the classic builder, because this engine has no buildx.
    saved = {k: os.environ.get(k) for k in ("COMPOSE_PROJECT_NAME", "COMPOSE_DOCKER_CLI_BUILD", "DOCKER_BUILDKIT")}
    os.environ.update(
        COMPOSE_PROJECT_NAME=f"loom-e2e-{secrets.token_hex(3)}", COMPOSE_DOCKER_CLI_BUILD="0", DOCKER_BUILDKIT="0"
    )
    compose = DockerCompose(str(REPO), compose_file_name="compose.yaml", build=True, wait=True, env_file=str(env_file))
    try:
        compose.start()
        yield Api(f"http://127.0.0.1:{port}", token), root, compose
    finally:
        try:
            compose.stop()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            leftover = sandboxes_for(root)
            for line in leftover:  # clean up even when the assertion below fails
                subprocess.run(["docker", "rm", "-f", line.split()[0]], capture_output=True)
            assert leftover == [], f"sandbox containers left behind: {leftover}"


# -B: an edit that keeps the size, within the same second, leaves a stale .pyc that
# Python would trust (mtime+size check); see docs/service.md.
RUN_TESTS = "python3 -B test_calc.py"
CALC = "def add(a, b):\n    return a - b\n"
TESTS = (
    "from calc import add\n"
    f"# {SECRET_MARKER}\n"
    "assert add(2, 3) == 5, f'add(2, 3) = {add(2, 3)}'\n"
    "print('all tests passed')\n"
)


def test_scripted_agent_session(stack: tuple[Api, Path, Any]) -> None:
    api, root, compose = stack
    assert api.http.get("/healthz").json()["status"] == "ok"
    assert api.http.get("/v1/tools", headers={"Authorization": "Bearer wrong"}).status_code == 401

    r = api.http.post("/v1/workspaces", json={"name": "proj"})
    assert r.status_code == 201, r.text
    ws_path = Path(r.json()["path"])
    assert ws_path == root / "proj"  # the same absolute path inside the worker and on the host

    out = api.tool_calls(
        "proj",
        ("c1", "write_file", {"path": "calc.py", "content": CALC}),
        ("c2", "write_file", {"path": "test_calc.py", "content": TESTS}),
        ("c3", "shell_execute", {"command": RUN_TESTS}),
        ("c4", "read_file", '{"path": "calc.py"'),  # malformed JSON from the model
    )
    assert "calc.py" in out[0] and "test_calc.py" in out[1]
    assert "add(2, 3) = -1" in out[2] and "AssertionError" in out[2]
    assert "not valid JSON" in out[3]
    # The sandbox's bind mount resolved on the host: the files are where the API said.
    assert (ws_path / "calc.py").read_text() == CALC

    out = api.tool_calls(
        "proj",
        ("fix", "edit_file", {"path": "calc.py", "old_str": "a - b", "new_str": "a + b"}),
        ("c6", "shell_execute", {"command": RUN_TESTS}),
        ("c7", "search_files", {"pattern": "return a"}),
        ("c8", "list_directory", {}),
    )
    assert "a + b" in out[0]
    assert "all tests passed" in out[1]
    assert "calc.py:2:" in out[2]
    assert "test_calc.py" in out[3]
    assert (ws_path / "calc.py").read_text() == CALC.replace("a - b", "a + b")

    log = api.http.get("/v1/workspaces/proj/changelog").json()
    assert [e["call_id"] for e in log][:3] == ["c1", "c2", "fix"]
    r = api.http.post("/v1/workspaces/proj/undo", json={"call_id": "fix"})
    assert r.status_code == 200, r.text
    assert [s["status"] for s in r.json()["steps"]] == ["reverted"]
    assert (ws_path / "calc.py").read_text() == CALC
    out = api.tool_calls("proj", ("c9", "shell_execute", {"command": RUN_TESTS}))
    assert "AssertionError" in out[0]

    metrics = api.http.get("/metrics").text
    assert 'loom_tool_calls_total{outcome="ok",tool="edit_file"} 1.0' in metrics
    assert "loom_sandboxes_live 1.0" in metrics
    assert len(sandboxes_for(root)) == 1

    # Structured JSON logs: every call with workspace, tool, call id; never file contents.
    stdout, stderr = compose.get_logs("worker")
    lines = [json.loads(x.split("|", 1)[-1]) for x in (stdout + stderr).splitlines() if "{" in x]
    calls = [x for x in lines if x.get("event") == "tool.call"]
    assert {"c1", "c3", "fix", "c9"} <= {x["call_id"] for x in calls}
    assert all(x["workspace"] == str(ws_path) and "duration_ms" in x for x in calls)
    assert SECRET_MARKER not in stdout + stderr
    assert stack[0].http.headers["Authorization"].split()[1] not in stdout + stderr


def test_delete_workspace_stops_its_sandbox(stack: tuple[Api, Path, Any]) -> None:
    api, root, _ = stack
    assert api.http.post("/v1/workspaces", json={"name": "tmp1"}).status_code == 201
    assert "hello" in api.tool_calls("tmp1", ("x", "shell_execute", {"command": "echo hello"}))[0]
    assert any("tmp1" in line for line in sandboxes_for(root))
    r = api.http.delete("/v1/workspaces/tmp1", params={"delete_files": "true"})
    assert r.status_code == 200 and r.json()["sandbox_stopped"] is True
    deadline = time.monotonic() + 30
    while any("tmp1" in line for line in sandboxes_for(root)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any("tmp1" in line for line in sandboxes_for(root))
    assert not (root / "tmp1").exists()


def test_the_dashboard_and_the_call_history_under_compose(stack: tuple[Api, Path, Any]) -> None:
    api, _root, _ = stack
    page = httpx.get(api.http.base_url.join("/"), timeout=30)  # no token: the page holds no data
    assert page.status_code == 200 and '<script type="module" src="/ui/js/main.js">' in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert httpx.get(api.http.base_url.join("/ui/js/main.js"), timeout=30).status_code == 200
    assert api.http.post("/v1/workspaces", json={"name": "dash"}).status_code == 201
    api.tool_calls("dash", ("d1", "write_file", {"path": "a.txt", "content": "x"}), ("d2", "list_directory", {}))
    calls = api.http.get("/v1/workspaces/dash/calls").json()["calls"]
    assert [c["call_id"] for c in calls] == ["d2", "d1"] and calls[1]["files_changed"] == ["a.txt"]
    diff = api.http.get("/v1/workspaces/dash/changelog/diff", params={"call_id": "d1"}).json()["diff"]
    assert "+x" in diff
    # a cross-site write is refused, whatever token it carries
    r = api.http.post("/v1/workspaces", json={"name": "csrf"}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403


def test_egress_under_compose(stack: tuple[Api, Path, Any]) -> None:
    """The worker is a container: its gateway's socket, in LOOM_EGRESS_DIR (the same path
    on the host), is what the sandbox it starts mounts."""
    api, _root, _ = stack
    settings = {"egress": ["pypi"], "ca_bundle": "/etc/ssl/certs/ca-certificates.crt"}
    assert api.http.post("/v1/workspaces", json={"name": "net", "settings": settings}).status_code == 201
    curl = "curl -sS -o /dev/null -w '%{http_code}' --max-time 30"
    out = api.tool_calls(
        "net",
        ("n1", "shell_execute", {"command": f"{curl} https://pypi.org/simple/six/"}),
        ("n2", "shell_execute", {"command": f"{curl} https://deb.debian.org/ 2>&1"}),
    )
    assert out[0].strip().endswith("200"), out[0]
    assert "403" in out[1], out[1]
    status = api.http.get("/v1/workspaces/net/egress").json()
    assert status["policy"] == ["pypi"] and status["serving"] is True
    verdicts = {(e["host"], e["verdict"]) for e in status["entries"]}
    assert ("pypi.org", "allowed") in verdicts and ("deb.debian.org", "denied") in verdicts
    r = api.http.patch("/v1/workspaces/net", json={"egress": ["*.com"]})
    assert r.status_code == 422 and "*.com" in r.json()["detail"][0]["msg"]


def test_output_streams_and_the_port_proxy_under_compose(stack: tuple[Api, Path, Any]) -> None:
    """The worker in its container reaches a sandbox only through the engine's attach
    stream: the execute stream and the port proxy go that way."""
    import threading

    api, root, _ = stack
    assert api.http.post("/v1/workspaces", json={"name": "srv"}).status_code == 201
    api.tool_calls("srv", ("w", "write_file", {"path": "index.html", "content": "served from the sandbox\n"}))
    out = api.tool_calls(
        "srv", ("bg", "shell_execute", {"command": "python3 -m http.server 8000 --bind 127.0.0.1", "background": True})
    )
    assert "background process" in out[0], out[0]
    # A streamed call that outlives the checks below (until the host creates `stop`).
    command = "echo started; while [ ! -e stop ]; do sleep 0.1; done; echo stopping"
    body = {"tool": "shell_execute", "arguments": {"command": command, "timeout": 120}}
    events: list[tuple[str, str]] = []
    started = threading.Event()

    def stream() -> None:
        with api.http.stream("POST", "/v1/workspaces/srv/execute/stream", json=body) as r:
            assert r.status_code == 200
            event = ""
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    events.append((event, line[5:].strip()))
                    if event == "output":
                        started.set()

    t = threading.Thread(target=stream)
    t.start()
    try:
        assert started.wait(120), events  # the line came while the command still runs
        url = "/v1/workspaces/srv/ports/8000/index.html"
        deadline = time.monotonic() + 60
        while True:
            r = api.http.get(url)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200 and r.text == "served from the sandbox\n", r.text
        anon = httpx.get(api.http.base_url.join(url), timeout=30)
        assert anon.status_code == 401 and anon.headers["www-authenticate"].startswith("Basic")
        token = api.http.headers["Authorization"].split()[1]
        basic = httpx.get(api.http.base_url.join(url), auth=("me", token), timeout=30)
        assert basic.status_code == 200
    finally:
        (root / "srv" / "stop").touch()
        t.join(120)
    assert [e for e, _ in events] == ["output", "output", "result"], events
    assert json.loads(events[-1][1])["success"] is True
