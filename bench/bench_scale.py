"""Many workspaces, many callers: calls per second, latency, time until every workspace is
ready, and the worker's memory, through the Python API as a user runs it.

    .venv/bin/python bench/bench_scale.py [--workspaces 16,64,100] [--callers 32] [--seconds 10]
        [--rounds 3] [--tree PATH] [--runtime runc|runsc] [--loop asyncio|uvloop|worker]
        [--no-changelog] [--mix rws]

Each measurement is one fresh process (the worker, as a user's program would be): it
makes ``--workspaces`` directories, a ``default_registry()`` (changelog and call journal
on, as by default), starts every workspace at once (a ``shell_execute true`` in each, gathered:
"ready" is when the last one answered), then runs ``--callers`` concurrent callers for
``--seconds``, each cycling through ``read_file`` (4 KB), ``write_file`` (1 KB, a file of
its own) and ``shell_execute true`` on the workspaces in turn. It prints one JSON line;
this script runs those processes and prints the table: calls/s, p50 and p99 latency, ready
time, and the worker's resident memory after the load (``VmRSS``). Where the CPU of a call
goes: the worker's (and of that, the changelog's database thread), and the workspaces'
containers' (their cgroups), each per call. ``--mix w`` (or ``r``, ``s``) runs one kind of
call only, to see what each costs.

``--tree PATH`` runs the same load against another checkout of loom-worker (its
``.venv/bin/python`` when it has one, with ``PYTHONPATH=PATH``), alternating with this
one, round after round (the order flips every round), so both see the same machine;
the table then gives the medians per tree and the ratio of calls/s. The load only uses the
public API (``worker.default_registry``, ``ToolRegistry.execute``), so any version runs it.

``--pool`` (issue 44, warm sandboxes) measures instead, in one process per round, a new
workspace's time to its first result (``shell_execute true`` on a directory never seen
before: the registry opens it, its changelog, its sandbox) one after another,
``--pool-samples`` of them, p50 and p99, with the warm pool off and on: on as
``--pool-size`` says (``auto``, the default: ``LOOM_WARM_POOL=auto``, sized by the demand
it sees, which ``--pool-warmup`` unmeasured workspaces first make; or a number). Each
sample waits until the pool holds what it aims at, so no refill of an earlier claim shares
the machine with it, and the claimed workspaces stay open until the last. Then the time
until ``--pool-ready`` new workspaces, started at once, have all answered, with the pool
off and on (a pool of ``--pool-ready``, sized to hold them all). The same run gives both,
so the ratio is the pool's own.

``--floor`` (issue 44) adds the engine's own floor to the ready time, measured in the same
run between the workspaces' runs: as many bare containers of the same image started through
the engine's API (the Docker SDK, ``create`` + ``start`` of ``sleep``, network none, on the
same runtime), as many at once as the worker starts (``--parallel``, the worker's
``LOOM_MAX_PARALLEL_STARTS``), and prints ready / floor; and a second floor, as many of
loom's own containers (``container_config`` for a directory each: its mounts, seccomp
profile, limits, user, init) running ``sleep`` instead of the agent, so ready / that floor is
loom's own cost above what the engine spends on its containers. ``--breakdown`` times each step of
the workspaces' starts inside the worker (the slot wait, the engine's calls by name, the
agent's boot and hello, the direct channel, the changelog's first look, the first command)
and prints where the time above the floor goes. ``--ready-only`` stops after the
workspaces are ready (no load).

``--loop``: ``asyncio`` is ``asyncio.run(main())`` (a user's plain program, the default),
``uvloop`` is ``uvloop.run``, ``worker`` is ``worker.run`` where the tree has it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
READ_BODY = ("0123456789abcdef" * 4 + "\n") * 63  # 4,095 bytes
TOOLS = ("read_file", "write_file", "shell_execute")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def thread_cpu() -> dict[str, float]:
    """CPU seconds per thread name (``/proc/self/task``), to tell the event loop from the
    threads calls hand work to."""
    import re
    import threading

    names = {t.native_id: re.sub(r"_\d+$", "", t.name) for t in threading.enumerate()}
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                head, _, rest = f.read().rpartition(")")
        except OSError:
            continue
        name = names.get(int(tid)) or head.partition("(")[2]
        fields = rest.split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def container_cpu(roots: list[str]) -> float | None:
    """CPU seconds the workspaces' containers used so far (their cgroups' ``cpuacct``,
    cgroup v1 or v2), or None where that cannot be read."""
    import hashlib

    names = ["loom-sbx-" + hashlib.sha256(os.path.realpath(r).encode()).hexdigest()[:16] for r in roots]
    p = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", *names], capture_output=True, text=True)
    total = 0.0
    for cid in p.stdout.split():
        for path, scale in (
            (f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage", 1e-9),
            (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat", 1e-6),
        ):
            try:
                with open(path) as f:
                    text = f.read()
            except OSError:
                continue
            total += (int(text.split()[1]) if text.startswith("usage_usec") else int(text)) * scale
            break
        else:
            return None
    return total


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far (``/proc/stat``)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


# -- the worker process ---------------------------------------------------------------------

#: The steps of a workspace's start that ``--breakdown`` times: (module, attribute, label).
#: What a tree does not have is skipped (``--tree`` may be another version).
STEPS = [
    ("worker.registry.core", "ToolRegistry.execute", "first call, whole"),
    ("worker.registry.pool", "WorkspacePool.workspace", "workspace opened (settings, changelog, guard objects)"),
    ("worker.workspace", "Workspace._guard_first", "guard's first look"),
    ("worker.changelog.api", "Changelog.recover", "changelog: recover (interrupted intents)"),
    ("worker.changelog.api", "Changelog.before_shell", "changelog: before_shell (baseline, intent)"),
    ("worker.changelog.shellscan", "ShellTracker.build", "changelog: baseline scan"),
    ("worker.changelog.api", "Changelog.after_shell", "changelog: after_shell"),
    ("sandbox.client", "AgentSandbox.exec", "exec (incl. connecting on first use)"),
    ("sandbox.docker.backend", "DockerBackend._connect", "connect (incl. waiting for an agent slot)"),
    ("sandbox.docker.backend", "DockerBackend.ensure_container", "container found or created + started"),
    ("sandbox.docker.backend", "DockerBackend.prepare", "prepare (runtime check, runtime volume)"),
    ("sandbox.docker.engine", "Engine.call", "engine: {what}"),
    ("sandbox.docker.channel", "AgentChannels.attach_agent", "agent attached, booted, hello checked"),
    ("sandbox.connection", "AgentConnection.start", "agent boot payload to hello"),
    ("sandbox.docker.channel", "AgentChannels.go_direct", "direct channel (runc)"),
    ("sandbox.docker.channel", "AgentChannels.dial_direct", "direct channel (gVisor)"),
    ("sandbox.docker.backend", "verify_gvisor", "gVisor verified"),
]


def instrument(spans: dict[str, list[float]]) -> None:
    """Wrap each of :data:`STEPS` (async functions) so every call's duration (ms) lands in
    ``spans[label]``."""
    import functools
    import importlib

    for module, attr, label in STEPS:
        try:
            owner: Any = importlib.import_module(module)
        except ImportError:
            continue
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        orig = getattr(owner, name, None) if owner is not None else None
        if orig is None or not asyncio.iscoroutinefunction(orig):
            continue

        def wrap(orig: Any, label: str) -> Any:
            @functools.wraps(orig)
            async def timed(*a: Any, **kw: Any) -> Any:
                key = label
                if "{what}" in label:
                    what = a[1] if len(a) > 1 else kw.get("what", "?")
                    key = label.format(what=what)
                t = time.perf_counter()
                try:
                    return await orig(*a, **kw)
                finally:
                    spans.setdefault(key, []).append((time.perf_counter() - t) * 1000.0)

            return timed

        setattr(owner, name, wrap(orig, label))


async def load(args: argparse.Namespace) -> dict[str, Any]:
    from worker import default_registry

    spans: dict[str, list[float]] = {}
    if args.breakdown:
        instrument(spans)
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-scale-"))
    roots = []
    for i in range(args.workspaces):
        ws = tmp / f"ws{i:03d}"
        ws.mkdir()
        (ws / "read4k.txt").write_text(READ_BODY)
        roots.append(str(ws))
    overrides: dict[str, Any] = {"data_dir": tmp / "data", "runtime": args.runtime, "catalog": False}
    if args.image:
        overrides["image"] = args.image
    reg = default_registry(changelog=not args.no_changelog, **overrides)
    out: dict[str, Any] = {"workspaces": args.workspaces, "callers": args.callers}
    try:
        t = time.perf_counter()
        # (a command with a long timeout: a first call's deadline also covers its sandbox's start)
        ready = {"command": "true", "timeout": 300}
        first = await asyncio.gather(*(reg.execute("shell_execute", ready, w) for w in roots))
        out["ready_s"] = time.perf_counter() - t
        bad = [r.error for r in first if not r.success]
        if bad:
            raise SystemExit(f"{len(bad)} workspaces failed to start: {bad[0]}")
        out["rss_ready_mb"] = rss_mb()
        if args.breakdown:
            out["breakdown"] = {
                k: [len(v), statistics.median(v), statistics.fmean(v), sum(v) / 1000.0] for k, v in spans.items()
            }
        if args.ready_only:
            t = time.perf_counter()
            await asyncio.gather(*(reg.stop(w) for w in roots))
            out["stop_s"] = time.perf_counter() - t
            return out
        content = "x" * 1000 + "\n"
        mix = ["rws".index(c) for c in args.mix]
        calls: list[tuple[int, float]] = []
        errors: list[str] = []
        stop_at = 0.0

        async def caller(c: int) -> None:
            k = 0
            while time.perf_counter() < stop_at:
                ws = roots[(c + k * args.callers) % len(roots)]
                kind = mix[k % len(mix)]
                if kind == 0:
                    name, arguments = "read_file", {"path": "read4k.txt"}
                elif kind == 1:
                    name, arguments = "write_file", {"path": f"w{c}.txt", "content": f"{k}\n{content}"}
                else:
                    name, arguments = "shell_execute", {"command": "true"}
                t0 = time.perf_counter()
                r = await reg.execute(name, arguments, ws)
                calls.append((kind, time.perf_counter() - t0))
                if not r.success:
                    errors.append(f"{name}: {r.error}")
                k += 1

        # One second of the same load first, unmeasured (caches, the journal's files).
        stop_at = time.perf_counter() + args.warmup
        await asyncio.gather(*(caller(c) for c in range(args.callers)))
        calls.clear()
        profiler = None
        if args.profile:
            import cProfile

            profiler = cProfile.Profile(time.thread_time)  # the event loop's CPU, not its waits
            profiler.enable()
        threads, boxes, busy = thread_cpu(), container_cpu(roots), machine_busy()
        t, cpu = time.perf_counter(), time.process_time()
        stop_at = t + args.seconds
        await asyncio.gather(*(caller(c) for c in range(args.callers)))
        elapsed, cpu = time.perf_counter() - t, time.process_time() - cpu
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        if errors:
            raise SystemExit(f"{len(errors)} calls failed, first: {errors[0]}")
        ms = [d * 1000.0 for _k, d in calls]
        out.update(
            calls=len(calls),
            calls_per_s=len(calls) / elapsed,
            p50_ms=pct(ms, 0.5),
            p99_ms=pct(ms, 0.99),
            rss_mb=rss_mb(),
            cpu_ms_per_call=cpu * 1000.0 / max(1, len(calls)),
            sandbox_cpu_ms_per_call=(
                None
                if boxes is None or (after := container_cpu(roots)) is None
                else (after - boxes) * 1000.0 / max(1, len(calls))
            ),
            machine_busy=(machine_busy()[0] - busy[0]) / max(1, machine_busy()[1] - busy[1]),
            thread_cpu_ms_per_call={
                k: round((v - threads.get(k, 0.0)) * 1000.0 / max(1, len(calls)), 4)
                for k, v in thread_cpu().items()
                if v - threads.get(k, 0.0) > 0
            },
            per_tool={TOOLS[kind]: pct([d * 1000.0 for k, d in calls if k == kind], 0.5) for kind in range(len(TOOLS))},
            per_tool_calls={TOOLS[kind]: sum(1 for k, _d in calls if k == kind) for kind in range(len(TOOLS))},
        )
        t = time.perf_counter()
        await asyncio.gather(*(reg.stop(w) for w in roots))
        out["stop_s"] = time.perf_counter() - t
    finally:
        # Whatever happened, no sandbox of ours is left running.
        for w in roots:
            try:
                await reg.stop(w)
            except Exception as e:  # cleanup: report it, go on
                print(f"stop {w}: {e!r}", file=sys.stderr)
        await reg.aclose()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def child(args: argparse.Namespace) -> None:
    import logging

    logging.getLogger("worker").setLevel(logging.WARNING)
    logging.getLogger("sandbox").setLevel(logging.WARNING)
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(load(args))
    elif args.loop == "worker":
        import worker

        run = getattr(worker, "run", None)
        if run is None:
            from worker import aio

            run = aio.run
        result = run(load(args))
    else:
        result = asyncio.run(load(args))
    print(json.dumps(result))


# -- the driver ---------------------------------------------------------------------------


def run_child(tree: Path, args: argparse.Namespace, workspaces: int) -> dict[str, Any]:
    python = tree / ".venv" / "bin" / "python"
    exe = str(python) if python.exists() else sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(PYTHONPATH=str(tree), LOOM_LOG_LEVEL="warning")
    argv = [
        exe,
        str(Path(__file__).resolve()),
        "--child",
        *("--workspaces", str(workspaces), "--callers", str(args.callers)),
        *("--seconds", str(args.seconds), "--warmup", str(args.warmup)),
        *("--runtime", args.runtime, "--loop", args.loop, "--image", args.image or ""),
        *("--mix", args.mix),
    ]
    if args.no_changelog:
        argv.append("--no-changelog")
    if args.breakdown:
        argv.append("--breakdown")
    if args.ready_only:
        argv.append("--ready-only")
    env["LOOM_MAX_PARALLEL_STARTS"] = str(args.parallel)
    p = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"load against {tree} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def engine_floor(args: argparse.Namespace, n: int) -> float:
    """Seconds the engine takes to start ``n`` bare containers of the same image on the same
    runtime (create + start of ``sleep``, network none, through the Docker SDK from
    ``--parallel`` threads, as the worker starts its sandboxes); they are removed after,
    untimed."""
    import concurrent.futures
    import uuid

    from sandbox.docker import gvisor
    from sandbox.docker.engine import Engine

    engine = Engine(threads=args.parallel)
    api = engine.client().api
    runtime = "runc"
    if args.runtime == "runsc":
        platform = os.environ.get("LOOM_GVISOR_PLATFORM", "systrap")
        runtime = gvisor.engine_runtime(dict(api.info().get("Runtimes") or {}), platform)
    tag = "loom-bench-floor-" + uuid.uuid4().hex[:8]
    ids: list[str] = []

    def one(i: int) -> None:
        host = api.create_host_config(network_mode="none", runtime=runtime)
        c = api.create_container(
            args.image, command=["sleep", "600"], name=f"{tag}-{i:03d}", host_config=host, labels={tag: "1"}
        )
        ids.append(c["Id"])
        api.start(c["Id"])

    try:
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            t = time.perf_counter()
            list(pool.map(one, range(n)))
            took = time.perf_counter() - t
    finally:
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda cid: api.remove_container(cid, force=True), ids))
        engine.client().close()
    return took


def engine_floor_config(args: argparse.Namespace, n: int) -> float:
    """:func:`engine_floor` with loom's own container for each (``container_config`` of a
    directory each: its mounts, seccomp profile, limits, user, init) running ``sleep``
    instead of the agent: what the engine itself costs for loom's containers, so ready /
    this floor is loom's own cost (agent, hello, first call, locks)."""
    import concurrent.futures
    import uuid

    from sandbox.docker import DockerBackend
    from sandbox.spec import SandboxSpec

    backend = DockerBackend(SandboxSpec(image=args.image, runtime=args.runtime, owner="loom-bench-floor"))
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-floor-"))
    tag = "loom-bench-floor-" + uuid.uuid4().hex[:8]
    ids: list[str] = []
    try:
        asyncio.run(backend.prepare())
        cfgs = []
        for i in range(n):
            (tmp / f"ws{i:03d}").mkdir()
            cfg = backend.container_config(tmp / f"ws{i:03d}")
            cfg.update(name=f"{tag}-{i:03d}", entrypoint=["sleep", "600"], labels={**cfg["labels"], tag: "1"})
            cfgs.append(cfg)
        client = backend.engine.client()

        def one(cfg: dict[str, Any]) -> None:
            c = DockerBackend._create(client, cfg)
            ids.append(c.id)
            c.start()

        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            t = time.perf_counter()
            list(pool.map(one, cfgs))
            took = time.perf_counter() - t
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda cid: client.api.remove_container(cid, force=True), ids))
    finally:
        asyncio.run(backend.aclose())
        shutil.rmtree(tmp, ignore_errors=True)
    return took


def main(args: argparse.Namespace) -> None:
    trees = [("this", ROOT)]
    if args.tree:
        trees.append(("other", Path(args.tree).resolve()))
    sizes = [int(s) for s in args.workspaces.split(",")]
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    floors: dict[int, list[float]] = {}
    config_floors: dict[int, list[float]] = {}
    for r in range(args.rounds):
        for n in sizes:
            order = trees if r % 2 == 0 else trees[::-1]
            if args.floor:
                floor = engine_floor(args, n)
                floors.setdefault(n, []).append(floor)
                print(f"round {r + 1} engine floor, {n} bare containers: {floor:.2f} s", file=sys.stderr, flush=True)
                floor = engine_floor_config(args, n)
                config_floors.setdefault(n, []).append(floor)
                print(
                    f"round {r + 1} engine floor, {n} of loom's containers running sleep: {floor:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
            for label, tree in order:
                res = run_child(tree, args, n)
                results.setdefault((label, n), []).append(res)
                if args.ready_only:
                    print(f"round {r + 1} {label} {n} workspaces: ready {res['ready_s']:.2f} s", file=sys.stderr)
                    continue
                print(
                    f"round {r + 1} {label} ({tree}) {n} workspaces: {res['calls_per_s']:.0f} calls/s, "
                    f"p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.1f} ms, "
                    f"CPU/call {res['cpu_ms_per_call']:.3f} ms, "
                    f"ready {res['ready_s']:.2f} s, "
                    f"RSS {res['rss_mb']:.0f} MB",
                    file=sys.stderr,
                    flush=True,
                )

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(float(x[key]) for x in rows)

    if args.ready_only:
        if args.floor or args.breakdown:
            print_floor(args, trees, sizes, results, floors, config_floors)
        return
    kinds = {"r": "read_file 4 KB", "w": "write_file 1 KB", "s": "shell_execute true"}
    load_line = (
        f"{args.callers} callers, {' / '.join(kinds[c] for c in args.mix)} in turn, "
        f"{args.seconds:g} s, changelog {'off' if args.no_changelog else 'on'}, runtime {args.runtime}, "
        f"loop {args.loop}, medians of {args.rounds} round(s)"
    )
    print(f"\n{load_line}; trees: " + ", ".join(f"{label} = {tree}" for label, tree in trees) + "\n")
    print(
        "| tree | workspaces | calls/s | p50 (ms) | p99 (ms) | read / write / true p50 (ms) "
        "| worker CPU per call (ms) | of which the changelog's thread | sandboxes' CPU per call (ms) "
        "| ready (s) | worker RSS (MB) | calls/s vs other |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        for label, _tree in trees:
            rows = results[(label, n)]
            per = " / ".join(
                f"{statistics.median(x['per_tool'][t] for x in rows):.2f}" if rows[0]["per_tool_calls"][t] else "-"
                for t in TOOLS
            )
            ratio = ""
            if len(trees) > 1:
                other = "other" if label == "this" else "this"
                ratio = f"{med(rows, 'calls_per_s') / med(results[(other, n)], 'calls_per_s'):.2f}"
            print(
                f"| {label} | {n} | {med(rows, 'calls_per_s'):.0f} | {med(rows, 'p50_ms'):.2f} "
                f"| {med(rows, 'p99_ms'):.1f} | {per} | {med(rows, 'cpu_ms_per_call'):.3f} "
                f"| {_median_of(rows, 'changelog-db')} | {_median_of(rows, 'sandbox_cpu_ms_per_call')} "
                f"| {med(rows, 'ready_s'):.2f} | {med(rows, 'rss_mb'):.0f} "
                f"| {ratio} |"
            )
    if args.floor or args.breakdown:
        print_floor(args, trees, sizes, results, floors, config_floors)
    if len(trees) > 1 and not args.ready_only:
        print("\nper round, calls/s (this / other):")
        for n in sizes:
            pairs = zip(results[("this", n)], results[("other", n)], strict=True)
            print(
                f"  {n} workspaces: " + ", ".join(f"{a['calls_per_s']:.0f} / {b['calls_per_s']:.0f}" for a, b in pairs)
            )


def print_floor(
    args: argparse.Namespace,
    trees: list[tuple[str, Path]],
    sizes: list[int],
    results: dict[tuple[str, int], list[dict[str, Any]]],
    floors: dict[int, list[float]],
    config_floors: dict[int, list[float]],
) -> None:
    """Ready time against the engine's floors (same run), and with ``--breakdown`` where the
    workspaces' starts spend their time."""
    if floors:
        print_ready(args, trees, sizes, results, floors, "bare `sleep` containers of the image via the SDK")
        print_ready(args, trees, sizes, results, config_floors, "loom's own containers running `sleep`")
    if args.breakdown:
        print_breakdown(args, trees, sizes, results)


def print_ready(
    args: argparse.Namespace,
    trees: list[tuple[str, Path]],
    sizes: list[int],
    results: dict[tuple[str, int], list[dict[str, Any]]],
    floors: dict[int, list[float]],
    what: str,
) -> None:
    print(
        f"\nworkspaces ready against the engine's floor ({args.runtime}, {args.parallel} at a time, "
        f"medians of {args.rounds} round(s); image {args.image}; floor: {what})\n"
    )
    print("| tree | workspaces | ready (s) | engine floor (s) | ready / floor | per round: ready / floor (s) |")
    print("|---|---:|---:|---:|---:|---|")
    for n in sizes:
        fl = statistics.median(floors[n])
        for label, _tree in trees:
            rows = results[(label, n)]
            ready = statistics.median(float(x["ready_s"]) for x in rows)
            pairs = ", ".join(f"{x['ready_s']:.2f} / {f:.2f}" for x, f in zip(rows, floors[n], strict=False))
            print(f"| {label} | {n} | {ready:.2f} | {fl:.2f} | {ready / fl:.2f}x | {pairs} |")


def print_breakdown(
    args: argparse.Namespace,
    trees: list[tuple[str, Path]],
    sizes: list[int],
    results: dict[tuple[str, int], list[dict[str, Any]]],
) -> None:
    for n in sizes:
        for label, _tree in trees:
            rows = [x for x in results[(label, n)] if x.get("breakdown")]
            if not rows:
                continue
            keys = sorted(
                {k for x in rows for k in x["breakdown"]}, key=lambda k: -rows[0]["breakdown"].get(k, [0, 0, 0, 0])[3]
            )
            print(
                f"\nwhere {n} workspaces' starts go ({label}; each step's calls, p50 and mean per call, and its "
                f"time summed over the workspaces; {args.parallel} run at once; medians over rounds)\n"
            )
            print("| step | calls | p50 (ms) | mean (ms) | summed (s) |")
            print("|---|---:|---:|---:|---:|")
            for k in keys:
                vals = [x["breakdown"][k] for x in rows if k in x["breakdown"]]
                med = [statistics.median(v[i] for v in vals) for i in range(4)]
                print(f"| {k} | {med[0]:.0f} | {med[1]:.1f} | {med[2]:.1f} | {med[3]:.2f} |")


def _median_of(rows: list[dict[str, Any]], key: str) -> str:
    """The median of a CPU figure the load may not have (a tree without it, cgroups that
    cannot be read, the changelog off): ``changelog-db`` is the changelog's database
    thread in ``thread_cpu_ms_per_call``, anything else a top-level key."""
    vals = [
        (x.get("thread_cpu_ms_per_call") or {}).get(key, 0.0) if key == "changelog-db" else x.get(key) for x in rows
    ]
    got = [float(v) for v in vals if v is not None]
    return f"{statistics.median(got):.3f}" if got else ""


async def _pool_round(args: argparse.Namespace, pool: bool) -> dict[str, Any]:
    """One round of ``--pool``: first-result latencies and the time to ``--pool-ready``
    workspaces ready, with the warm pool off or on."""
    from worker import default_registry

    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-pool-"))
    n_ready = args.pool_ready
    cmd = {"command": "true", "timeout": 300}
    out: dict[str, Any] = {"pool": pool}

    def registry(leg: str, warm: str, cap: int) -> Any:
        return default_registry(
            data_dir=tmp / f"data-{leg}",
            runtime=args.runtime,
            catalog=False,
            image=args.image,
            warm_pool=warm if pool else "off",
            warm_pool_max=max(cap, 1),
        )

    async def pool_full(backend: Any, want: int | None = None) -> None:
        """Until the pool holds ``want`` ready (None: what it aims at now, every class)."""
        if not pool or backend.pool is None or backend.pool.disabled:
            return
        await backend.start_pool()
        while True:
            status = backend.pool_status()
            aim = want if want is not None else sum(c["target"] for c in status["classes"].values())
            if status["ready"] >= aim:
                return
            await asyncio.sleep(0.02)

    async def first(reg: Any, name: str) -> float:
        ws = tmp / name
        ws.mkdir()
        t = time.perf_counter()
        r = await reg.execute("shell_execute", cmd, str(ws))
        took = time.perf_counter() - t
        if not r.success:
            raise SystemExit(f"first result failed: {r.error}")
        return took

    regs: list[Any] = []
    try:
        # One new workspace after another, the pool as --pool-size says (auto: sized by the
        # demand it sees, which the unmeasured --pool-warmup workspaces start).
        sized = args.pool_size
        reg = registry("first", sized, n_ready if sized == "auto" else int(sized))
        regs.append(reg)
        lat: list[float] = []
        for i in range(args.pool_warmup):
            await pool_full(reg.backend)
            await first(reg, f"warm{i:03d}")
        for i in range(args.pool_samples):
            # Full again, so no refill of an earlier claim shares the machine with this one.
            await pool_full(reg.backend, None if sized == "auto" else int(sized))
            lat.append(await first(reg, f"first{i:03d}"))
        status = reg.backend.pool_status() if pool else None
        out["pool_held"] = status["ready"] if status else 0
        for w in reg.pool.opened():
            await reg.stop(w)
        out["first_p50_ms"] = pct(lat, 0.5) * 1000
        out["first_p99_ms"] = pct(lat, 0.99) * 1000
        # Then --pool-ready at once, the pool sized to hold them all.
        reg = registry("ready", str(n_ready), n_ready)
        regs.append(reg)
        await pool_full(reg.backend, n_ready)
        roots = []
        for i in range(n_ready):
            (tmp / f"ready{i:03d}").mkdir()
            roots.append(str(tmp / f"ready{i:03d}"))
        t = time.perf_counter()
        res = await asyncio.gather(*(reg.execute("shell_execute", cmd, w) for w in roots))
        out["ready_s"] = time.perf_counter() - t
        bad = [r.error for r in res if not r.success]
        if bad:
            raise SystemExit(f"{len(bad)} workspaces failed to start: {bad[0]}")
        status = reg.backend.pool_status() if pool else None
        out["claims"] = status["claims"] if status else 0
        out["misses"] = status["misses"] if status else 0
        for w in roots:
            await reg.stop(w)
    finally:
        for reg in regs:
            for w in reg.pool.opened():
                await reg.stop(w)
            await reg.aclose()
        if pool:
            # The pool directory's own mounts outlive a worker until `gc --all` (its claimed
            # sandboxes may live on); this run's are all stopped: undo them, or the tree stays.
            from sandbox.docker import hostmounts

            for leg in ("first", "ready"):
                await asyncio.to_thread(hostmounts.release_root, tmp / f"data-{leg}" / "pool")
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def pool_main(args: argparse.Namespace) -> None:
    rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for r in range(args.rounds):
        for pool in (False, True) if r % 2 == 0 else (True, False):
            res = asyncio.run(_pool_round(args, pool))
            rows[pool].append(res)
            print(
                f"round {r + 1} pool {'on' if pool else 'off'}: first result p50 {res['first_p50_ms']:.1f} ms, "
                f"p99 {res['first_p99_ms']:.1f} ms (warm when the samples ended: {res['pool_held']}); "
                f"{args.pool_ready} ready {res['ready_s']:.2f} s (claims {res['claims']}, misses {res['misses']})",
                file=sys.stderr,
                flush=True,
            )

    def med(pool: bool, key: str) -> float:
        return statistics.median(float(x[key]) for x in rows[pool])

    print(
        f"\nnew workspace to first result ({args.runtime}, {args.pool_samples} one after another, the pool "
        f"{'sized by demand (auto)' if args.pool_size == 'auto' else 'of ' + args.pool_size}; medians of "
        f"{args.rounds} rounds) and {args.pool_ready} new workspaces at once until all answered (a pool of "
        f"{args.pool_ready})"
    )
    print(f"{'':<10} {'first p50':>10} {'first p99':>10} {'ready':>8}")
    for pool in (False, True):
        print(
            f"{'pool ' + ('on' if pool else 'off'):<10} {med(pool, 'first_p50_ms'):>8.1f}ms "
            f"{med(pool, 'first_p99_ms'):>8.1f}ms {med(pool, 'ready_s'):>7.2f}s"
        )
    print(
        f"{'on/off':<10} {med(True, 'first_p50_ms') / med(False, 'first_p50_ms'):>9.2f}x "
        f"{med(True, 'first_p99_ms') / med(False, 'first_p99_ms'):>9.2f}x "
        f"{med(True, 'ready_s') / med(False, 'ready_s'):>7.2f}x"
    )


def _pool_size(text: str) -> str:
    if text == "auto" or (text.isdigit() and int(text) > 0):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is neither auto nor a positive number")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workspaces", default="16,64,100", help="comma-separated workspace counts")
    ap.add_argument("--callers", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of unmeasured load first")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", help="another loom-worker checkout to run the same load against, alternating")
    ap.add_argument("--runtime", default="runc", choices=("runc", "runsc"))
    ap.add_argument("--image", default=os.environ.get("LOOM_IMAGE", "loom-sandbox:latest"))
    ap.add_argument("--loop", default="asyncio", choices=("asyncio", "uvloop", "worker"))
    ap.add_argument("--no-changelog", action="store_true")
    ap.add_argument("--floor", action="store_true", help="also measure the engine's floor: bare container starts")
    ap.add_argument("--breakdown", action="store_true", help="time each step of the workspaces' starts")
    ap.add_argument("--ready-only", action="store_true", help="stop once the workspaces are ready (no load)")
    ap.add_argument(
        "--parallel",
        type=int,
        default=int(os.environ.get("LOOM_MAX_PARALLEL_STARTS", "16")),
        help="starts at once: the worker's LOOM_MAX_PARALLEL_STARTS and the floor's threads (default 16)",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--mix",
        default="rws",
        help="the calls each caller makes in turn: r (read_file 4 KB), w (write_file 1 KB), s (shell_execute true); "
        "'w' alone measures writes (default rws)",
    )
    ap.add_argument("--profile", help=argparse.SUPPRESS)  # child: cProfile the measured load to this file
    ap.add_argument("--pool", action="store_true", help="measure new workspaces with the warm pool off and on")
    ap.add_argument("--pool-samples", type=int, default=30, help="--pool: new workspaces one after another")
    ap.add_argument("--pool-ready", type=int, default=100, help="--pool: new workspaces started at once")
    ap.add_argument(
        "--pool-size",
        default="auto",
        type=_pool_size,
        help="--pool: the warm pool of the one-after-another leg: auto (LOOM_WARM_POOL=auto, sized by demand) or N",
    )
    ap.add_argument(
        "--pool-warmup",
        type=int,
        default=3,
        help="--pool: unmeasured new workspaces before the samples (the demand an auto pool is sized by)",
    )
    args = ap.parse_args()
    if not args.mix or set(args.mix) - set("rws"):
        ap.error(f"--mix: letters r, w and s only (got {args.mix!r})")
    return args


if __name__ == "__main__":
    a = parse_args()
    if a.child:
        if isinstance(a.workspaces, str):
            a.workspaces = int(a.workspaces)
        child(a)
    elif a.pool:
        pool_main(a)
    else:
        main(a)
