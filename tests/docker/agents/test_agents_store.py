"""The agents store on the real engine: ``agent install opencode`` from npm through loom's
egress gateway (npm in a sandbox), the ``agents`` setting mounting it read-only on PATH
under runc and gVisor, per-workspace $HOME and /tmp sizes, ``npm install -g`` and ``pip
install --user`` landing in $HOME, and the image's Node version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SANDBOX_IMAGE, TEST_OWNER
from tests.docker.conftest import OWNER_FILE, own_registry
from worker.agents.store import STAGING, AgentStore
from worker.workspace_settings import SettingsError

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"  # the registry is reached through this host's proxy


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory whose agents store has opencode, installed by the CLI (once)."""
    base = tmp_path_factory.mktemp("agents")
    (base / "data").mkdir()
    (base / "data" / OWNER_FILE).write_text(TEST_OWNER + "\n")  # the run's sandboxes are the run's
    env = {
        "LOOM_IMAGE": SANDBOX_IMAGE,
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
        "LOOM_DATA_DIR": str(base / "data"),
        "LOOM_CA_BUNDLE": HOST_CA,
        "LOOM_CATALOG": "false",
    }
    env.update({k: v for k, v in os.environ.items() if k.startswith(("LOOM_TEST", "DOCKER_"))})
    r = subprocess.run(
        [sys.executable, "-m", "worker.cli", "agent", "install", "opencode", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["name"] == "opencode" and got["pinned"] and got["integrity"].startswith("sha512-")
    assert "[agent install]" in r.stderr  # progress on stderr
    data = base / "data"
    # nothing of the staging sandbox is left: no staging directory, no workspace data
    assert os.listdir(data / "agents" / STAGING) == []
    assert not (data / "workspaces").exists() or os.listdir(data / "workspaces") == []
    listed = subprocess.run(
        [sys.executable, "-m", "worker.cli", "agent", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0 and "opencode" in listed.stdout and "pinned" in listed.stdout
    return data


async def sh(reg: Any, ws: Path, cmd: str) -> tuple[int | None, str]:
    """The exit code and stdout (stderr when it failed: Node 22 warns on stderr that its
    proxy agent, which the egress settings turn on, is experimental)."""
    out = await reg.sandbox(ws).exec(cmd, timeout=300)
    return out.returncode, (out.stdout if out.returncode == 0 else out.stdout + out.stderr).decode(errors="replace")


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_agents_mounted_read_only_on_path(installed: Path, runtime: str, tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    version = AgentStore(installed / "agents").get("opencode").version  # type: ignore[union-attr]
    async with own_registry(installed.parent, runtime, ca_bundle=HOST_CA) as reg:
        with pytest.raises(SettingsError, match="loom-worker agent install codex"):
            await reg.configure_workspace(ws, {"agents": ["codex"]})
        await reg.configure_workspace(
            ws, {"agents": ["opencode"], "home_size": "300m", "tmp_size": "200m", "egress": ["npm", "pypi"]}
        )
        rc, out = await sh(reg, ws, "command -v opencode && opencode --version")
        assert rc == 0, out
        assert out.split() == ["/opt/loom/agents/opencode/bin/opencode", version]
        rc, out = await sh(reg, ws, "touch /opt/loom/agents/opencode/x")
        assert rc != 0 and "Read-only file system" in out, out
        rc, out = await sh(reg, ws, "df -k --output=target,size /tmp $HOME | tail -n +2")
        sizes = dict(line.split() for line in out.splitlines())
        assert sizes == {"/tmp": str(200 * 1024), "/home/sandbox": str(300 * 1024)}, out
        # What a command installs for itself lands in $HOME and runs from PATH.
        rc, out = await sh(
            reg, ws, "npm install -g --no-audit --no-fund semver@7.6.0 >/dev/null 2>&1 && command -v semver"
        )
        assert rc == 0 and out.strip() == "/home/sandbox/.local/bin/semver", out
        rc, out = await sh(reg, ws, "semver -i minor 1.2.3")
        assert (rc, out.strip()) == (0, "1.3.0"), out
        pip = "pip install -q --user text-unidecode==1.3 2>&1"
        rc, out = await sh(reg, ws, f"{pip} && python3 -c 'import text_unidecode as t; print(t.__file__)'")
        assert rc == 0 and out.strip().splitlines()[-1].startswith("/home/sandbox/.local/lib/python3"), out
        # nothing of it in the workspace
        assert sorted(p.name for p in ws.iterdir()) == []


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_node_22_in_the_default_image(runtime: str, tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    async with own_registry(tmp_path, runtime) as reg:
        rc, out = await sh(reg, ws, "node --version && npm --version")
        assert rc == 0, out
        node, npm = out.split()
        assert int(node.lstrip("v").split(".")[0]) >= 22 and int(npm.split(".")[0]) >= 10, out
