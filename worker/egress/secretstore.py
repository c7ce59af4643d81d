"""Where secrets are kept on the host, and how.

::

    $LOOM_DATA_DIR/secrets.json                      process-wide defaults (every workspace)
    $LOOM_DATA_DIR/workspaces/<hash>/secrets.json    one workspace's (a name here wins)

Never in a workspace, never mounted into a sandbox. JSON, mode 0600, in directories of
mode 0700, written atomically (temp file, fsync, rename) under an ``flock`` so the CLI and
a running service never lose each other's changes. At rest a value is plain text
protected by those permissions (as git's credential store and Docker's config.json are):
whoever can read the worker's data directory as its user or root can read the values. An
entry may instead name a file (``value_file``: a Docker or systemd credential on a tmpfs,
say), read at each use, so the value is never written to the data directory at all.

Raises :class:`~worker.egress.secrets.SecretError` (a refused secret, a file edited into
something invalid) and OSError.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..changelog.recorder import workspace_dir
from ..storage.atomic import write_atomic
from .secrets import Secret, SecretError, check_name, make_placeholder, parse_entry, parse_hosts

FILE = "secrets.json"
MAX_SECRETS = 64

Stamp = tuple[int, int, int] | None


def file_stamp(path: Path | str) -> Stamp:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class SecretStore:
    """The secrets files under one data directory: the defaults and each workspace's.
    Reads are cached by the file's (mtime, size, inode): one ``stat`` per look."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self._defaults = str(self.data_dir / FILE)
        self._cache: dict[Path, tuple[Stamp, dict[str, Secret]]] = {}
        # Each workspace's file by the path it was asked for: :meth:`stamp` runs on every
        # call, and naming the file (a realpath and a sha256) costs more than its stat.
        self._paths: dict[Path, str] = {}

    def path(self, workspace: Path | None) -> Path:
        """The file of ``workspace`` (None: the process-wide defaults)."""
        if workspace is None:
            return self.data_dir / FILE
        return workspace_dir(self.data_dir, workspace) / FILE

    def stamp(self, workspace: Path) -> tuple[Stamp, Stamp]:
        """What changes when either file that applies to ``workspace`` does."""
        path = self._paths.get(workspace)
        if path is None:
            path = self._paths[workspace] = str(self.path(workspace))
        return (file_stamp(path), file_stamp(self._defaults))

    def load(self, workspace: Path | None) -> dict[str, Secret]:
        """The secrets of one file, by name. Raises SecretError (a file edited into
        something invalid), OSError."""
        path = self.path(workspace)
        stamp = file_stamp(path)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        out: dict[str, Secret] = {}
        if stamp is not None:
            raw = self._read(path)
            scope = "default" if workspace is None else "workspace"
            for name, entry in raw.items():
                out[name] = parse_entry(name, entry, scope=scope, where=str(path))
        self._cache[path] = (stamp, out)
        return out

    def effective(self, workspace: Path) -> dict[str, Secret]:
        """The secrets that apply to ``workspace``: the defaults, then its own (a name
        of its own replaces a default). A file that does not parse counts as empty here
        (the gateway must keep working; ``load`` reports it)."""
        out: dict[str, Secret] = {}
        for scope in (None, workspace):
            try:
                out.update(self.load(scope))
            except (SecretError, OSError):
                continue
        return out

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            raise SecretError("secrets", f"{path} is not JSON") from None
        secrets = raw.get("secrets") if isinstance(raw, dict) else None
        if not isinstance(secrets, dict):
            raise SecretError("secrets", f'{path}: expected {{"secrets": {{NAME: {{...}}}}}}')
        return secrets

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[dict[str, Any]]:
        """The file's entries for a change, under an exclusive lock; written back
        atomically (0600) when the block ends without an exception."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = self._read(path) if path.exists() else {}
            yield entries
            body = json.dumps({"secrets": entries}, indent=2, sort_keys=True) + "\n"
            write_atomic(path, body)  # 0600
        finally:
            os.close(fd)

    def set(
        self,
        workspace: Path | None,
        name: str,
        *,
        hosts: list[str],
        header: str | None = None,
        query: str | None = None,
        value: str | None = None,
        value_file: str | None = None,
    ) -> Secret:
        """Create or change a secret (an existing one keeps its placeholder). Every field
        is checked before anything is written. Raises SecretError, OSError."""
        check_name(name)
        parse_hosts(hosts)
        path = self.path(workspace)
        entry: dict[str, Any] = {"hosts": list(hosts), "updated": round(time.time(), 3)}
        entry["header" if header is not None else "query"] = header if header is not None else query
        entry["value" if value is not None else "value_file"] = value if value is not None else value_file
        scope = "default" if workspace is None else "workspace"
        with self._locked(path) as entries:
            old = entries.get(name)
            placeholder = old.get("placeholder") if isinstance(old, dict) else None
            entry["placeholder"] = placeholder if isinstance(placeholder, str) else make_placeholder(name)
            secret = parse_entry(name, entry, scope=scope, where=str(path))  # SecretError: nothing written
            if old is None and len(entries) >= MAX_SECRETS:
                raise SecretError("name", f"at most {MAX_SECRETS} secrets here")
            if header is not None:
                entry["header"] = secret.header.text if secret.header else header
            entries[name] = entry
        return secret

    def delete(self, workspace: Path | None, name: str) -> bool:
        """Remove a secret; False when there was none of that name. Raises OSError,
        SecretError (the file does not parse)."""
        path = self.path(workspace)
        if not path.exists():
            return False
        with self._locked(path) as entries:
            return entries.pop(name, None) is not None
