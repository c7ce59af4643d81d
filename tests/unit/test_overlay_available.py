"""Overlay forks are offered only where their layers can be named: overlay's mount options
are comma- and colon-separated, so a data directory with either in its path would fail
every fork (as the infrastructure's failure) where a copy works."""

from __future__ import annotations

from pathlib import Path

from worker.snapshots import overlay


class _Overlays:
    async def volumes_dir(self) -> Path:
        return Path("/var/lib/docker/volumes")


class _Backend:
    overlays = _Overlays()


async def test_a_data_dir_an_overlay_cannot_name_is_not_offered(tmp_path: Path) -> None:
    plain = tmp_path / "data"
    plain.mkdir()
    assert await overlay.available(_Backend(), plain)
    for odd in ("da,ta", "da:ta"):
        (tmp_path / odd).mkdir()
        assert not await overlay.available(_Backend(), tmp_path / odd)
    (tmp_path / "via").symlink_to(tmp_path / "da,ta")  # as the path resolves
    assert not await overlay.available(_Backend(), tmp_path / "via")
