"""``scan``: the workspace's files and their stat rows, for the changelog's change
detection; with a snapshot key, only what changed since the previous scan. The same code
runs on the host for a gVisor sandbox's workspace (``sandbox.hostscan``)."""

import os
import threading

from . import paths, scanwalk, snapshot, state

_snapshots = {}  # type: dict  # by the requests' snapshot key (the host-side scans keep their own)
_scan_lock = threading.Lock()


def op_scan(req):
    dfd, parts = paths.open_dir(req.get("path", "."))
    prefix = "" if not parts else paths.rel(parts) + "/"
    try:
        with _scan_lock:
            # gVisor: edits made on the host side of the bind mount raise no event in the
            # sandbox, so only runc (the subreaper bit says which) watches.
            return scan_tree(dfd, prefix, req, _snapshots, state.subreaper)
    finally:
        os.close(dfd)


def put_known(key, path, put, st):
    """Run ``put()``, the rename that puts a write the host records in its changelog in
    place at ``path`` (its file's stat: ``st``), so that snapshot ``key``, when it watches
    the whole workspace and knows the path, takes the new file as already seen (see
    ``Snapshot.known_write``): the host's next command need not wait for the host to be
    handed its own write back. Raises what ``put`` raises."""
    with _scan_lock:
        snap = _snapshots.get(key)
        if snap is None or snap.params[0] != "." or not snap.takes_known(path):
            put()
            return
        snap.absorb()
        put()
        snap.known_write(path, st)


def params_of(req):
    """What a snapshot is kept for: (path, sorted excludes, file limit)."""
    exclude = set(req.get("exclude") or ())
    return (req.get("path", "."), tuple(sorted(exclude)), int(req.get("max_files", 100000)))


def scan_tree(dfd, prefix, req, snapshots, watch):
    """The work of ``op_scan`` on an open directory ``dfd`` (``prefix``: its path in the
    workspace), keeping snapshots in ``snapshots`` (caller holds their lock). Shared with
    the host, which scans a gVisor sandbox's workspace itself (sandbox/hostscan.py)."""
    exclude = set(req.get("exclude") or ())
    limit = int(req.get("max_files", 100000))
    key = req.get("snapshot")
    since = req.get("since")
    params = params_of(req)
    previous = snapshots.get(key) if key else None
    if previous is not None and previous.usable(params, since) and not req.get("walk"):
        delta = previous.refresh(dfd, prefix, exclude, limit)
        if delta is not None:
            previous.generation = os.urandom(8).hex()
            changed, removed = delta
            return {
                "entries": [[p, *v] for p, v in changed.items()],
                "removed": sorted(removed),
                "full": False,
                "truncated": False,
                "generation": previous.generation,
                "watched": True,
                "from_events": True,
            }
    # A full stat walk (first scan, a restart, a fallback, or no snapshot key).
    snap = snapshot.Snapshot(params, watch=bool(key) and watch)
    try:
        truncated = scanwalk.walk(dfd, prefix, exclude, snap.files, limit, snap if key else None)
    except BaseException:
        snap.close()
        raise
    if truncated:
        snap.broken = True
    current = snap.files
    snap.generation = generation = os.urandom(8).hex()
    if key:
        if previous is not None:
            previous.close()
        snapshots[key] = snap
    else:
        snap.close()
    watched = not snap.broken and snap.fd >= 0
    if previous is not None and since == previous.generation and params == previous.params:
        old = previous.files
        changed = [[p, *v] for p, v in current.items() if old.get(p) != v]
        removed = [p for p in old if p not in current]
        return {
            "entries": changed,
            "removed": removed,
            "full": False,
            "truncated": truncated,
            "generation": generation,
            "watched": watched,
        }
    return {
        "entries": [[p, *v] for p, v in current.items()],
        "removed": [],
        "full": True,
        "truncated": truncated,
        "generation": generation,
        "watched": watched,
    }
