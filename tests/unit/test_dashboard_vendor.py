"""The dashboard's third-party files (``worker/dashboard/static/vendor/``): each exactly
as its npm package ships it (the hash of every file in ``vendor/MANIFEST.json``), at an
exact version, with its licence beside it and named in ``static/LICENSE.txt``; nothing
else in the directory; and shipped in the wheel (package-data)."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path

from worker.dashboard import STATIC

ROOT = Path(__file__).resolve().parents[2]
VENDOR = STATIC / "vendor"


def _manifest() -> dict[str, dict[str, object]]:
    packages: dict[str, dict[str, object]] = json.loads((VENDOR / "MANIFEST.json").read_text())["packages"]
    return packages


def test_every_vendored_file_is_as_its_package_ships_it() -> None:
    listed = {VENDOR / "MANIFEST.json"}
    for name, pkg in _manifest().items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", str(pkg["version"])), (name, pkg["version"])  # pinned exactly
        assert str(pkg["integrity"]).startswith("sha512-") and str(pkg["tarball"]).endswith(f"-{pkg['version']}.tgz")
        files = pkg["files"]
        assert isinstance(files, dict) and "LICENSE" in files, name
        for file, origin in files.items():
            path = VENDOR / str(pkg["dir"]) / file
            assert hashlib.sha256(path.read_bytes()).hexdigest() == origin["sha256"], f"{path} was changed"
            listed.add(path)
    assert {p for p in VENDOR.rglob("*") if p.is_file()} == listed  # nothing unlisted


def test_the_licences_are_listed() -> None:
    text = (STATIC / "LICENSE.txt").read_text()
    for name, pkg in _manifest().items():
        assert f"{name} {pkg['version']}" in text and f"vendor/{pkg['dir']}/LICENSE" in text, name
        assert pkg["license"] == "MIT" and "MIT License" in text
        assert "Permission is hereby granted" in (VENDOR / str(pkg["dir"]) / "LICENSE").read_text()


def test_the_vendored_files_are_packaged() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "worker.dashboard"
    ]
    packaged = {p for pat in patterns for p in STATIC.parent.glob(pat)}
    assert {p for p in VENDOR.rglob("*") if p.is_file()} <= packaged
