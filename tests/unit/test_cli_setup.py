"""``loom-worker setup`` without an engine: which images are ours and how they are built,
the build contexts shipped in the package (and in a wheel), gVisor's registration in a
``daemon.json`` of the test's own, and the clear failure when the engine or the docker
command is missing. tests/docker/test_cli_setup.py builds and pulls on the real engine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.workers import LOOM, ROOT
from worker.cli.setup import gvisor
from worker.cli.setup.images import Images, context_dir, sandbox_recipe

IMAGES = ROOT / "images"


@pytest.mark.parametrize(
    ("image", "variant"),
    [
        ("loom-sandbox:latest", "practical"),
        ("loom-sandbox", "practical"),
        ("loom-sandbox:minimal", "minimal"),
        ("loom-test-1a2b:minimal", "minimal"),
        ("loom-x:v2", "practical"),
        ("python:3.12-slim", None),
        ("localhost:5000/loom-sandbox:latest", None),
        ("ghcr.io/me/loom-sandbox:latest", None),
        ("loom-sandbox@sha256:" + "0" * 64, "practical"),
    ],
)
def test_which_images_are_ours(image: str, variant: str | None) -> None:
    recipe = sandbox_recipe(image)
    assert (recipe.build_args["VARIANT"] if recipe else None) == variant
    if recipe is not None:
        assert recipe.offline_base == ("loom-base-dev:bookworm" if variant == "practical" else "loom-base:bookworm")


def _shell_list(text: str, name: str) -> list[str]:
    match = re.search(rf'^{name}="?([^"\n]*)"?$', text, re.M)
    assert match, name
    return match.group(1).replace(",", " ").split()


def test_the_sandbox_dockerfile_installs_what_the_offline_bases_have() -> None:
    """From debian:bookworm-slim the Dockerfile installs with apt what build-base.sh puts
    in the offline bases: the two ways give the same variant."""
    dockerfile = (IMAGES / "sandbox/Dockerfile").read_text()
    lists = re.findall(r'pkgs="(?:\$pkgs )?([^"]*)"', dockerfile)
    minimal, practical = lists[0].split(), lists[1].split()
    base = (IMAGES / "base/build-base.sh").read_text()
    assert practical == _shell_list(base, "DEV_PKGS")
    assert set(minimal) <= set(_shell_list(base, "PKGS"))


def test_the_build_contexts_are_in_the_package() -> None:
    for name in ("runtime", "sandbox", "base"):
        shipped = context_dir(name)
        for source in (IMAGES / name).iterdir():
            assert (shipped / source.name).read_bytes() == source.read_bytes(), source


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_wheel_ships_the_build_contexts(tmp_path: Path) -> None:
    """What a `pip install` user gets: the contexts `setup` builds from, as files."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    [wheel] = tmp_path.glob("loom_worker-*.whl")
    with zipfile.ZipFile(wheel) as z:
        for name in ("runtime/Dockerfile", "runtime/assemble.sh", "sandbox/Dockerfile", "base/build-base.sh"):
            assert z.read(f"worker/images/{name}") == (IMAGES / name).read_bytes(), name


# -- gVisor -------------------------------------------------------------------------------------


def test_gvisor_status() -> None:
    wanted = {"path": "/x/runsc", "runtimeArgs": ["--platform=systrap", *gvisor.RUNTIME_ARGS]}
    assert gvisor.status({"runc": {}}, "runc").status == "skip"
    missing = gvisor.status({"runc": {}}, "runsc")
    assert missing.status == "FAIL" and "LOOM_RUNTIME=runsc" in missing.detail and "--register-gvisor" in missing.fix
    assert gvisor.status({"runsc": wanted}, "runc").status == "ok"
    assert gvisor.status({"runsc-systrap": wanted}, "runsc", "systrap").status == "ok"
    no_uds = gvisor.status({"runsc": {"path": "/x/runsc"}}, "runsc")
    assert no_uds.status == "note" and "egress gateway" in no_uds.detail
    # gVisor registered, but not for the platform asked for: it says which there are
    other = gvisor.status({"runsc": {"path": "/x/runsc", "runtimeArgs": ["--platform=ptrace"]}}, "runsc", "systrap")
    assert other.status == "FAIL" and "runsc (--platform=ptrace)" in other.detail


def test_register_gvisor_keeps_the_rest_of_daemon_json(tmp_path: Path) -> None:
    config = tmp_path / "docker" / "daemon.json"
    step = gvisor.register(config, "/opt/runsc", kvm=False)  # no file yet
    assert step.status == "done" and "reload" in step.detail and "does not reload" in step.detail

    def entry(platform: str) -> dict[str, object]:
        return {"path": "/opt/runsc", "runtimeArgs": [f"--platform={platform}", *gvisor.RUNTIME_ARGS]}

    wanted = {"runsc": entry("systrap"), "runsc-systrap": entry("systrap"), "runsc-ptrace": entry("ptrace")}
    assert json.loads(config.read_text()) == {"runtimes": wanted}
    assert config.stat().st_mode & 0o777 == 0o644

    config.write_text(
        json.dumps({"log-driver": "local", "runtimes": {"runsc": {"path": "/old"}, "other": {"path": "/o"}}})
    )
    config.chmod(0o600)
    assert gvisor.register(config, "/opt/runsc", kvm=False).status == "done"
    after = json.loads(config.read_text())
    assert after["log-driver"] == "local" and after["runtimes"]["other"] == {"path": "/o"}
    assert {k: v for k, v in after["runtimes"].items() if k != "other"} == wanted
    assert config.stat().st_mode & 0o777 == 0o600
    before = config.stat().st_mtime_ns
    assert gvisor.register(config, "/opt/runsc", kvm=False).status == "ok"  # as wanted: not written again
    assert config.stat().st_mtime_ns == before
    assert [p.name for p in config.parent.iterdir()] == ["daemon.json"]  # no temporary file left
    assert gvisor.register(config, "/opt/runsc", kvm=True).status == "done"  # where KVM works, runsc-kvm too
    assert json.loads(config.read_text())["runtimes"]["runsc-kvm"] == entry("kvm")


def test_register_gvisor_leaves_a_broken_daemon_json_alone(tmp_path: Path) -> None:
    config = tmp_path / "daemon.json"
    config.write_text('{"runtimes": ')
    step = gvisor.register(config, "/opt/runsc")
    assert step.status == "FAIL" and "not valid JSON" in step.detail
    assert config.read_text() == '{"runtimes": '


def test_find_runsc(tmp_path: Path) -> None:
    runsc = tmp_path / "runsc"
    runsc.write_text("#!/bin/sh\n")
    assert gvisor.find_runsc(str(runsc)) is None  # not executable
    runsc.chmod(0o755)
    assert gvisor.find_runsc(str(runsc)) == str(runsc)
    assert gvisor.find_runsc(str(tmp_path / "nope")) is None


# -- no engine, no docker command --------------------------------------------------------------


def _setup(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LOOM, "setup", *argv], env=env, capture_output=True, text=True, timeout=120)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.skipif(shutil.which("docker") is None, reason="the docker command is not installed")
def test_an_engine_that_does_not_answer_is_named(tmp_path: Path) -> None:
    p = _setup(_env(LOOM_DOCKER_HOST=f"unix://{tmp_path}/no.sock"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"on the engine at unix://{tmp_path}/no.sock" in p.stdout
    assert "[FAIL] docker engine: does not answer: " in p.stdout and "fix: start the engine" in p.stdout
    assert "[done]" not in p.stdout


def test_no_docker_command_is_named(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()  # a PATH with no docker on it
    p = _setup(_env(PATH=str(tmp_path / "bin")))
    assert p.returncode == 1
    assert "[FAIL] docker: the docker command is not installed (not on PATH)" in p.stdout
    assert "https://docs.docker.com/engine/install/" in p.stdout


def test_a_bad_pull_policy_is_a_usage_error() -> None:
    p = _setup(_env(), "--pull", "sometimes")
    assert p.returncode == 2 and "--pull: invalid choice: 'sometimes'" in p.stderr


class _Engine:
    """A DockerCLI stand-in: which images it has, which pass the probe, what was built."""

    def __init__(self, images: set[str], current: set[str]) -> None:
        self.images, self.current = images, current
        self.built: list[tuple[str, dict[str, str]]] = []
        self.env: dict[str, str] = {}
        self.executable = "/usr/bin/docker"

    def has_image(self, ref: str) -> bool:
        return ref in self.images

    def probe(self, image: str, argv: Any) -> bool:
        return image in self.current

    def build(self, context: Path, tag: str, build_args: dict[str, str]) -> None:
        self.built.append((tag, dict(build_args)))
        self.images.add(tag)


def test_a_practical_image_from_an_older_recipe_is_built_again() -> None:
    recipe = sandbox_recipe("loom-sandbox:latest")
    assert recipe is not None and recipe.probe and "ipykernel" in recipe.probe[-1]
    fresh = _Engine({"loom-sandbox:latest", "loom-base-dev:bookworm"}, {"loom-sandbox:latest"})
    assert Images(fresh, pull="never").ensure("loom-sandbox:latest", recipe).status == "ok"  # type: ignore[arg-type]
    old = _Engine({"loom-sandbox:latest", "loom-base-dev:bookworm"}, {"loom-base-dev:bookworm"})
    step = Images(old, pull="never").ensure("loom-sandbox:latest", recipe)  # type: ignore[arg-type]
    assert step.status == "done" and "built again: it was built from an older recipe" in step.detail, step
    assert old.built == [("loom-sandbox:latest", {"BASE": "loom-base-dev:bookworm", "VARIANT": "practical"})]
    # an offline base from an older package list is not built from: (not root here) nothing is
    stale = _Engine({"loom-sandbox:latest", "loom-base-dev:bookworm"}, set())
    step = Images(stale, pull="never", is_root=False).ensure("loom-sandbox:latest", recipe)  # type: ignore[arg-type]
    assert step.status == "FAIL" and "debootstrap: needs root" in step.detail, step
    minimal = sandbox_recipe("loom-sandbox:minimal")
    assert minimal is not None and not minimal.probe
