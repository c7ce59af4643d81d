"""``loom-worker setup`` and ``doctor --fix`` on the real engine, with throwaway image names
(``loom-setuptest-<hex>...``): what is missing is built, a second run builds nothing, the
images built work as a sandbox; what cannot be got is named with what each way answered;
the debootstrap way builds an offline base of its own; gVisor is registered in a
``daemon.json`` of the test's own (never the engine's).

This machine reaches no container registry: pulls fail (which the failing cases use), and
builds come from the offline bases ``scripts/setup`` made, or from debootstrap.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import MINIMAL_IMAGE, require_docker
from tests.images import remove_image
from tests.workers import LOOM, ROOT
from worker.cli.setup.engine import DockerCLI
from worker.cli.setup.images import RUNTIME, Images, sandbox_recipe

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]


@pytest.fixture
def names() -> Iterator[dict[str, str]]:
    require_docker()
    tag = f"loom-setuptest-{secrets.token_hex(4)}"
    made = {
        "practical": f"{tag}:latest",
        "minimal": f"{tag}:minimal",
        "runtime": f"{tag}-runtime:latest",
        "base": f"{tag}-base:bookworm",
        "dev_base": f"{tag}-base-dev:bookworm",
    }
    try:
        yield made
    finally:
        for name in made.values():
            remove_image(name)


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(PYTHONPATH=str(ROOT), LOOM_DATA_DIR=str(tmp_path / "data"), LOOM_CLI_DAEMON="0", **extra)
    return env


def loom(env: dict[str, str], *argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LOOM, *argv], env=env, capture_output=True, text=True, timeout=timeout)


def run_in(env: dict[str, str], workspace: Path, command: str) -> subprocess.CompletedProcess[str]:
    try:
        return loom(env, "exec", "-w", str(workspace), "--", command, timeout=300)
    finally:
        loom(env, "stop", "-w", str(workspace))


def test_doctor_fix_builds_what_is_missing_and_setup_then_builds_nothing(
    names: dict[str, str], tmp_path: Path, workspace: Path
) -> None:
    env = env_for(tmp_path, LOOM_IMAGE=names["practical"], LOOM_AGENT_RUNTIME_IMAGE=names["runtime"])
    p = loom(env, "doctor", "--fix")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert f"[done] agent runtime image {names['runtime']}: built from loom-base:bookworm" in out
    assert f"[done] sandbox image {names['practical']}: built from loom-base-dev:bookworm" in out
    assert "[ok] sandbox start: container + agent answer" in out  # doctor, after the fix, with the new images
    for _ in range(2):  # idempotent: nothing is built again
        p = loom(env, "setup")
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"[ok] agent runtime image {names['runtime']}: already there" in p.stdout
        assert f"[ok] sandbox image {names['practical']}: already there" in p.stdout
        assert "[done]" not in p.stdout and "building" not in p.stdout and p.stderr == ""
    # the practical image: node, pip, a compiler
    r = run_in(env, workspace, "node --version && pip3 --version && cc --version | head -1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("v") and "pip " in r.stdout and "cc (Debian" in r.stdout


def test_the_minimal_variant_and_its_tag(names: dict[str, str], tmp_path: Path, workspace: Path) -> None:
    env = env_for(tmp_path, LOOM_AGENT_RUNTIME_IMAGE="loom-agent-runtime:latest")
    p = loom(env, "setup", "--image", names["minimal"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[ok] agent runtime image loom-agent-runtime:latest: already there" in p.stdout
    assert f"[done] sandbox image {names['minimal']}: built from loom-base:bookworm" in p.stdout
    r = run_in(
        {**env, "LOOM_IMAGE": names["minimal"]}, workspace, "python3 -m venv /tmp/v && command -v node || echo none"
    )
    assert (r.returncode, r.stdout) == (0, "none\n"), r.stdout + r.stderr


def test_a_base_that_cannot_be_got_is_named(names: dict[str, str], tmp_path: Path) -> None:
    env = env_for(tmp_path, LOOM_AGENT_RUNTIME_IMAGE="loom-agent-runtime:latest")
    missing = f"{names['base']}-nowhere"
    p = loom(env, "setup", "--image", names["minimal"], "--base", missing, "--pull", "never")
    assert p.returncode == 1
    assert (
        f"[FAIL] sandbox image {names['minimal']}: --base {missing}: not pulled: the pull policy is never" in p.stdout
    )
    assert "setup incomplete: 1 thing(s) missing" in p.stdout
    p = loom(env, "setup", "--image", names["minimal"], "--base", missing)
    assert p.returncode == 1 and f"--base {missing}: pull failed: " in p.stdout, p.stdout
    assert subprocess.run(["docker", "image", "inspect", names["minimal"]], capture_output=True).returncode != 0


def test_a_foreign_image_is_pulled_as_the_policy_allows(names: dict[str, str], tmp_path: Path) -> None:
    env = env_for(tmp_path, LOOM_IMAGE="registry.invalid/nobody/python:3.12-slim")
    p = loom(env, "setup", "--pull", "never")
    assert p.returncode == 1
    assert (
        "[FAIL] sandbox image registry.invalid/nobody/python:3.12-slim: not on this engine and not pulled: " in p.stdout
    )
    assert "the pull policy is never" in p.stdout and "docker pull registry.invalid" in p.stdout
    p = loom(env, "setup")  # missing: it is pulled, and the registry's answer is shown
    assert p.returncode == 1 and "pull failed: " in p.stdout and "registry.invalid" in p.stdout, p.stdout
    failed = [line.split(":")[0] for line in p.stdout.splitlines() if line.startswith("[FAIL]")]
    assert failed == ["[FAIL] sandbox image registry.invalid/nobody/python"]  # the runtime image is there


def test_every_way_to_a_base_is_reported_when_none_works(names: dict[str, str]) -> None:
    images = Images(DockerCLI(), offline_bases=(names["base"], names["dev_base"]), is_root=False)
    step = images.ensure(names["runtime"], RUNTIME)
    assert step.status == "FAIL"
    assert "no base image to build from: debian:bookworm-slim: pull failed: " in step.detail
    assert "debootstrap: needs root" in step.detail and "--base" in step.fix
    never = Images(DockerCLI(), pull="never", offline_bases=(names["base"], names["dev_base"]), is_root=False)
    assert (
        "debian:bookworm-slim: not pulled: the pull policy is never" in never.ensure(names["runtime"], RUNTIME).detail
    )


@pytest.mark.slow
def test_without_a_registry_debootstrap_builds_the_base(names: dict[str, str], tmp_path: Path, workspace: Path) -> None:
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        pytest.skip("needs root and debootstrap (scripts/setup installs it)")
    said: list[str] = []
    images = Images(DockerCLI(), offline_bases=(names["base"], names["dev_base"]), say=said.append)
    step = images.ensure(names["minimal"], sandbox_recipe(names["minimal"]))
    assert step.status == "done", step
    assert step.detail.startswith(f"built from {names['base']} (built with debootstrap)")
    assert any("debootstrap" in line for line in said)
    # the base is there now: the runtime builds from it, and nothing is built twice
    assert images.ensure(names["runtime"], RUNTIME).detail.startswith(f"built from {names['base']} (the offline base")
    assert images.ensure(names["minimal"], sandbox_recipe(names["minimal"])).status == "ok"
    env = env_for(tmp_path, LOOM_IMAGE=names["minimal"], LOOM_AGENT_RUNTIME_IMAGE=names["runtime"])
    r = run_in(env, workspace, "python3 -c 'print(6*7)'")
    assert (r.returncode, r.stdout) == (0, "42\n"), r.stdout + r.stderr


def test_register_gvisor_writes_only_the_file_it_is_given(tmp_path: Path) -> None:
    require_docker()
    engine_config = Path("/etc/docker/daemon.json")
    before = engine_config.read_bytes() if engine_config.exists() else None
    runsc = tmp_path / "runsc"
    runsc.write_text("#!/bin/sh\necho runsc\n")
    runsc.chmod(0o755)
    config = tmp_path / "daemon.json"
    config.write_text(json.dumps({"features": {"buildkit": False}}))
    env = env_for(tmp_path, LOOM_IMAGE=MINIMAL_IMAGE)
    argv = ["setup", "--register-gvisor", str(runsc), "--daemon-json", str(config)]
    p = loom(env, *argv)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"[done] gVisor (runsc): registered {runsc} as runsc, runsc-systrap, runsc-ptrace" in p.stdout
    assert f"in {config}" in p.stdout and "does not reload" in p.stdout
    written = json.loads(config.read_text())
    assert written["features"] == {"buildkit": False}
    assert written["runtimes"]["runsc-systrap"] == {
        "path": str(runsc),
        "runtimeArgs": ["--platform=systrap", "--network=none", "--host-uds=open"],
    }
    assert written["runtimes"]["runsc-ptrace"]["runtimeArgs"][0] == "--platform=ptrace"
    p = loom(env, *argv)
    assert re.search(r"\[ok\] gVisor \(runsc\): runsc, .* already registered in .* as wanted", p.stdout), p.stdout
    assert (engine_config.read_bytes() if engine_config.exists() else None) == before
    # without the flag nothing is written, and the engine's own registration is reported
    config.unlink()
    p = loom(env, "setup", "--daemon-json", str(config))
    assert not config.exists() and "gVisor (runsc, systrap): " in p.stdout
