"""Secrets added at the egress gateway, on the real engine under runc and gVisor.

Every destination is an HTTPS server of the test's own on a loopback address of this
machine, port 443 (``tests/origins.py``: an origin that records what it gets, and a git
forge, ``git http-backend`` behind Basic authentication), with certificates of a test CA
that only the gateway trusts (``LOOM_EGRESS_UPSTREAM_CA``; loopback is allowed by
``LOOM_EGRESS_TRUSTED_NETWORKS``, as for any test server). The gateway resolves the test
names to those addresses through a resolver of the test's (no real lookup is made); inside
the sandbox the stub resolver answers them as it answers any allowed name.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.docker.conftest import own_registry
from tests.origins import Net
from worker.registry import ToolRegistry

pytestmark = [pytest.mark.docker, pytest.mark.slow]
PLACEHOLDER = re.compile(r"loom-secret:[A-Z_]+:[0-9a-f]{32}")


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    n = Net.start(tmp_path)
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(params=["runc", "runsc"])
async def registry(request: pytest.FixtureRequest, docker_ready: None, tmp_path: Path, net: Net) -> AsyncIterator[Any]:
    async with own_registry(tmp_path, request.param, **net.settings(tmp_path)) as reg:
        net.resolve_for(reg)
        yield reg


def workspace(tmp_path: Path, name: str = "proj") -> Path:
    ws = tmp_path / name
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    return ws


async def sh(registry: ToolRegistry, ws: Path, command: str, timeout: float = 120) -> str:
    r = await registry.execute("shell_execute", {"command": command, "timeout": timeout}, workspace=str(ws))
    assert "error_kind" not in (r.data or {}), r.output
    return r.output


async def on_host(*argv: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, check=False)


async def log_until(
    registry: ToolRegistry, ws: Path, want: Callable[[list[dict[str, Any]]], bool], **match: object
) -> list[dict[str, Any]]:
    """The matching records once ``want`` holds of them (a connection is logged when the
    gateway is done with it, which may be just after the command that made it returned)."""
    for _ in range(100):
        recs = log_of(registry, ws, **match)
        if want(recs):
            break
        await asyncio.sleep(0.05)
    return recs


def log_of(registry: ToolRegistry, ws: Path, **match: object) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = registry.egress_status(ws, limit=1000)["entries"]
    return [e for e in entries if all(e.get(k) == v for k, v in match.items())]


def set_secret(registry: Any, ws: Path | None, name: str, value: str, **kw: Any) -> str:
    kw.setdefault("hosts", ["api.test"])
    if "query" not in kw:
        kw.setdefault("header", "Authorization: Bearer {value}")
    placeholder: str = registry.configs.secrets.store.set(ws, name, value=value, **kw).placeholder
    return placeholder


MEMORY_SCAN = r"""
import os, re, sys, urllib.request
req = urllib.request.Request("https://api.test/from-python", headers={"Authorization": "Bearer " + os.environ["TOKEN"]})
body = urllib.request.urlopen(req, timeout=20).read()
# Each needle comes in two halves (argv is in this memory too): a hit is the first half
# followed by the second, so the whole needle is never made here.
halves = [(a.encode(), b.encode()) for a, b in zip(sys.argv[1::2], sys.argv[2::2])]
found = {a: 0 for a, _ in halves}
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
        if not m:
            continue
        start, end = int(m.group(1), 16), int(m.group(2), 16)
        try:
            mem.seek(start)
            chunk = mem.read(end - start)
        except (OSError, ValueError, OverflowError):
            continue
        for a, b in halves:
            i = chunk.find(a)
            while i >= 0:
                found[a] += chunk.startswith(b, i + len(a))
                i = chunk.find(a, i + 1)
print("answer", body.decode().strip(), "memory", *(f"{n.decode()}={c}" for n, c in found.items()))
"""


async def test_the_secret_reaches_its_host_and_never_the_sandbox(registry: Any, net: Net, tmp_path: Path) -> None:
    value = "tok-" + uuid.uuid4().hex
    ws = workspace(tmp_path)
    await registry.configure_workspace(ws, {"egress": ["api.test", "other.test"]})
    placeholder = set_secret(registry, ws, "TOKEN", value)
    outputs = [await sh(registry, ws, 'printf "%s\\n" "$TOKEN"')]
    assert outputs[0].strip() == placeholder
    outputs.append(
        await sh(
            registry,
            ws,
            'curl -sS https://api.test/added; curl -sS -H "Authorization: Bearer $TOKEN" https://api.test/replaced; '
            "curl -sS --noproxy '*' https://api.test/direct",  # a program ignoring the proxy: by address
        )
    )
    assert outputs[-1].count("ok /") == 3, outputs[-1]
    for target in ("/added", "/replaced", "/direct"):
        seen = [s for s in net.seen("api.test") if s.target == target]
        assert seen and seen[0].header("authorization") == [f"Bearer {value}"], (target, seen)
    # The whole memory of a process that made an authenticated request holds the
    # placeholder and never the value (what a core dump could show) ...
    halves = " ".join(shlex.quote(x) for x in (value[:10], value[10:], placeholder[:10], placeholder[10:]))
    outputs.append(await sh(registry, ws, f"python3 -c {shlex.quote(MEMORY_SCAN)} {halves}"))
    assert "answer ok /from-python" in outputs[-1], outputs[-1]
    counts = dict(w.rsplit("=", 1) for w in outputs[-1].split("memory")[1].split())
    assert counts[value[:10]] == "0" and int(counts[placeholder[:10]]) > 0, outputs[-1]
    # ... and core dumps are off anyway; no environment, file or process of the sandbox has it.
    # (The pattern is the value written as a regular expression that is not the value
    # itself: the command searching must not hold it in its own arguments.)
    pattern = shlex.quote(f"{value[:4]}[{value[4]}]{value[5:]}")
    search = (
        "ulimit -Hc; env | grep -c loom-secret; "
        "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c loom-secret; "
        f"cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -c {pattern}; "
        f"grep -rls {pattern} /workspace /tmp /home /etc /run /var /root /proc/[0-9]*/environ; echo files-done"
    )
    outputs.append(await sh(registry, ws, search))
    lines = outputs[-1].split()
    assert lines[0] == "0" and int(lines[1]) >= 1 and int(lines[2]) >= 1 and lines[3] == "0", outputs[-1]
    assert lines[4:] == ["files-done"], outputs[-1]  # grep listed no file
    assert all(value not in out for out in outputs)
    assert (await on_host("grep", "-rqsF", value, str(ws))).returncode == 1  # nor the workspace, from the host
    paths = {"/added", "/replaced", "/direct", "/from-python"}
    uses = await log_until(
        registry, ws, lambda r: {u["path"] for u in r} >= paths, kind="secret", verdict="allowed", secret="TOKEN"
    )
    assert {u["path"] for u in uses} >= paths
    assert all(u["status"] == 200 and u["method"] == "GET" for u in uses)
    assert value not in str(registry.egress_status(ws, limit=1000))


async def test_placeholders_elsewhere_go_out_unchanged_and_are_logged(registry: Any, net: Net, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    await registry.configure_workspace(ws, {"egress": ["api.test", "other.test", "third.test", "plain.test"]})
    token = set_secret(registry, ws, "TOKEN", "tok-" + uuid.uuid4().hex)
    set_secret(registry, ws, "THIRD", "third-" + uuid.uuid4().hex, hosts=["third.test"], header="X-Api-Key: {}")
    out = await sh(
        registry,
        ws,
        # to an allowed host that carries no secret: a spliced tunnel, the gateway sees nothing
        # (it does not decrypt it: nothing to log, and the placeholder is worthless there)
        'curl -sS -H "Authorization: Bearer $TOKEN" https://other.test/o; '
        # to a host of another secret: intercepted there, TOKEN's placeholder is not for it
        'curl -sS -H "Authorization: Bearer $TOKEN" https://third.test/t; '
        # to its own host, but in the URL, the body and a header's name
        'curl -sS "https://api.test/u?token=$TOKEN" --data-binary "body=$TOKEN" -H "X-$TOKEN: 1"; '
        # over plain HTTP (read by the gateway, never given a secret)
        'curl -sS -H "Authorization: Bearer $TOKEN" http://plain.test/p',
    )
    assert out.count("ok /") == 4, out
    assert net.seen("plain.test")[-1].header("authorization") == [f"Bearer {token}"]
    assert net.seen("other.test")[-1].header("authorization") == [f"Bearer {token}"]
    third = net.seen("third.test")[-1]
    assert third.header("authorization") == [f"Bearer {token}"] and third.header("x-api-key") != []
    api = net.seen("api.test")[-1]
    assert api.target == f"/u?token={token}" and api.body == f"body={token}".encode()
    name, _, rest = token.partition(":")
    assert api.header(f"X-{name}") == [rest + ": 1"]  # the line as sent: a name cannot hold the placeholder
    recs = await log_until(registry, ws, lambda r: len(r) >= 4, kind="secret", verdict="denied", secret="TOKEN")
    denied = [e["reason"] for e in recs]
    assert any("third.test:443, not one of its hosts" in r for r in denied), denied
    assert any("plain.test:80, not one of its hosts" in r for r in denied), denied
    assert any("the URL" in r for r in denied) and any("the body" in r for r in denied), denied


async def test_git_clone_and_push_with_the_secret_and_refused_without(registry: Any, net: Net, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    await registry.configure_workspace(ws, {"egress": ["git.test"]})
    basic = "Authorization: Basic {git:value}"
    set_secret(registry, ws, "GIT_TOKEN", net.forge.password, hosts=["git.test"], header=basic)
    git = "git -c user.name=agent -c user.email=agent@sandbox"
    out = await sh(
        registry,
        ws,
        f"git clone -q https://git.test/repo.git clone 2>&1 && cd clone && cat README && echo change > new.txt && "
        f"git add new.txt && {git} commit -qm 'from the sandbox' && git push -q origin HEAD:main 2>&1 && echo pushed",
    )
    assert "hello from the forge" in out and out.strip().endswith("pushed"), out
    log = await on_host("git", "--git-dir", str(net.repo), "log", "--format=%s", "main")
    assert log.stdout.splitlines()[0] == "from the sandbox"
    # Nothing of the credential is left in the workspace (the placeholder is not a credential,
    # and it is not there either).
    assert (await on_host("grep", "-rqsF", net.forge.password, str(ws))).returncode == 1
    assert (await on_host("grep", "-rqs", "loom-secret", str(ws))).returncode == 1
    config = (ws / "clone" / ".git" / "config").read_text()
    assert "url = https://git.test/repo.git" in config and "@" not in config and "credential" not in config
    uses = await log_until(
        registry,
        ws,
        lambda r: any("receive-pack" in u["path"] for u in r),
        kind="secret",
        verdict="allowed",
        secret="GIT_TOKEN",
    )
    assert {u["method"] for u in uses} == {"GET", "POST"} and any("receive-pack" in u["path"] for u in uses)
    # Without the secret the forge refuses both.
    other = workspace(tmp_path, "other")
    await registry.configure_workspace(other, {"egress": ["git.test"]})
    refused = net.forge.refused
    out = await sh(registry, other, "git clone -q https://git.test/repo.git clone 2>&1; echo rc=$?")
    assert "rc=128" in out and ("Authentication failed" in out or "could not read Username" in out), out
    assert net.forge.refused > refused
    registry.configs.secrets.store.delete(ws, "GIT_TOKEN")
    out = await sh(
        registry,
        ws,
        "cd clone && echo again > more.txt && git add . && "
        f"{git} commit -qm again && git push -q origin HEAD:main 2>&1; echo rc=$?",
    )
    assert "rc=128" in out, out


async def test_without_the_gateways_ca_no_secret_and_other_hosts_are_not_intercepted(
    registry: Any, net: Net, tmp_path: Path
) -> None:
    ws = workspace(tmp_path)
    await registry.configure_workspace(ws, {"egress": ["api.test", "other.test"]})
    set_secret(registry, ws, "TOKEN", "tok-" + uuid.uuid4().hex)
    (ws / "origins-ca.pem").write_bytes(net.ca_file.read_bytes())  # the origins' own CA (public)
    before = len(net.seen("api.test"))
    out = await sh(
        registry,
        ws,
        # the image's own trust store, without the workspace CA
        "curl -sS --cacert /etc/ssl/certs/ca-certificates.crt https://api.test/a 2>&1; echo rc=$?; "
        # a bundle of its own in place of the sandbox's (here: the real origin's CA)
        'SSL_CERT_FILE=/workspace/origins-ca.pem python3 -c "import urllib.request as u; '
        "u.urlopen('https://api.test/b')\" 2>&1 | tail -1; "
        # the other host is not intercepted: its certificate is the origin's own, which that CA verifies
        "curl -sS --cacert /workspace/origins-ca.pem https://other.test/c; echo rc=$?; "
        "openssl s_client -proxy 127.0.0.1:3128 -connect other.test:443 -servername other.test </dev/null 2>/dev/null"
        " | grep -m1 '^issuer'; "
        "openssl s_client -proxy 127.0.0.1:3128 -connect api.test:443 -servername api.test </dev/null 2>/dev/null"
        " | grep -m1 '^issuer'",
    )
    assert "rc=60" in out and "CERTIFICATE_VERIFY_FAILED" in out, out
    assert "ok /c" in out and "rc=0" in out, out
    issuers = [line for line in out.splitlines() if line.startswith("issuer")]
    assert "trustme" in issuers[0] and "loom-worker secrets CA" in issuers[1], out
    assert len(net.seen("api.test")) == before  # nothing reached the secret's host
    refusals = await log_until(registry, ws, lambda r: len(r) >= 2, kind="connect", host="api.test", verdict="error")
    assert refusals and all("trust store" in e["reason"] for e in refusals)
    assert not log_of(registry, ws, kind="secret")
    spliced = await log_until(registry, ws, bool, kind="connect", host="other.test")
    assert spliced and all("intercepted" not in e["reason"] for e in spliced)


async def test_rotation_and_deletion_apply_to_the_next_request(registry: Any, net: Net, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    await registry.configure_workspace(ws, {"egress": ["api.test"]})
    placeholder = set_secret(registry, ws, "TOKEN", "first-" + uuid.uuid4().hex)
    set_secret(registry, ws, "KEEP", "keep-" + uuid.uuid4().hex, header="X-Keep: {value}")  # api.test stays intercepted
    assert "ok /1" in await sh(registry, ws, "curl -sS https://api.test/1")
    client = docker.from_env()
    try:
        ids = {c.id for c in client.containers.list(filters={"label": f"dev.loom.workspace={ws}"})}
        second = "second-" + uuid.uuid4().hex
        assert set_secret(registry, ws, "TOKEN", second) == placeholder  # the placeholder stays
        # a changed value: the same sandbox (nothing in it changed), the next request has it
        assert "ok /2" in await sh(registry, ws, 'curl -sS -H "Authorization: Bearer $TOKEN" https://api.test/2')
        assert {c.id for c in client.containers.list(filters={"label": f"dev.loom.workspace={ws}"})} == ids
    finally:
        client.close()
    assert net.seen("api.test")[-1].header("authorization") == [f"Bearer {second}"]
    registry.configs.secrets.store.delete(ws, "TOKEN")
    out = await sh(
        registry, ws, f'echo "[$TOKEN]"; curl -sS -H "Authorization: Bearer {placeholder}" https://api.test/3'
    )
    assert "[]" in out and "ok /3" in out, out  # the recreated sandbox has no $TOKEN
    assert net.seen("api.test")[-1].header("authorization") == [f"Bearer {placeholder}"]
    denied = await log_until(
        registry, ws, lambda r: any("no secret here (TOKEN)" in e["reason"] for e in r), kind="secret", verdict="denied"
    )
    assert any("no secret here (TOKEN)" in e["reason"] and e["secret"] is None for e in denied), denied
    # a process-wide default applies to every workspace that has none of its own
    default_value = "default-" + uuid.uuid4().hex
    set_secret(registry, None, "SHARED", default_value, header="X-Shared: {value}")
    assert "ok /4" in await sh(registry, ws, "curl -sS https://api.test/4")
    assert net.seen("api.test")[-1].header("x-shared") == [default_value]
    registry.configs.secrets.store.delete(None, "SHARED")
