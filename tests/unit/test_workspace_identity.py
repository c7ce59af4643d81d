"""A workspace's identity (the sha256 of its real path) comes from one helper,
:mod:`sandbox.identity`, and the places that name a workspace by it agree: its container,
the directory of its egress socket (mounted into that container), its changelog's
directory."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from sandbox.docker import container_name
from sandbox.identity import KEY_LENGTH, workspace_digest, workspace_key
from worker.changelog.recorder import workspace_dir
from worker.egress.setup import egress_parts
from worker.registry import default_registry
from worker.settings import Settings


def test_the_identity_is_the_hash_of_the_real_path(tmp_path: Path) -> None:
    real = tmp_path / "proj"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    expected = hashlib.sha256(os.path.realpath(real).encode()).hexdigest()
    assert workspace_digest(real) == workspace_digest(link) == workspace_digest(str(link)) == expected
    assert workspace_key(link) == expected[:KEY_LENGTH] and KEY_LENGTH == 16
    assert workspace_key(tmp_path / "not-there") == workspace_digest(tmp_path / "not-there")[:16]


async def test_container_egress_socket_and_changelog_agree(tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    link = tmp_path / "via-link"
    link.symlink_to(ws)
    key = workspace_key(ws)
    settings = Settings(data_dir=tmp_path / "data")

    assert container_name(link) == container_name(ws) == f"loom-sbx-{key}"

    _allow, socket_dir, make_gateway = egress_parts(settings)
    registry = default_registry(settings, catalog=False)
    assert registry.configs is not None
    gateway = make_gateway(registry.configs)
    assert socket_dir(ws) == gateway.socket_dir(ws) == settings.data_dir / "egress" / key
    await gateway.aclose()
    await registry.aclose()

    assert workspace_dir(settings.data_dir, link) == settings.data_dir / "workspaces" / workspace_digest(ws)[:32]
