"""Issue 43 end to end: real Claude Code and Codex, from npm, run a scripted 20-turn session on
a real project's source (tests/fixtures/tinycalc) against our mock providers
(tests/agentmocks): first on the bare host (the script and the mocks are right), then inside
loom's sandbox through ``loom-worker agent install`` / ``agent run`` under runc and gVisor: the
key reaches the mock and is found nowhere in the sandbox or loom's output and logs; each tool
call is its own undo group; ``undo --last 1`` reverts only the last; ``undo --all`` restores
the tree.

The sandbox reaches the mock under the provider's real name: the gateway dials it by
``LOOM_EGRESS_HOSTS``, trusts loopback by ``LOOM_EGRESS_TRUSTED_NETWORKS`` and the mock's CA by
``LOOM_EGRESS_UPSTREAM_CA``; the key is a gateway secret, the sandbox sees a placeholder.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentmocks import MockProviders, changes, claude_argv, claude_env, codex_argv, codex_env, session
from tests.agentmocks.script import PROJECT, project_files, read_tree, trees
from tests.workers import remove_sandboxes_under

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
VERSIONS = {"claude": "2.1.332", "codex": "0.171.0"}
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
API = {"claude": "anthropic", "codex": "openai"}
TURNS = 20
PROMPT = "Work through the task."


@pytest.fixture(scope="module")
def host_agents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each agent's executable installed from npm on this host (reused across runs)."""
    cache = Path(os.environ.get("LOOM_TEST_AGENTS_CACHE", "/tmp/loom-test-agents"))
    out: dict[str, Path] = {}
    for name, version in VERSIONS.items():
        prefix = cache / f"{name}-{version}"
        exe = prefix / "node_modules" / ".bin" / name
        if not exe.exists():
            prefix.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix), f"{PACKAGES[name]}@{version}"],
                check=True,
                capture_output=True,
            )
        out[name] = exe
    return out


@pytest.fixture
def mock() -> Iterator[MockProviders]:
    keys = {"anthropic": "sk-ant-" + secrets.token_hex(16), "openai": "sk-proj-" + secrets.token_hex(16)}
    with MockProviders(session(TURNS), keys=keys) as m:
        yield m


def project(tmp_path: Path) -> Path:
    ws = tmp_path / "proj"
    shutil.copytree(PROJECT, ws, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=ws, check=True)
    subprocess.run([*git, "add", "-A"], cwd=ws, check=True)
    subprocess.run([*git, "commit", "-qm", "start"], cwd=ws, check=True)
    return ws


# -- the bare host: the agents, the script and the mocks agree ---------------------------------


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_scripted_session_on_the_bare_host(
    agent: str, host_agents: dict[str, Path], mock: MockProviders, tmp_path: Path
) -> None:
    ws = project(tmp_path)
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    ca = tmp_path / "mock-ca.pem"
    ca.write_bytes(mock.ca_pem())
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "NODE_EXTRA_CA_CERTS": str(ca), "SSL_CERT_FILE": str(ca)}
    key = mock.keys[API[agent]]
    assert key is not None
    if agent == "claude":
        argv = claude_argv(str(host_agents[agent]), PROMPT)
        env |= claude_env(mock.url, key)
    else:
        argv = codex_argv(str(host_agents[agent]), PROMPT, mock.url + "/v1")
        env |= codex_env(key, str(home / ".codex"))
    run = subprocess.run(argv, cwd=ws, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    steps = session(TURNS)
    seen = mock.requests(API[agent])
    # one model request per tool call and one for the final answer, every one with the key
    assert len(seen) == TURNS + 1
    assert {s.key() for s in seen} == {key}
    if agent == "claude":
        assert events[-1]["type"] == "result" and events[-1]["is_error"] is False
        assert events[-1]["num_turns"] == TURNS + 1
        failed = [e for e in events if e["type"] == "user" and any(b.get("is_error") for b in e["message"]["content"])]
        assert failed == []
    else:
        assert events[-1]["type"] == "turn.completed"
        assert not [e for e in events if e["type"] == "item.completed" and e["item"].get("status") == "failed"]
    want = trees(steps)[-1]
    assert read_tree(ws, want) == want
    assert sum(changes(s) for s in steps) >= TURNS // 3


# -- in loom's sandbox, through loom-worker agent install / run --------------------------------


def loom(args: list[str], env: dict[str, str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args], env=env, capture_output=True, text=True, timeout=540, **kw
    )  # type: ignore[call-overload]


@pytest.fixture(params=["runc", "runsc"])
def loom_env(
    request: pytest.FixtureRequest, docker_ready: None, mock: MockProviders, tmp_path: Path
) -> Iterator[dict[str, str]]:
    ca = tmp_path / "mock-ca.pem"
    ca.write_bytes(mock.ca_pem())
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LOOM_") or k in ("LOOM_TEST_OWNER", "LOOM_GVISOR_PLATFORM")
    }
    env.update(
        PYTHONPATH=str(ROOT),
        LOOM_RUNTIME=request.param,
        LOOM_DATA_DIR=str(tmp_path / "data"),
        XDG_RUNTIME_DIR=str(tmp_path / "run"),
        LOOM_EGRESS_HOSTS=f"api.anthropic.com=127.0.0.1:{mock.port},api.openai.com=127.0.0.1:{mock.port}",
        LOOM_EGRESS_TRUSTED_NETWORKS="127.0.0.0/8",
        LOOM_EGRESS_UPSTREAM_CA=str(ca),
        # `agent install` reaches npm's registry from a sandbox, through this machine's
        # TLS-intercepting proxy: the sandbox must trust what the host trusts
        LOOM_CA_BUNDLE="/etc/ssl/certs/ca-certificates.crt",
    )
    (tmp_path / "run").mkdir()
    yield env
    # The CLI's local worker would wait out its idle exit (15 min) with its warm pool; its
    # sandboxes outlive it (idle TTL), under this data directory's owner, which the
    # suite's closing gc does not take.
    loom(["daemon", "stop"], env)
    remove_sandboxes_under(tmp_path)


def groups(ws: Path, env: dict[str, str]) -> list[tuple[str, str]]:
    """(call id, tool) of each changelog group not undone, oldest first."""
    r = loom(["log", "-w", str(ws), "--json"], env)
    assert r.returncode == 0, r.stderr
    out: list[tuple[str, str]] = []
    for line in r.stdout.splitlines():
        e = json.loads(line)
        if e.get("origin") == "undo" or e.get("reverted_by") is not None:
            continue  # undo's own entries, and what an undo took back: no longer a group
        g = (str(e.get("call_id")), str(e.get("tool")))
        if g not in out:
            out.append(g)
    return out


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_agent_in_the_sandbox_turn_by_turn(
    agent: str, loom_env: dict[str, str], mock: MockProviders, tmp_path: Path
) -> None:
    env = loom_env
    r = loom(["agent", "install", agent, VERSIONS[agent]], env)
    assert r.returncode == 0, r.stderr[-2000:]
    ws = project(tmp_path)
    os.chown(ws, 1000, 1000)
    for path in ws.rglob("*"):
        os.lchown(path, 1000, 1000)
    key = mock.keys[API[agent]]
    assert key is not None
    key_env = "ANTHROPIC_API_KEY" if agent == "claude" else "OPENAI_API_KEY"
    extra = ["--", "-m", "gpt-5-codex"] if agent == "codex" else []
    run = loom(
        ["agent", "run", "-w", str(ws), agent, "--prompt", PROMPT, "--timeout", "400", *extra], env | {key_env: key}
    )
    assert run.returncode == 0, run.stderr[-2000:]
    steps = session(TURNS)
    expected = trees(steps)

    # the key reached the mock, and only there
    seen = mock.requests(API[agent])
    assert seen and {s.key() for s in seen} == {key}
    assert key not in run.stdout and key not in run.stderr
    probe = loom(
        [
            "exec",
            "-w",
            str(ws),
            "--",
            "env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'; "
            # the needle in two halves, joined by the shell: the probe's own command line
            # must not hold what it looks for
            f"a={key[:12]}; b={key[12:24]}; "
            'grep -rlsF --exclude-dir=proc --exclude-dir=sys -e "$a$b" / || true',
        ],
        env,
    )
    assert probe.returncode == 0, probe.stderr
    assert key not in probe.stdout and key[:24] not in probe.stdout
    data = Path(env["LOOM_DATA_DIR"])
    for path in data.rglob("*"):
        if path.is_file() and "secrets" not in path.parts:
            assert key.encode() not in path.read_bytes(), path
    runs = list(data.glob("workspaces/*/agent-runs/*/run.json"))
    assert len(runs) == 1
    record = json.loads(runs[0].read_text())
    assert record["exit_code"] == 0

    # the session's result, one undo group per tool call, undo one, undo all
    assert read_tree(ws, expected[-1]) == expected[-1]
    # run.json names every path the run changed (recorded turn by turn, not only after it)
    made = {p for p, data in expected[-1].items() if project_files(PROJECT).get(p) != data}
    assert made and made <= set(record["changed"]), (made, record["changed"])
    changed = [s for s in steps if changes(s)]
    gs = groups(ws, env)
    assert len(gs) >= len(changed), gs
    if agent == "claude":
        assert [tool for _, tool in gs][-len(changed) :] == [type(s).__name__ for s in changed]
    else:  # Codex's apply_patch fires no hook: the hook before its next tool closes each edit
        assert [tool for _, tool in gs][-len(changed) :] == ["apply_patch"] * len(changed)
    r = loom(["undo", "-w", str(ws), "--last", "1"], env)
    assert r.returncode == 0, r.stderr
    after = read_tree(ws, expected[-1])
    assert after == expected[-2]  # exactly the last change gone
    assert groups(ws, env) == gs[:-1]
    r = loom(["undo", "-w", str(ws), "--all"], env)
    assert r.returncode == 0, r.stderr
    assert read_tree(ws, expected[-1]) == project_files(PROJECT)
