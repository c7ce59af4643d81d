"""The agents store (worker.agents.store): manifest, atomic install, list, pin, remove, with
an installer that lays out what npm would (the real one runs in a sandbox: tests/docker)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from worker.agents.catalog import AGENTS, check_version
from worker.agents.store import STAGING, AgentStore, InstallError, UnknownAgent


def fake_npm(version: str = "1.2.3", *, fail: bool = False, binary: str = "opencode"):
    """An installer that writes node_modules as npm does (package, its .bin link, the lock)."""
    calls: list[str] = []

    async def install(stage: Path, spec: str, progress) -> None:
        calls.append(spec)
        package = spec.rsplit("@", 1)[0]
        pkg = stage / "node_modules" / package
        pkg.mkdir(parents=True)
        (pkg / "package.json").write_text(json.dumps({"name": package, "version": version, "bin": {binary: "x.js"}}))
        (pkg / "x.js").write_text("#!/usr/bin/env node\n")
        (stage / "node_modules" / ".bin").mkdir()
        os.symlink(f"../{package}/x.js", stage / "node_modules" / ".bin" / binary)
        (stage / ".npm-cache").mkdir()
        (stage / ".npm-cache" / "big").write_bytes(b"x" * 100_000)
        lock = {"packages": {f"node_modules/{package}": {"version": version, "integrity": "sha512-abc"}}}
        (stage / "package-lock.json").write_text(json.dumps(lock))
        progress("fetched")
        if fail:
            raise InstallError("npm failed")

    install.calls = calls  # type: ignore[attr-defined]
    return install


def leftovers(root: Path) -> list[str]:
    return os.listdir(root / STAGING) if (root / STAGING).exists() else []


async def test_install_writes_manifest_bin_and_pin(tmp_path: Path) -> None:
    npm = fake_npm("1.2.3")
    store = AgentStore(tmp_path, installer=npm)
    said: list[str] = []
    got = await store.install("opencode", progress=said.append)
    assert npm.calls == ["opencode-ai@latest"]
    assert (got.name, got.version, got.package, got.pinned) == ("opencode", "1.2.3", "opencode-ai", True)
    assert got.path == tmp_path / "opencode" / "1.2.3"
    m = json.loads((got.path / "manifest.json").read_text())
    assert m["integrity"] == "sha512-abc" and m["version"] == "1.2.3" and m["size"] == got.size > 0
    assert os.readlink(got.path / "bin" / "opencode") == "../node_modules/.bin/opencode"
    assert (got.path / "bin" / "opencode").resolve() == (got.path / "node_modules/opencode-ai/x.js").resolve()
    assert not (got.path / ".npm-cache").exists()  # the cache is not kept
    assert got.size < 100_000
    assert store.get("opencode") == got
    assert leftovers(tmp_path) == []
    assert any("fetched" in s for s in said)


async def test_failed_install_leaves_nothing_and_keeps_the_pinned_one(tmp_path: Path) -> None:
    await AgentStore(tmp_path, installer=fake_npm("1.0.0")).install("opencode", "1.0.0")
    with pytest.raises(InstallError):
        await AgentStore(tmp_path, installer=fake_npm("2.0.0", fail=True)).install("opencode", "2.0.0")
    assert leftovers(tmp_path) == []
    assert [i.version for i in AgentStore(tmp_path).installed()] == ["1.0.0"]
    assert AgentStore(tmp_path).get("opencode").version == "1.0.0"  # type: ignore[union-attr]
    # a package without the agent's executable is refused too, and nothing stays
    with pytest.raises(InstallError, match="no executable 'opencode'"):
        await AgentStore(tmp_path, installer=fake_npm("3.0.0", binary="other")).install("opencode")
    assert leftovers(tmp_path) == [] and not (tmp_path / "opencode" / "3.0.0").exists()


async def test_list_pin_and_remove(tmp_path: Path) -> None:
    store = AgentStore(tmp_path, installer=fake_npm("1.0.0"))
    await store.install("opencode", "1.0.0")
    store.installer = fake_npm("1.1.0")
    await store.install("opencode", "1.1.0")
    listed = [(i.version, i.pinned) for i in store.installed()]
    assert listed == [("1.0.0", False), ("1.1.0", True)]
    store.pin("opencode", "1.0.0")
    assert store.get("opencode").version == "1.0.0"  # type: ignore[union-attr]
    with pytest.raises(LookupError):
        store.pin("opencode", "9.9.9")
    # the same version again replaces it in place
    store.installer = fake_npm("1.1.0")
    again = await store.install("opencode", "1.1.0")
    assert again.pinned and len(store.installed()) == 2
    assert store.remove("opencode", "1.1.0") == ["1.1.0"]
    assert store.get("opencode") is None  # the pinned one went: nothing pinned
    assert store.remove("opencode") == ["1.0.0"] and store.installed() == []
    with pytest.raises(LookupError):
        store.remove("opencode")


async def test_unknown_agent_and_bad_version(tmp_path: Path) -> None:
    store = AgentStore(tmp_path, installer=fake_npm())
    with pytest.raises(UnknownAgent, match="known: claude, codex, opencode"):
        await store.install("nope")
    for bad in ("^1.0.0", "1.x", "file:../x", "https://evil/x.tgz", "1.0.0 || 2"):
        with pytest.raises(ValueError, match="not a version"):
            await store.install("opencode", bad)
    assert check_version("2.1.3") == "2.1.3" and check_version("latest") == "latest"
    assert leftovers(tmp_path) == []
    # a directory that is not an install is never listed
    (tmp_path / "codex" / "0.1.0").mkdir(parents=True)
    assert store.installed() == [] and store.get("codex") is None


def test_catalog() -> None:
    assert AGENTS["claude"].package == "@anthropic-ai/claude-code" and AGENTS["claude"].provider == "anthropic"
    assert (AGENTS["codex"].binary, AGENTS["codex"].provider) == ("codex", "openai")
    assert AGENTS["opencode"].provider is None


def test_a_certificate_npm_cannot_verify_gets_a_hint_naming_loom_ca_bundle() -> None:
    from worker.agents.npm_install import tls_hint

    out = "npm error code SELF_SIGNED_CERT_IN_CHAIN\nnpm error request to https://registry.npmjs.org/x failed"
    hint = tls_hint(out)
    assert "SELF_SIGNED_CERT_IN_CHAIN" in hint and "LOOM_CA_BUNDLE" in hint
    assert tls_hint("npm error code E404\nnpm error 404 Not Found") == ""
