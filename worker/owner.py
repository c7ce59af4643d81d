"""The identity of this worker installation: whose sandboxes on a shared engine are ours.

Every sandbox container carries it as a label (``SandboxSpec.owner``), so that
``loom-worker gc`` removes only the sandboxes of its own data directory, never those of
another data directory, another user's worker or a service sharing the engine. It is a
random id kept in the data directory (not a hash of its path: two services in containers
both see their data directory as ``/data``), made on first use.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from pathlib import Path

#: The file in the data directory that holds the id.
OWNER_FILE = "owner-id"


def owner_id(data_dir: Path) -> str:
    """This installation's id, from ``data_dir``'s owner file, made there on first use
    (written whole under a temporary name and linked in, so two processes making it at
    once agree: the first link wins, the other reads it). Where the data directory cannot
    be written, a hash of its real path stands in. Never raises."""
    path = Path(data_dir) / OWNER_FILE
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return _fallback(data_dir)
    tmp = path.with_name(f".{OWNER_FILE}.{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(secrets.token_hex(8) + "\n", encoding="ascii")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process was first: its id it is
        return _read(path)
    except (OSError, ValueError):
        return _fallback(data_dir)
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass


def _read(path: Path) -> str:
    text = path.read_text(encoding="ascii").strip()
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", text):
        raise ValueError(f"{path}: not an owner id")
    return text


def _fallback(data_dir: Path) -> str:
    return "path-" + hashlib.sha256(os.fsencode(os.path.realpath(data_dir))).hexdigest()[:16]
