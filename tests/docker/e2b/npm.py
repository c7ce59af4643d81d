"""E2B's JavaScript SDK for the tests: npm's ``e2b`` at the version ``js/package-lock.json``
pins (with every package under it), installed once with ``npm ci`` in a cache directory
outside the repository (``~/.cache/loom-tests/npm-e2b/<hash of the lock>``; the variable
``LOOM_TEST_CACHE`` moves ``~/.cache/loom-tests``), and the scripts of ``js/`` run there
with Node.

It needs Node (the SDK asks for >= 20.18.1) and npm on the PATH, and the npm registry
reachable the first time (``NODE_EXTRA_CA_CERTS`` is set to the system's CA bundle, so a
TLS-intercepting proxy the system trusts works). Without Node or npm a test skips, and
fails under ``REQUIRE_DOCKER=1`` (CI), as the Docker tests do.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REQUIRE_DOCKER

JS_DIR = Path(__file__).parent / "js"
#: The oldest Node the pinned SDK runs on (its package's "engines").
NODE_MIN = (20, 18, 1)
SYSTEM_CAS = Path("/etc/ssl/certs/ca-certificates.crt")


def _missing(problem: str) -> None:
    if REQUIRE_DOCKER:
        pytest.fail(f"REQUIRE_DOCKER=1 but {problem}")
    pytest.skip(problem)


def node_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for node and npm: this one, the system's CAs trusted."""
    env = {**os.environ, **(extra or {})}
    if SYSTEM_CAS.is_file():
        env.setdefault("NODE_EXTRA_CA_CERTS", str(SYSTEM_CAS))
    return env


def _check_node(node: str) -> None:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    try:
        version = tuple(int(x) for x in out.lstrip("v").split(".")[:3])
    except ValueError:
        version = ()
    if version < NODE_MIN:
        _missing(f"E2B's JavaScript SDK needs Node >= {'.'.join(map(str, NODE_MIN))}; {node} is {out or '?'}")


def e2b_js_sdk() -> Path:
    """The directory whose ``node_modules`` holds the pinned SDK, installed at its first use
    (one process at a time: a lock file). Skips (fails under REQUIRE_DOCKER=1) without
    Node or npm; fails when ``npm ci`` does (the message is npm's)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _missing("E2B's JavaScript SDK tests need node and npm on the PATH")
    assert node is not None and npm is not None
    _check_node(node)
    pinned = [(JS_DIR / name).read_bytes() for name in ("package.json", "package-lock.json")]
    digest = hashlib.sha256(b"\0".join(pinned)).hexdigest()[:16]
    cache = Path(os.environ.get("LOOM_TEST_CACHE") or "~/.cache/loom-tests").expanduser()
    target = cache / "npm-e2b" / digest
    done = target / ".installed"
    if done.is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            return target
        for name, data in zip(("package.json", "package-lock.json"), pinned, strict=True):
            (target / name).write_bytes(data)
        r = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
            cwd=target,
            env=node_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if r.returncode != 0:
            pytest.fail(f"npm ci of E2B's JavaScript SDK in {target} failed:\n{(r.stderr or r.stdout)[-3000:]}")
        done.write_text(digest + "\n")
    return target


def run_script(name: str, env: dict[str, str] | None = None, timeout: float = 240) -> dict[str, Any]:
    """Run ``js/<name>`` with the SDK (a copy beside its ``node_modules``: Node resolves an
    import from the script's own directory) and answer the JSON of its last line of
    stdout. Fails when it prints none."""
    sdk = e2b_js_sdk()
    script = sdk / f"{os.getpid()}-{name}"
    script.write_bytes((JS_DIR / name).read_bytes())
    try:
        r = subprocess.run(
            [shutil.which("node") or "node", str(script)],
            cwd=sdk,
            env=node_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        script.unlink(missing_ok=True)
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    if r.returncode != 0 or not lines:
        pytest.fail(f"node {name} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    return report
