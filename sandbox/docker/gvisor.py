"""gVisor's platforms on a Docker engine: which registered runtime runs a spec's platform,
and which platform a running sandbox really uses.

gVisor intercepts a sandbox's system calls through a *platform*: ``systrap`` (its default
since mid-2023: seccomp traps, and stub threads that switch to the sandbox kernel without
a ptrace stop), ``ptrace`` (every system call a ptrace stop: the slowest, works
everywhere) or ``kvm`` (hardware virtualization: needs a usable ``/dev/kvm``, bare metal
or nested virtualization). The platform is an argument of ``runsc`` itself, and Docker
cannot pass runtime arguments per container, so each platform is a runtime of its own in
the engine's ``daemon.json``: ``runsc-systrap``, ``runsc-ptrace``, ``runsc-kvm`` (what
``loom-worker setup --register-gvisor`` and ``scripts/setup`` register), with ``runsc``
itself registered for the default platform. :func:`engine_runtime` picks the one for a
spec's ``gvisor_platform``: ``runsc-<platform>``, else ``runsc`` when it is registered for
that platform; none, and the worker refuses to start the sandbox.

What a sandbox runs with is then checked, not assumed (:func:`platform_in_effect`): the
container's main process is gVisor's sandbox process (``runsc-sandbox ... boot``), started
by the engine with the runtime's arguments; its command line says the platform it booted
with. Where this process cannot see the engine's processes (it runs in another pid
namespace), the runtime's arguments as the engine reports them stand in.
"""

from __future__ import annotations

from typing import Any

from ..errors import RuntimeUnavailableError

#: The platforms, fastest first where they work (bench/*.py, docs/benchmarks.md).
PLATFORMS = ("systrap", "ptrace", "kvm")
#: The platform of a runsc registered without ``--platform`` (gVisor's default since its
#: 2023 releases; scripts/setup installs one of those).
RUNSC_DEFAULT = "systrap"
FAMILY = "runsc"


def runtime_names(info: dict[str, Any]) -> set[str]:
    """The OCI runtimes of an engine's ``docker info``, with ``runsc`` also when gVisor is
    registered only per platform (``runsc-systrap``...)."""
    names = set((info.get("Runtimes") or {}).keys())
    if any(n.startswith(FAMILY + "-") for n in names):
        names.add(FAMILY)
    return names


def runtime_name(platform: str) -> str:
    """The engine runtime registered for ``platform`` alone (``runsc-systrap``)."""
    return f"{FAMILY}-{platform}"


def runtime_args(entry: object) -> list[str]:
    """The ``runtimeArgs`` of an engine runtime entry (``docker info``'s ``Runtimes``)."""
    args = entry.get("runtimeArgs") if isinstance(entry, dict) else None
    return [a for a in args or [] if isinstance(a, str)]


def platform_of_args(args: list[str]) -> str:
    """The platform runsc runs with given these arguments (the last ``--platform`` wins,
    as in runsc's own flag parsing; none: gVisor's default)."""
    found = RUNSC_DEFAULT
    for i, a in enumerate(args):
        if a.startswith(("--platform=", "-platform=")):
            found = a.split("=", 1)[1]
        elif a in ("--platform", "-platform") and i + 1 < len(args):
            found = args[i + 1]
    return found


def engine_runtime(runtimes: dict[str, Any], platform: str) -> str:
    """The name of the engine runtime that runs gVisor on ``platform``: ``runsc-<platform>``
    when registered, else ``runsc`` when it is registered for that platform.

    Raises RuntimeUnavailableError (no gVisor at all, or none on that platform, or a
    ``runsc-<platform>`` registered with another platform), naming what is registered.
    """
    if platform not in PLATFORMS:
        raise RuntimeUnavailableError(f"unknown gVisor platform {platform!r} (one of {', '.join(PLATFORMS)})")
    own = runtime_name(platform)
    if own in runtimes:
        got = platform_of_args(runtime_args(runtimes[own]))
        if got != platform:
            raise RuntimeUnavailableError(
                f"the engine's {own} runtime is registered with --platform={got}, not {platform}; refusing to run. "
                f"Fix its runtimeArgs in /etc/docker/daemon.json (`loom-worker setup --register-gvisor` does) "
                "and reload the engine."
            )
        return own
    if FAMILY in runtimes and platform_of_args(runtime_args(runtimes[FAMILY])) == platform:
        return FAMILY
    registered = {name: platform_of_args(runtime_args(e)) for name, e in runtimes.items() if _is_gvisor(name)}
    if not registered:
        raise RuntimeUnavailableError(
            "gVisor (runsc) was requested but the Docker engine has no runsc runtime registered; refusing to run "
            "without it. Run scripts/setup (it installs the runsc this project needs, not bookworm's, whose statx "
            "breaks `ls -l`, and registers it in /etc/docker/daemon.json), or set LOOM_RUNTIME=runc."
        )
    have = ", ".join(f"{name} (--platform={p})" for name, p in sorted(registered.items()))
    raise RuntimeUnavailableError(
        f"gVisor's {platform} platform was requested (LOOM_GVISOR_PLATFORM={platform}) but the engine has no runtime "
        f"for it (registered: {have}); refusing to run on another platform. Register {own} "
        f"(`sudo loom-worker setup --register-gvisor`, then reload the engine), or set LOOM_GVISOR_PLATFORM to a "
        "registered one."
    )


def _is_gvisor(name: str) -> bool:
    return name == FAMILY or name.startswith(FAMILY + "-")


def platform_in_effect(pid: int) -> str | None:
    """The platform gVisor's sandbox process ``pid`` (the container's main process, as
    the engine reports it) booted with, from its command line; None when this process
    cannot read it (another pid namespace) or ``pid`` is not a gVisor sandbox process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    if not argv or "runsc" not in argv[0] or "boot" not in argv:
        return None
    return platform_of_args(argv[: argv.index("boot")])


def check_platform(
    container: Any, runtimes: dict[str, Any], platform: str, *, read_process: bool = True
) -> tuple[str, str]:
    """That ``container`` (inspected after its start) runs gVisor on ``platform``.
    Returns (the platform in effect, how it was seen: "process" or "registration").

    Raises RuntimeUnavailableError when it runs another platform, or a runtime that is
    not gVisor at all."""
    host = (container.attrs or {}).get("HostConfig") or {}
    name = host.get("Runtime") or ""
    if not _is_gvisor(name):
        raise RuntimeUnavailableError(f"gVisor was requested but the sandbox runs on runtime {name!r}; refusing to run")
    pid = ((container.attrs or {}).get("State") or {}).get("Pid") or 0
    seen = platform_in_effect(pid) if read_process and isinstance(pid, int) and pid > 0 else None
    how = "process"
    if seen is None:
        seen, how = platform_of_args(runtime_args(runtimes.get(name))), "registration"
    if seen != platform:
        raise RuntimeUnavailableError(
            f"gVisor's {platform} platform was requested (LOOM_GVISOR_PLATFORM) but the sandbox runs on {seen} "
            f"(runtime {name}, seen by its {how}); refusing to run"
        )
    return seen, how
