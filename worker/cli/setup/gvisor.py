"""gVisor for ``loom-worker setup``: is ``runsc`` registered with the engine, and, only when
asked (``--register-gvisor``), registering it in the engine's ``daemon.json``.

The engine reads ``daemon.json`` when it starts or is reloaded (SIGHUP); this module never
reloads or restarts it (that stops or disturbs every container of the machine's users):
it says how to.

The runtime's arguments are the ones the worker needs: ``--host-uds=open`` lets a sandbox
connect to its egress gateway's socket, mounted into it (gVisor refuses host sockets
otherwise); ``--network=none`` because a sandbox has no network of its own anyway. Not
``--oci-seccomp``: it would make gVisor apply the engine's default profile to every other
gVisor container too, stopping their threads (docs/seccomp.md). The
platform is gVisor's default (``scripts/setup`` adds ``--platform=ptrace`` for the kernel
of the machine it was written on).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .images import Step

#: The engine's configuration file (rootful Docker; rootless: ~/.config/docker/daemon.json).
DAEMON_JSON = Path("/etc/docker/daemon.json")
RUNTIME = "runsc"
RUNTIME_ARGS = ["--network=none", "--host-uds=open"]
#: Where scripts/setup installs runsc; the PATH is searched first.
KNOWN_PATHS = ("/usr/local/lib/loom/runsc", "/usr/local/bin/runsc", "/usr/bin/runsc")
INSTALL = "https://gvisor.dev/docs/user_guide/install/"
RELOAD = "`sudo systemctl reload docker` (or `sudo kill -HUP $(pidof dockerd)`)"


def status(runtimes: dict[str, Any], runtime_in_use: str) -> Step:
    """Whether ``runsc`` is registered, and whether that is a problem (LOOM_RUNTIME=runsc)."""
    entry = runtimes.get(RUNTIME)
    if entry is None:
        detail = "not registered with the engine"
        fix = f"install runsc ({INSTALL}), then `sudo loom-worker setup --register-gvisor` and reload the engine"
        if runtime_in_use == RUNTIME:
            return Step("FAIL", "gVisor (runsc)", detail + ", and LOOM_RUNTIME=runsc asks for it", fix)
        return Step("skip", "gVisor (runsc)", f"{detail} (optional: sandboxes run under runc). To add it: {fix}")
    args = (entry.get("runtimeArgs") or []) if isinstance(entry, dict) else []
    detail = f"registered ({' '.join(args) or 'no arguments'})"
    if "--host-uds=open" not in args:
        return Step(
            "note",
            "gVisor (runsc)",
            detail + "; without --host-uds=open a sandbox under gVisor cannot reach its egress gateway",
            "`sudo loom-worker setup --register-gvisor` adds it",
        )
    use = "" if runtime_in_use == RUNTIME else "; LOOM_RUNTIME=runsc uses it"
    return Step("ok", "gVisor (runsc)", detail + use)


def find_runsc(given: str | None) -> str | None:
    """The runsc binary: ``given``, else on PATH, else where scripts/setup puts it."""
    if given:
        path = Path(given).expanduser()
        return str(path.resolve()) if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which(RUNTIME)
    if found:
        return str(Path(found).resolve())
    return next((p for p in KNOWN_PATHS if os.access(p, os.X_OK)), None)


def register(daemon_json: Path, runsc: str) -> Step:
    """Add (or correct) the ``runsc`` runtime in ``daemon_json``, keeping everything else
    in it. Nothing is written when it is already as wanted. The file is replaced
    atomically with its mode kept (0644 when new)."""
    what = "gVisor (runsc)"
    try:
        text = daemon_json.read_text() if daemon_json.exists() else ""
    except OSError as e:
        return Step("FAIL", what, f"cannot read {daemon_json}: {e.strerror}", "run as root")
    try:
        config = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        return Step("FAIL", what, f"{daemon_json} is not valid JSON ({e}); left as it is", "fix the file first")
    if not isinstance(config, dict) or not isinstance(config.get("runtimes", {}), dict):
        return Step("FAIL", what, f"{daemon_json}: not an object with a `runtimes` object; left as it is")
    want = {"path": runsc, "runtimeArgs": RUNTIME_ARGS}
    if config.get("runtimes", {}).get(RUNTIME) == want:
        return Step("ok", what, f"already registered in {daemon_json} as wanted")
    config.setdefault("runtimes", {})[RUNTIME] = want
    mode = daemon_json.stat().st_mode & 0o777 if daemon_json.exists() else 0o644
    tmp = None
    try:
        daemon_json.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".daemon.json.", dir=daemon_json.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        os.chmod(tmp, mode)
        os.replace(tmp, daemon_json)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return Step("FAIL", what, f"cannot write {daemon_json}: {e.strerror}", "run as root")
    return Step(
        "done",
        what,
        f"registered {runsc} ({' '.join(RUNTIME_ARGS)}) in {daemon_json}; the engine reads it when reloaded: "
        f"{RELOAD} (this command does not reload it)",
    )
