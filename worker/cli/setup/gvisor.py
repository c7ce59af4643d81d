"""gVisor for ``loom-worker setup``: are gVisor's runtimes registered with the engine, and,
only when asked (``--register-gvisor``), registering them in the engine's ``daemon.json``.

The engine reads ``daemon.json`` when it starts or is reloaded (SIGHUP); this module never
reloads or restarts it (that stops or disturbs every container of the machine's users):
it says how to.

gVisor's platform (systrap, ptrace, kvm: :mod:`sandbox.docker.gvisor`) is an argument of
runsc, and Docker cannot pass runtime arguments per container, so each platform gets a
runtime of its own: ``runsc-systrap`` and ``runsc-ptrace`` always, ``runsc-kvm`` where the
CPU offers hardware virtualization and ``/dev/kvm`` opens; ``runsc`` itself runs the
default platform (:data:`DEFAULT_PLATFORM`, ``LOOM_GVISOR_PLATFORM``'s default). The
worker picks the runtime of ``LOOM_GVISOR_PLATFORM``. Every runtime gets the arguments the
worker needs: ``--host-uds=open`` lets a sandbox connect to its egress gateway's socket,
mounted into it (gVisor refuses host sockets otherwise); ``--network=none`` because a
sandbox has no network of its own anyway. Not ``--oci-seccomp``: it would make gVisor
apply the engine's default profile to every other gVisor container too, stopping their
threads (docs/seccomp.md).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ...storage.atomic import write_atomic
from .images import Step

#: The engine's configuration file (rootful Docker; rootless: ~/.config/docker/daemon.json).
DAEMON_JSON = Path("/etc/docker/daemon.json")
RUNTIME = "runsc"
RUNTIME_ARGS = ["--network=none", "--host-uds=open"]
#: The platform ``runsc`` itself is registered with (the worker's default).
DEFAULT_PLATFORM = "systrap"
#: Where scripts/setup installs runsc; the PATH is searched first.
KNOWN_PATHS = ("/usr/local/lib/loom/runsc", "/usr/local/bin/runsc", "/usr/bin/runsc")
INSTALL = "https://gvisor.dev/docs/user_guide/install/"
RELOAD = "`sudo systemctl reload docker` (or `sudo kill -HUP $(pidof dockerd)`)"


def status(runtimes: dict[str, Any], runtime_in_use: str, platform: str = DEFAULT_PLATFORM) -> Step:
    """Whether gVisor is registered for ``platform`` (LOOM_GVISOR_PLATFORM), and whether
    that is a problem (LOOM_RUNTIME=runsc)."""
    from sandbox.docker import gvisor
    from sandbox.errors import RuntimeUnavailableError

    what = f"gVisor (runsc, {platform})"
    fix = f"install runsc ({INSTALL}), then `sudo loom-worker setup --register-gvisor` and reload the engine"
    try:
        name = gvisor.engine_runtime(runtimes, platform)
    except RuntimeUnavailableError as e:
        detail = str(e) if any(n.startswith(RUNTIME) for n in runtimes) else "not registered with the engine"
        if runtime_in_use == RUNTIME:
            return Step("FAIL", what, detail + ", and LOOM_RUNTIME=runsc asks for it", fix)
        return Step("skip", what, f"{detail} (optional: sandboxes run under runc). To add it: {fix}")
    args = gvisor.runtime_args(runtimes[name])
    detail = f"runtime {name} registered ({' '.join(args) or 'no arguments'})"
    if "--host-uds=open" not in args:
        return Step(
            "note",
            what,
            detail + "; without --host-uds=open a sandbox under gVisor cannot reach its egress gateway",
            "`sudo loom-worker setup --register-gvisor` adds it",
        )
    use = "" if runtime_in_use == RUNTIME else "; LOOM_RUNTIME=runsc uses it"
    return Step("ok", what, detail + use)


def kvm_usable() -> bool:
    """Whether gVisor's KVM platform can work here: the CPU offers hardware virtualization
    (``vmx``/``svm``; a virtual machine only with nested virtualization) and ``/dev/kvm``
    opens for reading and writing."""
    try:
        flags = {
            f
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
            for f in line.split()
        }
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return bool(flags & {"vmx", "svm"})


def wanted_runtimes(runsc: str, *, kvm: bool | None = None) -> dict[str, dict[str, Any]]:
    """The runtime entries setup registers: ``runsc`` on the default platform, and one per
    platform (kvm only where :func:`kvm_usable`, unless ``kvm`` says)."""
    platforms = ["systrap", "ptrace"] + (["kvm"] if (kvm_usable() if kvm is None else kvm) else [])
    out = {RUNTIME: {"path": runsc, "runtimeArgs": [f"--platform={DEFAULT_PLATFORM}", *RUNTIME_ARGS]}}
    for p in platforms:
        out[f"{RUNTIME}-{p}"] = {"path": runsc, "runtimeArgs": [f"--platform={p}", *RUNTIME_ARGS]}
    return out


def find_runsc(given: str | None) -> str | None:
    """The runsc binary: ``given``, else on PATH, else where scripts/setup puts it."""
    if given:
        path = Path(given).expanduser()
        return str(path.resolve()) if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which(RUNTIME)
    if found:
        return str(Path(found).resolve())
    return next((p for p in KNOWN_PATHS if os.access(p, os.X_OK)), None)


def register(daemon_json: Path, runsc: str, *, kvm: bool | None = None) -> Step:
    """Add (or correct) gVisor's runtimes (:func:`wanted_runtimes`) in ``daemon_json``,
    keeping everything else in it. Nothing is written when they are already as wanted.
    The file is replaced atomically with its mode kept (0644 when new)."""
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
    want = wanted_runtimes(runsc, kvm=kvm)
    have = config.get("runtimes", {})
    if all(have.get(name) == entry for name, entry in want.items()):
        return Step("ok", what, f"{', '.join(want)} already registered in {daemon_json} as wanted")
    config.setdefault("runtimes", {}).update(want)
    mode = daemon_json.stat().st_mode & 0o777 if daemon_json.exists() else 0o644
    try:
        daemon_json.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(daemon_json, json.dumps(config, indent=2) + "\n", mode=mode, fsync=False)
    except OSError as e:
        return Step("FAIL", what, f"cannot write {daemon_json}: {e.strerror}", "run as root")
    return Step(
        "done",
        what,
        f"registered {runsc} as {', '.join(want)} ({' '.join(RUNTIME_ARGS)}, one --platform each; runsc: "
        f"{DEFAULT_PLATFORM}) in {daemon_json}; the engine reads it when reloaded: {RELOAD} "
        "(this command does not reload it)",
    )
