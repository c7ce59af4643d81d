"""Everyday commands inside a sandbox on each runtime: runc and every gVisor platform the
engine has a runtime for (``runsc-systrap``, ``runsc-ptrace``, ``runsc-kvm``), in one run.

    .venv/bin/python bench/bench_platforms.py [--n 15] [--rounds 3] [--image loom-sandbox:latest]

Each runtime runs one container (network none) holding a small Python timer that starts
each command with ``/bin/sh -c`` as the agent does and takes the median of ``--n`` runs;
the runtimes alternate for ``--rounds`` rounds and the table gives the medians, and each
gVisor platform's ratio to runc. What it separates: process starts (fork and exec, where
gVisor's systrap platform pays most) from system-call-heavy work (stat, open, getdents:
ptrace's cost), which the tool benchmarks mix.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

COMMANDS = [
    "true",
    "sh -c 'for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done'",
    "git --version",
    "python3 -c pass",
    "python3 -c 'import json, unittest, email'",
    "ls -lR /usr/lib/python3* >/dev/null",
    "find /usr -name '*.py' | wc -l",
    "python3 -c 'import os\nfor _ in range(20000): os.stat(\"/usr\")'",
    "python3 -m pip --version",
    "cd /tmp && rm -rf r && git init -q r && cd r && for i in $(seq 100); do echo $i > f$i; done"
    " && git add . && git -c user.email=a@b -c user.name=a commit -qm x && git status --short",
]

TIMER = """
import json, statistics, subprocess, sys, time
out = {}
for cmd in json.loads(sys.argv[1]):
    xs = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        xs.append((time.perf_counter() - t) * 1000.0)
    out[cmd] = statistics.median(xs)
print(json.dumps(out))
"""


def runtimes() -> list[str]:
    """runc, and a runtime per gVisor platform the engine has registered."""
    out = ["runc"]
    p = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True)
    have = json.loads(p.stdout or "{}")
    return out + [f"runsc-{p}" for p in ("systrap", "ptrace", "kvm") if f"runsc-{p}" in have]


def one(runtime: str, image: str, n: int) -> dict[str, float]:
    argv = ["docker", "run", "--rm", "--runtime", runtime, "--network", "none", image]
    argv += ["python3", "-c", TIMER, json.dumps(COMMANDS), str(n)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{runtime}: {p.stderr[-2000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=15, help="runs of each command per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--image", default=os.environ.get("LOOM_IMAGE", "loom-sandbox:latest"))
    args = ap.parse_args()
    names = runtimes()
    results: dict[str, list[dict[str, float]]] = {r: [] for r in names}
    for i in range(args.rounds):
        for r in names if i % 2 == 0 else names[::-1]:
            results[r].append(one(r, args.image, args.n))
    med = {r: {c: statistics.median(x[c] for x in results[r]) for c in COMMANDS} for r in names}
    what = f"`/bin/sh -c COMMAND` from Python in the sandbox, medians of {args.rounds} rounds of {args.n}"
    print(f"\n{args.image}, {what}\n")
    gv = names[1:]
    print("| command | " + " | ".join(f"{r} p50 (ms)" for r in names) + "".join(f" | {r} / runc" for r in gv) + " |")
    print("|---|" + "---:|" * (len(names) + len(gv)))
    for c in COMMANDS:
        cells = [f"{med[r][c]:.1f}" for r in names] + [f"{med[r][c] / med['runc'][c]:.2f}x" for r in gv]
        shown = c.replace("\n", "\\n").replace("|", "\\|")  # one Markdown cell
        print(f"| `{shown}` | " + " | ".join(cells) + " |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
