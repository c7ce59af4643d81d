"""Agent benchmark (issue 43): a scripted 20-turn session of Claude Code and Codex against our
mock providers (tests/agentmocks), on the bare host (the baseline) and in loom's sandbox
(runc, gVisor) through ``loom-worker agent run``, in one run, interleaved round by round;
medians and ratios to the bare host. Targets: <= 1.3x the bare host under runc; turn-by-turn
recording <= 10% of the session.

The cost of recording: ``agent run`` (a group per tool call: the agent's hooks and a scan per
tool call) against ``agent run --no-turns`` (the same run, one group for the session).

Usage: .venv/bin/python bench/bench_agent.py [--agents claude,codex] [--runtimes runc,runsc]
       [--rounds 5] [--turns 20] [--host-only]
Needs npm (the agents are installed on the host under /tmp/loom-test-agents).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, env_for

sys.path.insert(0, str(ROOT))

from tests.agentmocks import MockProviders, claude_argv, claude_env, codex_argv, codex_env, session
from tests.agentmocks.script import PROJECT

VERSIONS = {"claude": "2.1.332", "codex": "0.171.0"}
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
KEYS = {"claude": ("ANTHROPIC_API_KEY", "sk-ant-bench"), "codex": ("OPENAI_API_KEY", "sk-proj-bench")}
PROMPT = "Work through the task."


def host_agent(name: str) -> Path:
    prefix = Path("/tmp/loom-test-agents") / f"{name}-{VERSIONS[name]}"
    exe = prefix / "node_modules" / ".bin" / name
    if not exe.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(prefix),
                f"{PACKAGES[name]}@{VERSIONS[name]}",
            ],
            check=True,
            capture_output=True,
        )
    return exe


def fresh_project(tmp: Path) -> Path:
    ws = Path(tempfile.mkdtemp(dir=tmp)) / "proj"
    shutil.copytree(PROJECT, ws, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        "git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm start",
        shell=True,
        cwd=ws,
        check=True,
    )
    return ws


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Wall seconds of one run. Raises RuntimeError if it failed."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited {r.returncode}: {r.stderr[-1500:]}")
    return took


def on_host(name: str, mock: MockProviders, tmp: Path) -> float:
    ws = fresh_project(tmp)
    home = ws.parent / "home"
    (home / ".codex").mkdir(parents=True)
    ca = tmp / "mock-ca.pem"
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "NODE_EXTRA_CA_CERTS": str(ca), "SSL_CERT_FILE": str(ca)}
    key = KEYS[name][1]
    if name == "claude":
        return timed(claude_argv(str(host_agent(name)), PROMPT), ws, env | claude_env(mock.url, key))
    argv = codex_argv(str(host_agent(name)), PROMPT, mock.url + "/v1")
    return timed(argv, ws, env | codex_env(key, str(home / ".codex")))


def loom_env(runtime: str, mock: MockProviders, tmp: Path) -> dict[str, str]:
    run = tmp / f"run-{runtime}"
    run.mkdir(exist_ok=True)
    env = env_for(runtime, tmp / f"data-{runtime}", run)
    env.update(
        LOOM_EGRESS_HOSTS=f"api.anthropic.com=127.0.0.1:{mock.port},api.openai.com=127.0.0.1:{mock.port}",
        LOOM_EGRESS_TRUSTED_NETWORKS="127.0.0.0/8",
        LOOM_EGRESS_UPSTREAM_CA=str(tmp / "mock-ca.pem"),
    )
    # `agent install` reaches npm from a sandbox: behind a TLS-intercepting proxy the sandbox
    # must trust what the host trusts (the operator's LOOM_CA_BUNDLE, else the host's bundle)
    host_ca = os.environ.get("LOOM_CA_BUNDLE") or "/etc/ssl/certs/ca-certificates.crt"
    if Path(host_ca).is_file():
        env["LOOM_CA_BUNDLE"] = host_ca
    return env


def in_sandbox(name: str, env: dict[str, str], tmp: Path, *, turns: bool) -> float:
    """``agent run`` with turn by turn recording, or with ``turns`` False ``--no-turns``
    (the same run, one group for the session: no hooks, no scan per tool call)."""
    ws = fresh_project(tmp)
    for path in [ws, *ws.rglob("*")]:
        os.lchown(path, 1000, 1000)
    var, key = KEYS[name]
    loom = [sys.executable, "-m", "worker.cli", "agent", "run", "-w", str(ws), name, "--prompt", PROMPT]
    extra = ["--", "-m", "gpt-5-codex"] if name == "codex" else []
    return timed([*loom, *([] if turns else ["--no-turns"]), *extra], ws, env | {var: key})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", default="claude,codex")
    ap.add_argument("--runtimes", default="runc,runsc")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--host-only", action="store_true", help="only the bare-host baseline")
    args = ap.parse_args()
    agents = [a for a in args.agents.split(",") if a]
    for a in agents:
        if a not in VERSIONS:
            ap.error(f"--agents: unknown agent {a!r} (claude, codex)")
    runtimes = [] if args.host_only else [r for r in args.runtimes.split(",") if r]
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-agent-"))
    results: dict[str, list[float]] = {}
    with MockProviders(session(args.turns)) as mock:
        (tmp / "mock-ca.pem").write_bytes(mock.ca_pem())
        envs = {rt: loom_env(rt, mock, tmp) for rt in runtimes}
        for env in envs.values():  # install once per data dir (outside the timing)
            for a in agents:
                r = subprocess.run(
                    [sys.executable, "-m", "worker.cli", "agent", "install", a, VERSIONS[a]],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if r.returncode != 0:
                    raise SystemExit(f"agent install {a} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        for rnd in range(args.rounds):
            for a in agents:
                results.setdefault(f"{a} host", []).append(on_host(a, mock, tmp))
                for rt, env in envs.items():
                    results.setdefault(f"{a} {rt} agent run", []).append(in_sandbox(a, env, tmp, turns=True))
                    results.setdefault(f"{a} {rt} --no-turns", []).append(in_sandbox(a, env, tmp, turns=False))
            print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{'session (' + str(args.turns) + ' turns)':34} {'median s':>9} {'x host':>7}")
    for label, times in results.items():
        med = statistics.median(times)
        host = statistics.median(results[label.split()[0] + " host"])
        print(f"{label:34} {med:9.2f} {med / host:7.2f}")
    for a in agents:
        for rt in runtimes:
            run_, plain = (statistics.median(results[f"{a} {rt} {k}"]) for k in ("agent run", "--no-turns"))
            print(f"{a} {rt}: turn-by-turn recording {100 * (run_ - plain) / run_:.1f}% of the session (target <= 10%)")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
