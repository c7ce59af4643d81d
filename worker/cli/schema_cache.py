"""``loom-worker tools`` from a cache: the listing is the same on every run until the code,
the settings or a file the tool catalog reads changes, while building it imports
pydantic, the registry and the MCP SDK (about 0.7 s, against about 40 ms from here).

One file per key (:func:`worker.localworker.identity.daemon_key`: this user, the code,
the settings' environment) and format, in the user's run directory (mode 0600, written
to a temporary name and renamed). Each holds the paths its listing was built from and
their fingerprints (:mod:`worker.localworker.inputs`); a listing whose files changed
since is built again. A listing that logged a problem (a custom tool file that does not
load) is not cached, so the warning is shown every time, as before. Without a usable run
directory, nothing is cached.

Standard library only on the path of a hit.
"""

from __future__ import annotations

import json
import os

from ..localworker.identity import daemon_key
from ..localworker.inputs import fingerprint
from ..localworker.rundir import RunDirError, run_dir

#: Bumped when the file's layout changes.
VERSION = 1
#: Listings kept per user (the oldest go first: each code change makes a new key).
KEEP = 32


def _path(fmt: str) -> str | None:
    try:
        directory, _notes = run_dir()
    except RunDirError:
        return None
    return f"{directory}/tools-{daemon_key('docker')}-{fmt}.json"


def load(fmt: str) -> str | None:
    """The cached listing in ``fmt``, or None (none, or out of date)."""
    path = _path(fmt)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("v") != VERSION or not isinstance(entry.get("text"), str):
        return None
    inputs = entry.get("inputs")
    if not isinstance(inputs, list) or json.loads(json.dumps(fingerprint(inputs))) != entry.get("fingerprint"):
        return None
    text: str = entry["text"]
    return text


def store(fmt: str, text: str, inputs: list[str]) -> None:
    """Cache ``text`` as the listing in ``fmt``, built from the files ``inputs``. Best
    effort: a cache that cannot be written is no error."""
    path = _path(fmt)
    if path is None:
        return
    entry = {"v": VERSION, "inputs": inputs, "fingerprint": fingerprint(inputs), "text": text}
    from ..storage.atomic import write_atomic

    try:
        write_atomic(path, json.dumps(entry, ensure_ascii=False), fsync=False)
    except OSError:
        pass
        return
    _prune(os.path.dirname(path))


def _prune(directory: str) -> None:
    try:
        names = [n for n in os.listdir(directory) if n.startswith("tools-") and n.endswith(".json")]
        if len(names) <= KEEP:
            return
        by_age = sorted(names, key=lambda n: os.stat(os.path.join(directory, n)).st_mtime)
        for name in by_age[: len(names) - KEEP]:
            os.unlink(os.path.join(directory, name))
    except OSError:
        pass
