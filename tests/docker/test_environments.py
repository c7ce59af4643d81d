"""Real project environments on the real engine: per-workspace settings (image, limits,
env, CA bundle) applied, changed and kept out of the sandbox's reach; images the worker
cannot use refused at once and clearly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import SANDBOX_IMAGE
from tests.docker.conftest import own_registry, require_runtime
from worker.registry import ToolRegistry, default_registry
from worker.settings import Settings
from worker.workspace_settings import SettingsError, SettingsStore

pytestmark = pytest.mark.docker
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"


@pytest.fixture
async def registry(docker_ready: None, tmp_path: Path) -> AsyncIterator[ToolRegistry]:
    async with own_registry(tmp_path) as reg:
        yield reg


def _container(workspace: Path) -> Any:
    client = docker.from_env()
    try:
        (c,) = client.containers.list(filters={"label": f"dev.loom.workspace={workspace}"})
        return c
    finally:
        client.close()


async def run(registry: ToolRegistry, ws: Path, command: str) -> str:
    r = await registry.execute("shell_execute", {"command": command}, workspace=str(ws))
    assert r.success, r.output
    return r.output


MEMORY_LIMIT = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"


async def test_two_workspaces_with_their_own_image_and_memory(registry: ToolRegistry, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    await registry.configure_workspace(a, {"memory": "512m", "env": {"WHO": "a"}})
    await registry.configure_workspace(b, {"image": "loom-test-busybox:latest", "memory": "768m", "env": {"WHO": "b"}})
    out_a, out_b = await asyncio.gather(
        run(registry, a, f"echo $WHO; {MEMORY_LIMIT}; command -v python3 || echo no-python"),
        run(registry, b, f"echo $WHO; {MEMORY_LIMIT}; command -v python3 || echo no-python"),
    )
    assert out_a.split()[:2] == ["a", str(512 << 20)] and "no-python" not in out_a
    assert out_b.split()[:2] == ["b", str(768 << 20)] and "no-python" in out_b
    ca, cb = _container(a), _container(b)
    assert (ca.attrs["Config"]["Image"], ca.attrs["HostConfig"]["Memory"]) == (SANDBOX_IMAGE, 512 << 20)
    assert (cb.attrs["Config"]["Image"], cb.attrs["HostConfig"]["Memory"]) == ("loom-test-busybox:latest", 768 << 20)


async def test_a_change_recreates_the_sandbox_and_keeps_the_files(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    await run(registry, ws, "echo kept > notes.txt")
    first = _container(ws).id
    done = await registry.configure_workspace(ws, {"cpus": 0.5, "pids": 128, "env": {"STAGE": "two"}})
    assert done.changed and "files are kept" in done.message
    assert (await run(registry, ws, "cat notes.txt; echo $STAGE")).split() == ["kept", "two"]
    c = _container(ws)
    assert c.id != first
    assert (c.attrs["HostConfig"]["NanoCpus"], c.attrs["HostConfig"]["PidsLimit"]) == (500_000_000, 128)
    # No change, no new container.
    assert not (await registry.configure_workspace(ws, {"cpus": 0.5})).changed
    await run(registry, ws, "true")
    assert _container(ws).id == c.id


async def test_a_change_made_by_another_process_is_used_at_the_next_call(
    registry: ToolRegistry, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    await run(registry, ws, "true")
    store = SettingsStore(tmp_path / "data")  # what `loom-worker workspace set` does in its own process
    store.save(ws, store.load(ws).model_copy(update={"env": {"FROM": "cli"}}))
    assert (await run(registry, ws, "echo $FROM")).strip() == "cli"


async def test_the_sandbox_cannot_see_or_change_its_settings(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    await registry.configure_workspace(ws, {"memory": "512m"})
    path = SettingsStore(tmp_path / "data").path(ws)
    assert path.exists() and not path.is_relative_to(ws)
    out = await run(
        registry,
        ws,
        f"test -e {path} && echo visible || echo absent; grep -l 512m -r / 2>/dev/null"
        " --include=settings.json | head -3; mount | grep -c loom-worker || true",
    )
    assert out.split()[0] == "absent" and "settings.json" not in out
    before = path.read_bytes()
    r = await registry.execute("write_file", {"path": "../settings.json", "content": "{}"}, workspace=str(ws))
    assert not r.success and path.read_bytes() == before


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_an_image_that_cannot_serve_is_refused_at_once(
    registry: ToolRegistry, tmp_path: Path, runtime: str
) -> None:
    """A missing image, and one without /bin/sh: an infrastructure error naming the image
    and what to do, long before the agent's start timeout (it used to hang for 40 s). A
    missing image that cannot be pulled (docker.io has no such repository, or is not
    reachable from here) is refused when it is set, and at the first call when it is the
    default (or was removed after it was set), naming the registry (test_image_pull.py has
    the registry's answers one by one)."""
    require_runtime(runtime)
    ws = tmp_path / "missing-set"
    ws.mkdir()
    with pytest.raises(SettingsError) as refused:
        await registry.configure_workspace(ws, {"image": "loom-test-no-such-image:1", "runtime": runtime})
    assert refused.value.field == "image" and "loom-test-no-such-image:1" in refused.value.message
    assert "could not be pulled from docker.io" in refused.value.message
    assert SettingsStore(tmp_path / "data").load(ws.resolve()).image is None  # nothing stored

    cases = {
        "loom-test-no-such-image:1": ("could not be pulled from docker.io", "the engine said"),
        "loom-test-nosh:latest": ("has no /bin/sh", "busybox"),
    }
    for image, words in cases.items():
        ws = tmp_path / image.replace(":", "_")
        ws.mkdir()
        settings = Settings(data_dir=tmp_path / "data2", image=image, runtime=runtime, catalog=False)
        async with default_registry(settings) as reg:
            try:
                r = await reg.execute("shell_execute", {"command": "true"}, workspace=str(ws))
            finally:
                await reg.stop(ws)
        assert not r.success and (r.data or {}).get("error_kind") == "infrastructure", r.output
        assert image.split(":")[0] in r.output and all(w in r.output for w in words), r.output
        assert "did not start" not in r.output  # decided at once, not by the agent's start timeout


async def test_the_ca_bundle_is_the_trust_store_of_the_usual_tools(registry: ToolRegistry, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    await registry.configure_workspace(ws, {"ca_bundle": HOST_CA})
    names = [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "PIP_CERT",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
        "CURL_CA_BUNDLE",
    ]
    out = await run(registry, ws, " ; ".join(f'echo "${n}"' for n in names))
    paths = out.split("\n")[: len(names)]
    assert len(set(paths)) == 1 and paths[0].startswith("/") and not paths[0].startswith("/workspace")
    stats = await run(
        registry, ws, "python3 -c 'import ssl; print(ssl.create_default_context().cert_store_stats()[\"x509_ca\"])'"
    )
    assert int(stats.split()[0]) > 10  # the host's bundle, loaded through SSL_CERT_FILE
    r = await registry.execute("shell_execute", {"command": 'echo x >> "$SSL_CERT_FILE"'}, workspace=str(ws))
    assert not r.success  # mounted read-only
    # A missing or non-PEM file is refused before anything is stored.
    with pytest.raises(ValueError, match="ca_bundle"):
        await registry.configure_workspace(ws, {"ca_bundle": str(tmp_path / "missing.pem")})
    # A file that keeps a private key beside its certificates: the sandbox sees the certificates.
    combined = tmp_path / "combined.pem"
    combined.write_bytes(
        Path(HOST_CA).read_bytes() + b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"
    )
    await registry.configure_workspace(ws, {"ca_bundle": str(combined)})
    out = await run(
        registry, ws, 'grep -c "BEGIN CERTIFICATE" "$SSL_CERT_FILE"; grep -c "PRIVATE KEY" "$SSL_CERT_FILE" || true'
    )
    assert int(out.split()[0]) > 10 and out.split()[1] == "0"


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_the_default_image_is_one_an_agent_can_work_in(
    registry: ToolRegistry, user_workspace: Path, runtime: str
) -> None:
    """pip, venv, node, npm, a C compiler and git run as the sandbox user on the read-only
    root, their caches and config in $HOME or /tmp."""
    require_runtime(runtime)
    await registry.configure_workspace(user_workspace, {"image": "loom-sandbox:latest", "runtime": runtime})
    script = " && ".join(
        [
            "id -u",
            "pip --version",
            "python3 -m venv .venv && .venv/bin/pip --version",
            "node -e 'console.log(\"node\", process.version)'",
            "npm --version",
            "mkdir -p app && cd app && npm init -y >/dev/null && cd ..",
            "printf '#include <stdio.h>\\nint main(void){puts(\"compiled\");return 0;}\\n' > h.c && cc -o h h.c && ./h",
            "git init -q repo && git -C repo -c user.email=a@b -c user.name=a commit -q --allow-empty -m x",
            "curl --version | head -1 && jq --version && unzip -v | head -1 && patch --version | head -1",
            "touch /etc/x 2>/dev/null && echo root-writable || echo root-read-only",
        ]
    )
    r = await registry.execute("shell_execute", {"command": script, "timeout": 300}, workspace=str(user_workspace))
    assert r.success, r.output
    out = r.output
    assert out.splitlines()[0] == "1000"
    for word in ("pip ", "node v", "compiled", "curl ", "jq-", "root-read-only"):
        assert word in out, (word, out)
    assert (user_workspace / "app" / "package.json").exists() and (user_workspace / "repo" / ".git").is_dir()


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_every_value_settings_accept_starts_a_sandbox(
    registry: ToolRegistry, tmp_path: Path, runtime: str
) -> None:
    """A value a setting accepts must not fail every later start (an API fuzzer's 503s):
    the least of each limit runs a command, and more CPUs than the engine has is refused
    when set, naming the field."""
    require_runtime(runtime)
    ws = tmp_path / "least"
    ws.mkdir()
    have = docker.from_env().info()["NCPU"]
    with pytest.raises(SettingsError) as refused:
        await registry.configure_workspace(ws, {"cpus": have + 1})
    assert refused.value.field == "cpus" and f"engine's {have} CPUs" in refused.value.message
    await registry.configure_workspace(
        ws, {"runtime": runtime, "cpus": 0.1, "memory": "64m", "pids": 16, "idle_ttl": 10}
    )
    assert (await run(registry, ws, "echo least")).strip() == "least"
    c = _container(ws)
    assert (c.attrs["HostConfig"]["NanoCpus"], c.attrs["HostConfig"]["Memory"]) == (100_000_000, 64 << 20)
