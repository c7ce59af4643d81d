"""Network egress by allowlist on the real engine, under runc and gVisor.

Every destination these tests dial is a package registry (PyPI, npm) or an address on this
machine; a test that shows a refusal picks one that is harmless if the gateway were wrong
(a registry not on the list, a registry's address as a literal, a name resolving to this
machine's loopback), and most refusals happen before anything is dialled at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.docker.conftest import own_registry
from worker.registry import ToolRegistry
from worker.workspace_settings import SettingsError

pytestmark = [pytest.mark.docker, pytest.mark.slow]
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
REGISTRY_IP = socket.gethostbyname("pypi.org")  # a registry's address (here: the proxy's)


@pytest.fixture(params=["runc", "runsc"])
async def registry(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path) -> AsyncIterator[ToolRegistry]:
    async with own_registry(tmp_path, request.param, ca_bundle=HOST_CA) as reg:
        yield reg


def workspace(tmp_path: Path, name: str) -> Path:
    ws = tmp_path / name
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    return ws


async def sh(registry: ToolRegistry, ws: Path, command: str, timeout: float = 120) -> dict[str, Any]:
    r = await registry.execute("shell_execute", {"command": command, "timeout": timeout}, workspace=str(ws))
    assert "error_kind" not in (r.data or {}), r.output
    return {"ok": r.success, "out": r.output, **(r.data or {})}


def log_of(registry: ToolRegistry, ws: Path, **match: object) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = registry.egress_status(ws, limit=1000)["entries"]
    return [e for e in entries if all(e.get(k) == v for k, v in match.items())]


async def logged(registry: ToolRegistry, ws: Path, timeout: float = 10.0, **match: object) -> list[dict[str, Any]]:
    """:func:`log_of`, waited for up to ``timeout`` seconds: the gateway logs a tunnel when
    it ends, which may be just after the client in the sandbox has its answer (a busy
    machine once showed an empty log right after curl's 200)."""
    for _ in range(int(timeout / 0.05)):
        if found := log_of(registry, ws, **match):
            return found
        await asyncio.sleep(0.05)
    return log_of(registry, ws, **match)


@pytest.fixture
def host_service() -> Iterator[int]:
    """An HTTP service on this machine's loopback (as the worker's own API would be)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"host secret")

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()


async def test_pip_and_npm_install_through_their_presets(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "proj")
    await registry.configure_workspace(ws, {"egress": ["pypi", "npm"]})
    r = await sh(registry, ws, "pip install --no-cache-dir --target deps six 2>&1 | tail -3", timeout=300)
    assert r["ok"] and "Successfully installed six" in r["out"], r["out"]
    assert (ws / "deps" / "six.py").is_file()
    r = await sh(registry, ws, "npm install --no-audit --no-fund --loglevel=error is-number 2>&1 | tail -3", 300)
    assert r["ok"], r["out"]
    assert (ws / "node_modules" / "is-number" / "package.json").is_file()
    hosts = {e["host"] for e in log_of(registry, ws, verdict="allowed")}
    assert {"pypi.org", "files.pythonhosted.org", "registry.npmjs.org"} <= hosts, hosts
    rec = log_of(registry, ws, verdict="allowed", host="files.pythonhosted.org")[0]
    assert rec["bytes_down"] > 10_000 and rec["address"] and rec["kind"] == "connect"


async def test_refusals_say_why_and_are_logged(registry: ToolRegistry, tmp_path: Path, host_service: int) -> None:
    ws = workspace(tmp_path, "proj")
    await registry.configure_workspace(ws, {"egress": ["pypi", "npm", f"localhost:{host_service}"]})
    curl = "curl -sS -o /dev/null -w '%{http_code}' --max-time 20"
    cases = {
        # a registry not on the list, over HTTPS and plain HTTP
        f"{curl} https://deb.debian.org/ 2>&1": ("deb.debian.org", "not on the allowlist"),
        "curl -sS -i --max-time 20 http://deb.debian.org/debian/ 2>&1": ("deb.debian.org", "not on the allowlist"),
        # a registry's address as a literal
        f"{curl} https://{REGISTRY_IP}/ 2>&1": (REGISTRY_IP, "IP address"),
        # an allowed name on a port not allowed
        f"{curl} https://pypi.org:8443/ 2>&1": ("pypi.org", "port 8443"),
        # a listed name that resolves to this machine's loopback, where a service listens
        f"{curl} --noproxy '' -x http://127.0.0.1:3128 http://localhost:{host_service}/ 2>&1": (
            "localhost",
            "loopback",
        ),
    }
    for command, (host, reason) in cases.items():
        r = await sh(registry, ws, command)
        assert "403" in r["out"] and "host secret" not in r["out"], (command, r["out"])
        recs = log_of(registry, ws, host=host, verdict="denied")
        assert any(reason in e["reason"] for e in recs), (command, recs)
    r = await sh(registry, ws, "curl -sS -i --max-time 20 http://deb.debian.org/debian/")
    assert "X-Loom-Egress: denied" in r["out"] and "allowlist" in r["out"], r["out"]


SNI_MISMATCH = """
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT registry.npmjs.org:443 HTTP/1.1\\r\\nHost: registry.npmjs.org:443\\r\\n\\r\\n")
print(s.recv(200).split(b"\\r\\n")[0].decode())
try:
    ssl.create_default_context().wrap_socket(s, server_hostname="pypi.org")
    print("handshake done")
except (ssl.SSLError, OSError) as e:
    print("refused:", e)
"""

IGNORES_PROXY = """
import socket
for kind, target in (("tcp", ("%s", 443)), ("udp", ("10.255.255.53", 53))):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(5)
    try:
        s.connect(target) if kind == "tcp" else s.sendto(b"\\x00" * 12, target)
        print(kind, "sent", s.recv(10) if kind == "tcp" else "")
    except OSError as e:
        print(kind, "failed", e.errno)
"""


async def test_fronting_raw_sockets_and_udp_reach_nothing(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "proj")
    await registry.configure_workspace(ws, {"egress": ["pypi", "npm"]})
    r = await sh(registry, ws, f"python3 -c {shlex.quote(SNI_MISMATCH)}")
    assert "200" in r["out"] and "refused" in r["out"] and "handshake done" not in r["out"], r["out"]
    recs = await logged(registry, ws, host="registry.npmjs.org", verdict="denied")
    assert any("pypi.org differs from registry.npmjs.org" in e["reason"] for e in recs), recs
    r = await sh(registry, ws, f"python3 -c {shlex.quote(IGNORES_PROXY % REGISTRY_IP)}")
    assert "tcp failed" in r["out"] and "udp failed" in r["out"], r["out"]  # no route: the network is unreachable
    # Lookups: only allowed names resolve (to the stub's loopback addresses), others fail at once.
    r = await sh(registry, ws, "getent hosts pypi.org; getent hosts deb.debian.org; echo rc=$?")
    assert r["out"].startswith("127.77.") and "deb.debian.org" not in r["out"] and "rc=2" in r["out"], r["out"]
    assert await logged(registry, ws, kind="dns", host="deb.debian.org", verdict="denied")
    # A program ignoring the proxy settings but using the resolver reaches an allowed name
    # (checked by its server name) and nothing else.
    r = await sh(registry, ws, "curl -sS --noproxy '*' -o /dev/null -w '%{http_code}' https://pypi.org/simple/six/")
    assert r["out"].endswith("200"), r["out"]
    assert await logged(registry, ws, kind="transparent", host="pypi.org", verdict="allowed")
    r = await sh(registry, ws, "curl -sS --noproxy '*' --max-time 10 https://deb.debian.org/ 2>&1; echo rc=$?")
    assert "rc=6" in r["out"], r["out"]  # could not resolve


async def test_no_policy_means_no_network_at_all(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "proj")
    r = await sh(
        registry,
        ws,
        "env | grep -ci proxy; ls /run/loom/egress 2>&1 | head -1; "
        "curl -sS --max-time 10 https://pypi.org/ 2>&1; echo rc=$?",
    )
    assert r["out"].splitlines()[0] == "0" and "No such file" in r["out"] and "rc=6" in r["out"], r["out"]
    assert registry.egress_status(ws)["entries"] == []


async def test_sandboxes_reach_neither_each_other_nor_the_worker(
    registry: ToolRegistry, tmp_path: Path, host_service: int
) -> None:
    a, b = workspace(tmp_path, "a"), workspace(tmp_path, "b")
    await registry.configure_workspace(a, {"egress": ["pypi"]})
    await registry.configure_workspace(b, {"egress": ["pypi"]})
    server = asyncio.create_task(sh(registry, b, "timeout 8 python3 -m http.server 8000 --bind 127.0.0.1", 30))
    await asyncio.sleep(3)
    probe = (
        "curl -sS --max-time 5 http://127.0.0.1:8000/ 2>&1 | head -1; "
        "curl -sS --max-time 5 -x http://127.0.0.1:3128 --noproxy '' http://127.0.0.1:8000/ 2>&1 | head -1; "
        f"curl -sS --max-time 5 http://127.0.0.1:{host_service}/ 2>&1 | head -1; "
        f"curl -sS --max-time 5 -x http://127.0.0.1:3128 --noproxy '' http://127.0.0.1:{host_service}/ | head -1; "
        "ls /run/loom/egress"
    )
    r = await sh(registry, a, probe)
    await server
    assert "Directory listing" not in r["out"] and "host secret" not in r["out"], r["out"]
    assert r["out"].count("Connection refused") + r["out"].count("Failed to connect") >= 2, r["out"]
    assert "IP address" in r["out"] or "Forbidden" in r["out"] or "403" in r["out"], r["out"]
    assert r["out"].split()[-2:] == ["resolv.conf", "s"], r["out"]  # its own socket only
    # Speaking to the gateway socket directly gains nothing: no administration, the same checks.
    r = await sh(
        registry,
        a,
        "python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('/run/loom/egress/s'); "
        "s.sendall(b'LOOM-EGRESS/1 admin\\\\n'); print('admin:', s.recv(100))\"",
    )
    assert "admin: b''" in r["out"], r["out"]


async def test_the_allowlist_changes_live_and_bad_entries_are_refused(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "proj")
    await registry.configure_workspace(ws, {"egress": ["pypi"]})
    fetch = "curl -sS -o /dev/null -w '%{http_code}' --max-time 20 https://registry.npmjs.org/is-number 2>&1"
    assert "403" in (await sh(registry, ws, fetch))["out"]
    client = docker.from_env()
    try:
        cid = client.containers.list(filters={"label": f"dev.loom.workspace={ws}"})[0].id
        done = await registry.configure_workspace(ws, {"egress": ["pypi", "npm"]})
        assert not done.changed and done.egress_changed and "at once" in done.message
        assert (await sh(registry, ws, fetch))["out"].endswith("200")
        assert client.containers.list(filters={"label": f"dev.loom.workspace={ws}"})[0].id == cid  # same sandbox
    finally:
        client.close()
    for bad in (["*"], ["*.com"], ["https://pypi.org"], ["pypi.org/simple"], ["a..b"]):
        with pytest.raises(SettingsError) as e:
            await registry.configure_workspace(ws, {"egress": ["npm", *bad]})
        assert e.value.field == "egress" and repr(bad[0]) in e.value.message
    assert registry.egress_status(ws)["policy"] == ["pypi", "npm"]
    print(json.dumps(registry.egress_status(ws, limit=3), indent=1)[:2000])
