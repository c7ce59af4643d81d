"""Sandbox subcommands: ``demo`` (the main job), ``doctor``, ``gc``, ``stop``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when a command runs: --help and `call` must not pay for them
    from pathlib import Path

    from ..settings import Settings


def _run(coro: Any) -> int:
    from .. import aio

    return int(aio.run(coro))


def _backend(settings: Settings, *, pool_root: bool = False, **overrides: Any) -> Any:
    """The Docker backend of ``settings``; with ``pool_root``, knowing where this data
    directory's warm pool lives (never refilling it), so that ``gc --all`` undoes that
    directory's own mounts whatever ``LOOM_WARM_POOL`` says now."""
    from dataclasses import replace

    from sandbox.docker import DockerBackend  # the Docker SDK only when a command needs it
    from sandbox.spec import SandboxSpec

    spec = SandboxSpec(**{**settings.sandbox_spec_kwargs(), **overrides})
    pool = replace(settings.pool_config(), mode="off") if pool_root else None
    return DockerBackend(spec, base_url=settings.docker_host, pool=pool)


def _say(msg: str = "") -> None:
    print(msg, flush=True)


# -- demo ----------------------------------------------------------------------------------


#: Who owns the scratch workspace the demo or doctor makes when run as root: nobody, so
#: its sandbox runs as a user would have it (a root-owned workspace runs as uid 0, and
#: the sandbox warns of it: a warning on the first screen of the main job).
SCRATCH_OWNER = (65534, 65534)


def _scratch_workspace(prefix: str) -> Path:
    """A new empty directory for a sandbox of the CLI's own, not root's. Raises OSError."""
    import tempfile
    from pathlib import Path

    ws = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        os.chown(ws, *SCRATCH_OWNER)
    return ws


async def _demo(settings: Settings, workspace: Path | None, runtime: str | None) -> int:
    import shutil

    from sandbox.base import ExecRequest
    from sandbox.errors import SandboxError

    from .common import workspace_registry

    overrides: dict[str, Any] = {"runtime": runtime} if runtime else {}
    own = workspace is None
    # A workspace of the user's: its running sandbox, made with its own settings (never
    # replaced by one made from the process's); a fresh directory: a sandbox of the demo's.
    backend = _backend(settings, **overrides) if own else None
    registry = None if own else workspace_registry(settings, **overrides)
    ws = _scratch_workspace("loom-demo-") if workspace is None else workspace
    ws = ws.resolve()
    try:
        t0 = time.perf_counter()
        if registry is not None:
            box = (await registry.workspace(ws)).sandbox
            spec: Any = registry.pool.backend
            spec = spec.spec_of(ws)
        else:
            assert backend is not None
            box, spec = await backend.get(ws), backend.spec
        _say(f"== loom-worker demo: a sandbox for workspace {ws} (runtime {spec.runtime})")
        info = await box.info()
        _say(f"cold start (container + agent): {(time.perf_counter() - t0) * 1000:.0f} ms")
        _say(f"agent: pid {info.pid}, uid {info.uid}, python {info.python}, kernel {info.kernel}")

        _say("\n-- write a file, read it back (through the in-container agent)")
        w = await box.write("hello/greeting.txt", b"hello from the host\n")
        r = await box.read("hello/greeting.txt")
        _say(f"wrote {w.size} bytes, read back: {r.data.decode().strip()!r}")

        _say("\n-- run a command")
        res = await box.exec(ExecRequest("python3 -c 'import sys; print(sys.version.split()[0])'; ls -la hello; id"))
        _say(res.stdout.decode().rstrip())
        t = []
        for i in range(70):
            s = time.perf_counter()
            await box.exec(ExecRequest("true"))
            if i >= 20:  # the first calls of a fresh container warm its caches
                t.append((time.perf_counter() - s) * 1000)
        t.sort()
        _say(f"exec `true` p50 over 50 calls: {t[len(t) // 2]:.2f} ms (one `docker exec` is ~40 ms)")

        _say("\n-- the limits, seen from inside")
        checks = {
            "network": "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 2)\" 2>&1 | tail -1",
            "capabilities": "grep CapEff /proc/self/status",
            "root filesystem": "touch /usr/bin/x 2>&1",
            "processes (pids limit)": "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
            "memory limit": "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null "
            "|| cat /sys/fs/cgroup/memory.max",
        }
        for name, cmd in checks.items():
            out = (await box.exec(ExecRequest(cmd))).stdout.decode().strip() or "(none)"
            _say(f"{name:>24}: {out}")

        _say("\n-- a runaway command: `setsid sleep 600 & sleep 600` with a 2 s timeout")
        res = await box.exec(ExecRequest("setsid sleep 600 & nohup sleep 600 >/dev/null 2>&1 & sleep 600", timeout=2))
        left = (await box.exec(ExecRequest("ps -eo args | grep -c '^sleep' || true"))).stdout.decode().strip()
        _say(f"outcome={res.outcome} after {res.duration_ms:.0f} ms; sleep processes left: {left}")
        _say("\ndemo ok")
        return 0
    except SandboxError as e:
        print(f"demo failed: {e}", file=sys.stderr)
        print("run `loom-worker doctor` to see what is missing", file=sys.stderr)
        return 1
    finally:
        if backend is not None:
            await backend.stop(ws)
            shutil.rmtree(ws, ignore_errors=True)
            await backend.aclose()
        if registry is not None:
            with contextlib.suppress(Exception):
                await (await registry.workspace(ws)).check()  # the demo wrote there
            await registry.aclose()


# -- doctor --------------------------------------------------------------------------------


async def _doctor(settings: Settings, fix: bool = False) -> int:
    import shutil

    from sandbox.base import ExecRequest
    from sandbox.client import AgentSandbox
    from sandbox.errors import SandboxError, SandboxUnavailableError

    if fix:  # build or fetch what is missing first, then check everything
        import asyncio

        from .setup import run_setup

        await asyncio.to_thread(run_setup, settings)
        _say()
    backend = _backend(settings)
    problems = 0

    def line(ok: bool, what: str, detail: str, fix: str = "") -> None:
        nonlocal problems
        problems += 0 if ok else 1
        _say(f"[{'ok' if ok else 'FAIL'}] {what}: {detail}")
        if not ok and fix:
            _say(f"       fix: {fix}")

    # The CLI's local worker: never needed for correctness, so no problem counts here.
    from .daemon import describe, local_worker_report

    for ok, text in describe(local_worker_report("docker")):
        _say(f"[{'ok' if ok else 'warn'}] local worker (CLI): {text}")

    try:
        info = await backend.daemon_info()
    except SandboxUnavailableError as e:
        line(
            False,
            "docker daemon",
            str(e),
            "install and start Docker (https://docs.docker.com/engine/install/; on a fresh Debian machine "
            "scripts/setup does it)",
        )
        await backend.aclose()
        return 1
    line(True, "docker daemon", f"engine {info.get('ServerVersion')}, storage {info.get('Driver')}")
    has_image = await backend.image_exists()
    line(
        has_image,
        "sandbox image",
        settings.image,
        "`loom-worker setup` builds or pulls it (`loom-worker doctor --fix` does the same)",
    )
    _doctor_gvisor(dict(info.get("Runtimes") or {}), settings, line)
    if has_image:
        ws = _scratch_workspace("loom-doctor-")
        try:
            box = await backend.get(ws)
            res = await box.exec(ExecRequest("true"))
            in_effect = (
                f"gVisor on {settings.gvisor_platform}, as the sandbox process shows"
                if (settings.runtime == "runsc")
                else settings.runtime
            )
            line(res.outcome == "exit", "sandbox start", f"container + agent answer ({in_effect})")
            await _doctor_seccomp(backend, box, ws, info, settings.runtime, line)
            conn = await box.connection() if isinstance(box, AgentSandbox) else None
            if conn is not None:
                channel = (
                    "unix socket (direct)"
                    if conn.direct
                    else "engine attach stream"
                    + (
                        ""
                        if settings.runtime == "runsc" or not settings.direct_channel
                        else " (the agent's socket is not reachable from this process: no ptrace-read "
                        "access to the container, or the worker runs in another pid namespace)"
                    )
                )
                _say(f"[note] agent channel: {channel}")
        except SandboxError as e:
            line(False, "sandbox start", str(e))
        finally:
            await backend.stop(ws)
            shutil.rmtree(ws, ignore_errors=True)
    await _doctor_pool(backend, settings, line)
    from ..changelog.repair import survey

    for db, what in survey(settings.data_dir):
        line(not what.startswith("damaged"), "changelog", f"{db}: {what}")
    if os.geteuid() == 0 and settings.uid is None:
        _say("[note] running as root: root-owned workspaces run as uid 0 (no capabilities) inside the sandbox")
    await backend.aclose()
    return 0 if problems == 0 else 1


async def _doctor_pool(backend: Any, settings: Settings, line: Any) -> None:
    """The warm pool: whether this host allows it, and the warm sandboxes on the engine
    (they count against the engine's memory and pids like any other)."""
    from sandbox.errors import SandboxUnavailableError

    try:
        listed = await backend.list_sandboxes()
    except SandboxUnavailableError as e:
        line(False, "warm pool", f"the engine did not list its sandboxes: {e}", "check `docker ps -a`")
        return
    items = [i for i in listed if i.get("pooled") and i.get("owner") == backend.spec.owner]
    ready = sum(1 for i in items if i["workspace"] is None and i["status"] == "running")
    claimed = len(items) - ready
    counts = f"{ready} warm sandboxes ready, {claimed} claimed by workspaces"
    config = settings.pool_config()
    if config.mode == "off":
        _say(f"[note] warm pool: off (LOOM_WARM_POOL); {counts}")
        return
    # gVisor's gofer serves only the directory it opened at start: a claim moves a slot's
    # directory over the workspace's, which works for an empty one only (docs/sandbox.md).
    gvisor = "; under gVisor only an empty new workspace takes one" if settings.runtime != "runc" else ""
    reason = await backend.check_pool_host(config.root)
    line(
        reason is None,
        "warm pool",
        f"{settings.warm_pool} per class at {config.root}; {counts}{gvisor}" if reason is None else reason,
        "run the worker as root on the engine's host, or LOOM_WARM_POOL=off",
    )


def _doctor_gvisor(runtimes: dict[str, Any], settings: Settings, line: Any) -> None:
    """gVisor: the engine runtime for LOOM_GVISOR_PLATFORM, and the platforms registered.
    A problem only when LOOM_RUNTIME=runsc (a sandbox would be refused); the sandbox start
    below then checks the platform really in effect."""
    from sandbox.docker import gvisor
    from sandbox.errors import RuntimeUnavailableError

    platform = settings.gvisor_platform
    registered = {n: gvisor.platform_of_args(gvisor.runtime_args(e)) for n, e in runtimes.items() if "runsc" in n}
    have = ", ".join(f"{n} ({p})" for n, p in sorted(registered.items())) or "none"
    try:
        name = gvisor.engine_runtime(runtimes, platform)
    except RuntimeUnavailableError as e:
        optional = "" if settings.runtime == "runsc" else " (optional: runc in use)"
        line(
            settings.runtime != "runsc",
            "gVisor (runsc)",
            (str(e) if registered else "not registered") + optional,
            ""
            if registered
            else "install runsc (https://gvisor.dev/docs/user_guide/install/), then `sudo loom-worker setup "
            "--register-gvisor` (it registers a runtime per platform) and reload the engine",
        )
        return
    args = " ".join(gvisor.runtime_args(runtimes[name]))
    use = "" if settings.runtime == "runsc" else "; LOOM_RUNTIME=runsc uses it"
    line(True, "gVisor (runsc)", f"platform {platform} (LOOM_GVISOR_PLATFORM) on runtime {name} ({args}){use}")
    _say(f"[note] gVisor runtimes registered: {have}")
    if "--host-uds=open" not in args and "--host-uds=all" not in args:
        _say(f"[note] {name} lacks --host-uds=open: a sandbox allowed out could not reach its egress gateway")


async def _doctor_seccomp(backend: Any, box: Any, ws: Path, info: dict[str, Any], runtime: str, line: Any) -> None:
    """The sandbox's seccomp profile: kept by the engine, and in effect for the agent (a
    sandbox whose profile is not in effect does not start at all; this says which it is)."""
    from sandbox.docker import seccomp
    from sandbox.docker.checks import runsc_applies_seccomp

    attrs = await backend.inspect(ws) or {}
    kept = seccomp.in_security_opt((attrs.get("HostConfig") or {}).get("SecurityOpt"), runtime)
    mode = (await box.info()).extra.get("seccomp")
    name = f"loom profile {seccomp.digest(runtime)} ({runtime})"
    engine_runtime = (attrs.get("HostConfig") or {}).get("Runtime") or runtime
    if runtime == "runsc" and not runsc_applies_seccomp((info.get("Runtimes") or {}).get(engine_runtime)):
        _say(
            f"[note] seccomp profile: {name} passed, but runsc ignores it (not registered with --oci-seccomp): "
            "gVisor's own kernel decides what a sandboxed command may call (see docs/seccomp.md)"
        )
        return
    line(
        kept and mode == 2,
        "seccomp profile",
        f"{name} kept by the engine and in effect (agent: Seccomp {mode})"
        if kept and mode == 2
        else f"{name}: kept by the engine: {kept}, agent's seccomp mode: {mode!r} (2 expected)",
        "the engine must run containers with seccomp (`docker info`: Security Options)",
    )


# -- gc / stop -----------------------------------------------------------------------------


async def _gc(settings: Settings, all_running: bool, engine_wide: bool) -> int:
    from sandbox.errors import SandboxUnavailableError

    from ..snapshots import SnapshotError

    backend = _backend(settings, pool_root=True)
    try:
        if engine_wide:
            _say(
                "engine-wide: removing "
                + ("every loom sandbox" if all_running else "every exited or stale loom sandbox")
                + " on this engine, whichever data directory, user or service made it"
            )
            items = await backend.gc_engine_wide(all_running=all_running)
        else:
            items = [{"name": n} for n in await backend.gc(all_running=all_running)]
        volumes = await _gc_fork_volumes(backend, settings, engine_wide)
    except (SandboxUnavailableError, SnapshotError) as e:
        print(f"gc failed: {e}", file=sys.stderr)
        return 1
    finally:
        await backend.aclose()
    if engine_wide:
        for item in items:
            mine = " (this data directory's)" if item.get("owner") == backend.spec.owner else ""
            _say(
                f"removed {item['name']}: {item.get('status')}, workspace {item.get('workspace')}, "
                f"owner {item.get('owner') or 'none'}{mine}"
            )
    removed = [item["name"] for item in items]
    _say(f"removed {len(removed)} sandbox container(s)" + (": " + ", ".join(removed) if removed else ""))
    if volumes:
        _say(f"removed {len(volumes)} orphaned fork volume(s): " + ", ".join(volumes))
    return 0


async def _gc_fork_volumes(backend: Any, settings: Settings, engine_wide: bool) -> list[str]:
    """The fork volumes no fork is (``worker.snapshots.overlay.gc``): a live fork is a
    workspace, never garbage, even with --all. Raises SnapshotError, DaemonUnavailableError."""
    import asyncio

    from ..snapshots import overlay
    from ..snapshots.index import Index

    path = settings.data_dir / "snapshots"
    index = await asyncio.to_thread(Index, path) if (path / "index.sqlite3").exists() else None

    async def recorded(mountpoint: str) -> bool:
        return index is not None and await asyncio.to_thread(index.origin, mountpoint) is not None

    try:
        return await overlay.gc(backend, settings.data_dir, recorded, engine_wide=engine_wide)
    finally:
        if index is not None:
            index.close()


async def _stop(settings: Settings, workspace: Path) -> int:
    from sandbox.errors import SandboxUnavailableError

    backend = _backend(settings)
    try:
        stopped = await backend.stop(workspace)
    except SandboxUnavailableError as e:
        print(f"stop failed: {e}", file=sys.stderr)
        return 1
    finally:
        await backend.aclose()
    _say("stopped" if stopped else "no sandbox was running for this workspace")
    return 0


def _existing_dir(value: str) -> Path:
    from pathlib import Path

    p = Path(value).expanduser()
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"workspace {value!r} is not a directory")
    return p.resolve()


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "demo",
        help="Show a workspace sandbox at work: command, files, limits.",
        epilog="Exit status: 0; 1 the sandbox failed (`loom-worker doctor` says why).",
    )
    p.add_argument("--workspace", type=_existing_dir, help="Use this directory (default: a temporary one).")
    p.add_argument("--runtime", choices=["runc", "runsc"], help="Override LOOM_RUNTIME.")
    p.set_defaults(func=lambda a, s: _run(_demo(s, a.workspace, a.runtime)))

    p = subparsers.add_parser(
        "doctor",
        help="Check the Docker daemon, the sandbox image, gVisor and the CLI's local worker.",
        epilog="Exit status: 0 everything the worker needs works; 1 something does not (the [FAIL] lines say what).",
    )
    p.add_argument(
        "--fix", action="store_true", help="First build or fetch what is missing, as `loom-worker setup` does."
    )
    p.set_defaults(func=lambda a, s: _run(_doctor(s, a.fix)))

    p = subparsers.add_parser(
        "gc",
        help="Remove this data directory's exited or stale sandbox containers and orphaned fork volumes.",
        description="Remove the sandbox containers this worker installation (its data directory, LOOM_DATA_DIR) "
        "made that have exited, whose workspace is gone or that an older worker version made, and the "
        "engine's fork volumes (overlay forks) of this data directory that no fork is any more (their layers "
        "gone, or no fork record names them). A live fork is a workspace, never removed here (even with --all): "
        "`loom-worker snapshot delete-fork` removes it. Sandboxes and fork volumes of another data directory, "
        "another user's worker or a service on the same engine are left alone, unless --engine-wide (fork "
        "volumes then: those whose layers are gone, which can never be mounted again).",
        epilog="Exit status: 0; 1 the engine does not answer, or did not remove a sandbox (one it is stuck on: "
        "the others are removed, the error names it).",
    )
    p.add_argument("--all", action="store_true", help="Also remove this data directory's running sandboxes.")
    p.add_argument(
        "--engine-wide",
        action="store_true",
        help="Every loom sandbox on the engine, whoever made it (other data directories, users and services: "
        "their calls in flight fail); each one removed is listed with its workspace and owner.",
    )
    p.set_defaults(func=lambda a, s: _run(_gc(s, a.all, a.engine_wide)))

    p = subparsers.add_parser(
        "stop",
        help="Stop and remove the sandbox of a workspace.",
        epilog="Exit status: 0 (also when none was running); 1 the engine does not answer; 2 usage error.",
    )
    p.add_argument("--workspace", "-w", type=_existing_dir, required=True, help="The workspace directory.")
    p.set_defaults(func=lambda a, s: _run(_stop(s, a.workspace)))
