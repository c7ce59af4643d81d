"""Snapshot and fork benchmark (issue 29): snapshot time, fork x8 time, the first call in
each fork, disk used by 8 untouched forks and a restore of 100 changed files, side by side
with ``cp -a`` of the same tree in the same run.

    .venv/bin/python bench/bench_fork.py [--files 20000] [--mb 500] [--source DIR] [--fs host,btrfs,xfs]
        [--rounds 3] [--forks 8] [--changed 100] [--runtime runc|runsc]

The tree is a real virtualenv (``--source``, default the one running this script: its
interpreter, pip, and this project's dependencies) copied in as ``.venv``, topped up with
small source files and larger blobs of random bytes to ``--files`` files and ``--mb`` MB
(``--source ''``: no virtualenv). Each filesystem gets a data directory and a workspace on
it: ``host`` is the temporary directory's own (ext4 on this VM: snapshots are plain copies,
forks overlay volumes the engine mounts),
``btrfs`` and ``xfs`` are loop-mounted images (root, btrfs-progs, xfsprogs). Medians of
``--rounds``. Targets: fork x8 <= 0.2x eight ``cp -a`` and <= 1 s on a copy-on-write host,
8 untouched forks <= 5 % of the tree in extra disk, restore of 100 changed files <= 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from worker import aio
from worker.registry import default_registry
from worker.settings import Settings
from worker.snapshots import Snapshots


def _used(path: Path) -> int:
    os.sync()
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _count(root: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            files += 1
            size += st.st_size
    return files, size


def make_tree(root: Path, source: str, files: int, mb: int) -> tuple[int, int]:
    """The benchmark's workspace; returns its files and bytes."""
    root.mkdir(parents=True)
    if source:
        subprocess.run(["cp", "-a", "--no-target-directory", source, str(root / ".venv")], check=True)
    have, size = _count(root)
    i = 0
    while have < files:  # small source files, ten to a package
        pkg = root / "src" / f"pkg{i // 10}"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / f"mod{i % 10}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
        have, size, i = have + 1, size + 0, i + 1
    have, size = _count(root)
    blob = 0
    while size < mb << 20:  # the rest as larger files that neither compress nor share
        n = min(8 << 20, (mb << 20) - size)
        (root / "data").mkdir(exist_ok=True)
        (root / "data" / f"blob{blob}.bin").write_bytes(os.urandom(n))
        size, blob = size + n, blob + 1
    subprocess.run(["chown", "-R", "1000:1000", str(root)], check=True)
    return _count(root)


@contextlib.contextmanager
def filesystem(kind: str, base: Path, size_gb: int) -> Iterator[Path]:
    if kind == "host":
        d = base / "host"
        d.mkdir()
        yield d
        return
    image, mnt = base / f"{kind}.img", base / kind
    subprocess.run(["truncate", "-s", f"{size_gb}G", str(image)], check=True)
    mkfs = [f"mkfs.{kind}", "-q", *(["-m", "reflink=1"] if kind == "xfs" else []), str(image)]
    subprocess.run(mkfs, check=True, capture_output=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        image.unlink(missing_ok=True)


def _fstype(path: Path) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()


async def run_fs(kind: str, base: Path, args: argparse.Namespace) -> list[tuple[str, str, float, float | None, str]]:
    rows: list[tuple[str, str, float, float | None, str]] = []
    with filesystem(kind, base, max(4, (args.mb * (2 * args.forks + 4)) // 1024 + 2)) as fsdir:
        ws = fsdir / "ws" / "proj"
        files, size = await asyncio.to_thread(make_tree, ws, args.source, args.files, args.mb)
        label = f"{kind} ({_fstype(fsdir)})"
        print(f"{label}: tree of {files} files, {size / 1e6:.0f} MB", file=sys.stderr)
        settings = Settings(data_dir=fsdir / "data", runtime=args.runtime, catalog=False, durability="process")
        snap_t, fork_t, first_t, disk_fork, restore_t = [], [], [], [], []
        cp_t, cp8_t, disk_cp, cp_first_t = [], [], [], []
        strategy = fork_strategy = "?"
        async with default_registry(settings) as reg:
            snaps = Snapshots(reg, fsdir / "data")
            live: list[Path] = []  # forks not removed yet
            try:
                r = await reg.execute("shell_execute", {"command": "true"}, ws)  # its sandbox runs
                assert r.success, r.output
                for rnd in range(args.rounds):
                    # baselines: cp -a of the same tree, once and eight times
                    dests = [fsdir / f"cp{rnd}-{i}" for i in range(args.forks)]
                    before = _used(fsdir)
                    t = time.perf_counter()
                    for d in dests:
                        await asyncio.to_thread(
                            subprocess.run, ["cp", "-a", "--reflink=never", str(ws), str(d)], check=True
                        )
                    cp8_t.append(time.perf_counter() - t)
                    cp_t.append(cp8_t[-1] / args.forks)
                    disk_cp.append(_used(fsdir) - before)
                    # the first call in a copy (a plain workspace's sandbox starts): the
                    # baseline of the first call in a fork
                    t = time.perf_counter()
                    r = await reg.execute("read_file", {"path": "src/pkg0/mod0.py"}, dests[0])
                    cp_first_t.append(time.perf_counter() - t)
                    assert r.success, r.output
                    await reg.stop(dests[0])
                    for d in dests:
                        await asyncio.to_thread(shutil.rmtree, d)
                    # snapshot, fork x8, first call in each, disk of the untouched forks
                    t = time.perf_counter()
                    snap = await snaps.create(ws)
                    snap_t.append(time.perf_counter() - t)
                    strategy = snap.strategy
                    before = _used(fsdir)
                    t = time.perf_counter()
                    forks = await snaps.fork(snap.id, args.forks, into=fsdir)
                    fork_t.append(time.perf_counter() - t)
                    live += forks
                    fork_strategy = (await snaps.origin(forks[0]) or snap).strategy
                    disk_fork.append(_used(fsdir) - before)
                    for f in forks:
                        t = time.perf_counter()
                        r = await reg.execute("read_file", {"path": "src/pkg0/mod0.py"}, f)
                        first_t.append(time.perf_counter() - t)
                        assert r.success, r.output
                    # restore of a tree with --changed files changed
                    changed = " ".join(f"src/pkg{i // 10}/mod{i % 10}.py" for i in range(min(args.changed, args.files)))
                    r = await reg.execute(
                        "shell_execute", {"command": f"for f in {changed}; do echo x >> $f; done"}, forks[0]
                    )
                    assert r.success, r.output
                    t = time.perf_counter()
                    done = await snaps.restore(forks[0], snap.id)
                    restore_t.append(time.perf_counter() - t)
                    assert not done.plan.failed and len(done.plan.modified) == min(args.changed, args.files)
                    for f in forks:
                        await snaps.remove_fork(f)  # (an overlay fork's volume too)
                        live.remove(f)
                    await snaps.delete(snap.id)
            finally:
                # a failed round leaves no fork volume behind in the engine
                for f in live:
                    with contextlib.suppress(Exception):
                        await snaps.remove_fork(f)
                snaps.close()
                await reg.stop(ws)
    med = statistics.median
    n = args.forks
    rows.append((f"snapshot ({strategy})", label, med(snap_t), med(cp_t), ""))
    rows.append((f"fork x{n} ({fork_strategy})", label, med(fork_t), med(cp8_t), "<= 0.2x, <= 1 s on CoW"))
    rows.append(
        ("first call in a fork (its sandbox starts; baseline: in a copy)", label, med(first_t), med(cp_first_t), "")
    )
    rows.append((f"restore, {args.changed} files changed", label, med(restore_t), None, "<= 0.5 s"))
    rows.append(
        (f"disk of {n} untouched forks (MB; % of tree)", label, med(disk_fork) / 1e6, med(disk_cp) / 1e6, "<= 5 %")
    )
    rows.append(("_tree", label, size / 1e6, None, ""))
    return rows


async def main(args: argparse.Namespace) -> None:
    base = Path(tempfile.mkdtemp(prefix="loom-bench-fork-"))
    rows: list[Any] = []
    try:
        for kind in [k for k in args.fs.split(",") if k]:
            if kind != "host" and (os.geteuid() != 0 or shutil.which(f"mkfs.{kind}") is None):
                print(f"skipping {kind}: needs root and mkfs.{kind}", file=sys.stderr)
                continue
            rows += await run_fs(kind, base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\n{args.files} files / {args.mb} MB requested; medians of {args.rounds} rounds; runtime {args.runtime}\n")
    print("| measurement | filesystem | median | baseline: cp -a (same run) | ratio | target |")
    print("|---|---|---:|---:|---:|---|")
    trees = {r[1]: r[2] for r in rows if r[0] == "_tree"}
    for name, fs, value, base_v, target in rows:
        if name == "_tree":
            continue
        if name.startswith("disk"):
            pct = 100 * value / trees[fs] if trees[fs] else 0.0
            print(
                f"| {name} | {fs} | {value:.1f} MB ({pct:.1f} %) | {base_v:.1f} MB | {value / base_v:.3f} | {target} |"
            )
            continue
        ratio = f"{value / base_v:.3f}" if base_v else ""
        shown = f"{base_v:.3f} s" if base_v is not None else ""
        print(f"| {name} | {fs} | {value:.3f} s | {shown} | {ratio} | {target} |")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=20_000, help="files in the tree (at least)")
    ap.add_argument("--mb", type=int, default=500, help="MB in the tree (at least)")
    ap.add_argument("--source", default=sys.prefix, help="a virtualenv copied in as .venv ('' for none)")
    ap.add_argument("--fs", default="host,btrfs,xfs", help="host, btrfs, xfs (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--forks", type=int, default=8)
    ap.add_argument("--changed", type=int, default=100, help="files changed before the restore")
    ap.add_argument("--runtime", choices=("runc", "runsc"), default="runc")
    return ap.parse_args()


if __name__ == "__main__":
    aio.run(main(parse_args()))
