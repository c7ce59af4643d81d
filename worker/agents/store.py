"""The host's agents store: agent CLIs installed from npm once, outside every workspace, and
mounted read-only into the sandboxes that ask for them (the workspace setting ``agents``).

Layout under ``<LOOM_DATA_DIR>/agents/``::

    <name>/<version>/            one install (never changed once in place)
        manifest.json            package, resolved version, integrity (npm's lock), size, installed_at
        node_modules/...         what ``npm install`` put there
        bin/<binary>             relative links to node_modules/.bin/<binary> (what goes on PATH)
    <name>/pinned                the version a sandbox gets (one line)
    .staging/<name>-<random>/    an install under way

An install is atomic: npm runs in a staging directory (:data:`Installer`, in a loom sandbox
for the real one: :mod:`.npm_install`), the result is checked and described, and only then
renamed to ``<name>/<version>`` and pinned; whatever fails removes the staging directory, so
a failed install leaves nothing half-made and the pinned one untouched.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..storage.atomic import write_atomic
from .catalog import AGENTS, AgentSpec, check_version

MANIFEST = "manifest.json"
PINNED = "pinned"
STAGING = ".staging"
#: Where npm keeps its cache during an install: inside the staging directory (the sandbox's
#: $HOME is too small for it), removed before the install is put in place.
NPM_CACHE = ".npm-cache"
_SAFE_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+-]{0,63}$")

Progress = Callable[[str], None]
#: ``installer(staging_dir, "package@version", progress)``: run ``npm install`` of that
#: spec with ``staging_dir`` as its project (its cache in ``staging_dir/.npm-cache``).
#: Raises :class:`InstallError` (or OSError) when it fails.
Installer = Callable[[Path, str, Progress], Awaitable[None]]


class InstallError(RuntimeError):
    """An install failed; nothing of it was kept."""


class UnknownAgent(ValueError):
    """A name not in :data:`~worker.agents.catalog.AGENTS`."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown agent {name!r} (known: {', '.join(AGENTS)})")
        self.name = name


@dataclass(frozen=True)
class Installed:
    """One install in the store."""

    name: str
    version: str
    package: str
    path: Path
    size: int  # bytes on disk
    installed_at: float  # Unix time
    integrity: str | None = None  # npm's lock: the package tarball's sha512
    pinned: bool = False

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def spec_of(name: str) -> AgentSpec:
    """The catalog entry of ``name``. Raises UnknownAgent."""
    try:
        return AGENTS[name]
    except KeyError:
        raise UnknownAgent(name) from None


def tree_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (links not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            total += st.st_blocks * 512 if st.st_blocks else st.st_size
    return total


class AgentStore:
    """The agents store at ``root`` (``<LOOM_DATA_DIR>/agents``); ``installer`` runs npm
    (needed by :meth:`install` only)."""

    def __init__(self, root: Path, *, installer: Installer | None = None) -> None:
        self.root = Path(root)
        self.installer = installer

    # -- reading -------------------------------------------------------------------------

    def pinned_version(self, name: str) -> str | None:
        """The version pinned for ``name`` (None: nothing installed)."""
        try:
            v = (self.root / name / PINNED).read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return v if _SAFE_VERSION.fullmatch(v) else None

    def _read(self, name: str, version: str, pinned: str | None) -> Installed | None:
        path = self.root / name / version
        try:
            m = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError):
            return None  # not an install (a stray directory): never listed, never mounted
        return Installed(
            name=name,
            version=version,
            package=str(m.get("package", "")),
            path=path,
            size=int(m.get("size", 0)),
            installed_at=float(m.get("installed_at", 0)),
            integrity=m.get("integrity"),
            pinned=version == pinned,
        )

    def installed(self) -> list[Installed]:
        """Every install, by name then install time."""
        out: list[Installed] = []
        if not self.root.is_dir():
            return out
        for name in sorted(AGENTS):
            d = self.root / name
            if not d.is_dir():
                continue
            pinned = self.pinned_version(name)
            for v in sorted(os.listdir(d)):
                if v != PINNED and _SAFE_VERSION.fullmatch(v):
                    got = self._read(name, v, pinned)
                    if got is not None:
                        out.append(got)
        out.sort(key=lambda i: (i.name, i.installed_at))
        return out

    def get(self, name: str) -> Installed | None:
        """The pinned install of ``name`` (None: none, or its directory is gone)."""
        v = self.pinned_version(name)
        return None if v is None else self._read(name, v, v)

    # -- changing ------------------------------------------------------------------------

    def pin(self, name: str, version: str) -> Installed:
        """Make ``version`` the one sandboxes get. Raises UnknownAgent, LookupError (not
        installed), OSError."""
        spec_of(name)
        got = self._read(name, version, version) if _SAFE_VERSION.fullmatch(version) else None
        if got is None:
            raise LookupError(f"{name} {version} is not installed")
        write_atomic(self.root / name / PINNED, version + "\n")
        return got

    def remove(self, name: str, version: str | None = None) -> list[str]:
        """Remove one version (default: every version) of ``name``; removing the pinned one
        unpins it. The versions removed. Raises UnknownAgent, LookupError, OSError."""
        spec_of(name)
        d = self.root / name
        versions = [i.version for i in self.installed() if i.name == name]
        if version is not None:
            if version not in versions:
                raise LookupError(f"{name} {version} is not installed")
            versions = [version]
        if not versions:
            raise LookupError(f"{name} is not installed")
        if self.pinned_version(name) in versions:
            (d / PINNED).unlink(missing_ok=True)  # first: no sandbox gets a half-removed one
        for v in versions:
            trash = self._staging_dir(f"rm-{name}")
            os.rename(d / v, trash)
            shutil.rmtree(trash, ignore_errors=True)
        return versions

    def _staging_dir(self, label: str) -> Path:
        staging = self.root / STAGING
        staging.mkdir(parents=True, exist_ok=True, mode=0o700)
        return staging / f"{label}-{secrets.token_hex(6)}"

    async def install(self, name: str, version: str | None = None, *, progress: Progress | None = None) -> Installed:
        """Install ``name`` at ``version`` (default: the registry's latest), put it in place
        and pin it. Raises UnknownAgent, ValueError (a bad version), InstallError (npm
        failed, or did not give the agent's executable), OSError."""
        spec = spec_of(name)
        wanted = check_version(version or "latest")
        say = progress or (lambda _m: None)
        if self.installer is None:
            raise InstallError("this store has no installer")
        stage = self._staging_dir(name)
        stage.mkdir(mode=0o755)
        try:
            # A project of its own, so npm installs here and not in a parent directory's.
            (stage / "package.json").write_text(json.dumps({"name": f"loom-agent-{name}", "private": True}) + "\n")
            say(f"installing {spec.package}@{wanted}")
            await self.installer(stage, f"{spec.package}@{wanted}", say)
            return await asyncio.to_thread(self._finish, name, spec, stage, say)
        finally:
            await asyncio.to_thread(shutil.rmtree, stage, True)

    def _finish(self, name: str, spec: AgentSpec, stage: Path, say: Progress) -> Installed:
        """Describe the staged install, link its bin/, rename it in place and pin it."""
        shutil.rmtree(stage / NPM_CACHE, ignore_errors=True)
        pkg_dir = stage / "node_modules" / spec.package
        try:
            meta = json.loads((pkg_dir / "package.json").read_text())
        except (OSError, ValueError) as e:
            raise InstallError(f"npm did not install {spec.package}: {e}") from None
        resolved = str(meta.get("version", ""))
        if not _SAFE_VERSION.fullmatch(resolved):
            raise InstallError(f"{spec.package} has an unusable version {resolved!r}")
        integrity = None
        try:
            lock = json.loads((stage / "package-lock.json").read_text())
            integrity = lock.get("packages", {}).get(f"node_modules/{spec.package}", {}).get("integrity")
        except (OSError, ValueError, AttributeError):
            pass
        bins = meta.get("bin")
        # npm's rule: a string "bin" is one executable named after the package.
        names = [spec.package.rsplit("/", 1)[-1]] if isinstance(bins, str) else list(bins or {})
        if spec.binary not in names:
            raise InstallError(f"{spec.package}@{resolved} has no executable {spec.binary!r} (it has: {names})")
        (stage / "bin").mkdir()
        for b in names:
            if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", b) and (stage / "node_modules" / ".bin" / b).exists():
                # Relative: the same link works at /opt/loom/agents/<name> in a sandbox.
                os.symlink(f"../node_modules/.bin/{b}", stage / "bin" / b)
        if not (stage / "bin" / spec.binary).exists():
            raise InstallError(f"npm did not link {spec.binary} (node_modules/.bin/{spec.binary} is missing)")
        size = tree_size(stage)
        manifest = {
            "name": name,
            "package": spec.package,
            "version": resolved,
            "integrity": integrity,
            "binary": spec.binary,
            "size": size,
            "installed_at": time.time(),
        }
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        say(f"installed {spec.package}@{resolved} ({size / 1e6:.0f} MB)")
        target = self.root / name / resolved
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        old = None
        if target.exists():
            # The same version again (a repair): the old one is swapped out, then removed.
            old = self._staging_dir(f"old-{name}")
            os.rename(target, old)
        os.rename(stage, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.pin(name, resolved)
