"""``agent run``'s pure parts: providers, the argv per agent, the cost of JSON lines, the
CLI's refusals (exit 2 naming the option) and that a key is never on an argv."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from worker.agents import launch
from worker.agents.cost import CostMeter, price_of, usage_cost
from worker.agents.providers import PROVIDERS, ProviderError, custom, host_of_url
from worker.cli import main


def test_presets() -> None:
    a, o = PROVIDERS["anthropic"], PROVIDERS["openai"]
    assert (a.key_env, a.hosts, a.header, a.base_url_env) == (
        "ANTHROPIC_API_KEY",
        ("api.anthropic.com",),
        "x-api-key: {value}",
        "ANTHROPIC_BASE_URL",
    )
    assert (o.key_env, o.hosts, o.header, o.base_url) == (
        "OPENAI_API_KEY",
        ("api.openai.com",),
        "Authorization: Bearer {value}",
        "https://api.openai.com/v1",
    )
    assert launch.provider_for("claude") is a and launch.provider_for("codex") is o
    assert launch.provider_for("opencode") is None and launch.provider_for("sh x.sh") is None


def test_custom_provider_and_base_url() -> None:
    p = custom("MY_KEY", "API.Example.com:8443")
    assert (p.hosts, p.header, p.egress) == (("api.example.com:8443",), "Authorization: Bearer {value}", p.hosts)
    for bad, field in (
        (("1X", "a.b"), "--key-env"),
        (("K", "*.x.com"), "--key-host"),
        (("K", "a", "X: v"), "--key-header"),
    ):
        with pytest.raises(ProviderError) as e:
            custom(*bad)
        assert e.value.field == field
    moved = PROVIDERS["anthropic"].with_base_url("https://gw.example.com:9443/anthropic/")
    assert (moved.hosts, moved.base_url) == (("gw.example.com:9443",), "https://gw.example.com:9443/anthropic")
    assert host_of_url("https://api.openai.com/v1") == "api.openai.com"
    for bad in ("http://api.openai.com", "https://u:p@x.com", "ftp://x"):
        with pytest.raises(ProviderError):
            host_of_url(bad)


def test_claude_headless_argv_and_quiet_env() -> None:
    got = launch.build("claude", "fix it", ["--model", "claude-opus-4-5"], provider=PROVIDERS["anthropic"],
                       turn_args=["--settings", "/h/.loom/claude.json"])  # fmt: skip
    assert got.argv == [
        "claude", "-p", "fix it", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions",
        "--settings", "/h/.loom/claude.json", "--model", "claude-opus-4-5",
    ]  # fmt: skip
    assert shlex.split(got.command) == got.argv
    assert got.env["ANTHROPIC_BASE_URL"] == "https://api.anthropic.com"
    for var in ("DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING", "DISABLE_AUTOUPDATER",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"):  # fmt: skip
        assert got.env[var] == "1"
    assert "ANTHROPIC_API_KEY" not in got.env  # the key is the secret's placeholder, set by the sandbox


def test_codex_and_opencode_and_tty_argv() -> None:
    got = launch.build("codex", "do it", [], provider=PROVIDERS["openai"])
    assert got.argv[:2] == ["codex", "exec"]
    assert got.argv[-1] == "do it"
    for flag in ("--json", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check",
                 "analytics.enabled=false"):  # fmt: skip
        assert flag in got.argv
    assert got.env == {"OPENAI_BASE_URL": "https://api.openai.com/v1"}
    # Codex ignores OPENAI_BASE_URL: a provider of loom's own carries the base URL and key variable
    at = got.argv.index("model_provider=loom")
    assert got.argv[at - 1] == "-c" and got.argv[at + 1] == "-c"
    assert got.argv[at + 2] == (
        'model_providers.loom={name="loom",base_url="https://api.openai.com/v1",'
        'env_key="OPENAI_API_KEY",wire_api="responses"}'
    )
    mine = launch.build("codex", "p", [], provider=PROVIDERS["openai"].with_base_url("https://gw.example/v1"))
    assert 'base_url="https://gw.example/v1"' in " ".join(mine.argv)
    assert launch.build("opencode", "x", [], provider=None).argv == ["opencode", "run", "x"]
    tty = launch.build("claude", None, [], provider=None, tty=True)
    assert tty.argv == ["claude", "--dangerously-skip-permissions"]
    with pytest.raises(ValueError, match="--prompt"):
        launch.build("claude", None, [], provider=None)


def test_custom_command_keeps_its_words_and_quotes_the_rest() -> None:
    got = launch.build("node agent.js --fast", "it's $HOME", ["-v"], provider=None)
    assert got.argv == ["node", "agent.js", "--fast", "-v", "it's $HOME"]
    assert shlex.split(got.command) == got.argv
    assert launch.model_in(["-m", "gpt-5-mini"]) == "gpt-5-mini" and launch.model_in(["--model=o3"]) == "o3"


def test_prices() -> None:
    assert price_of("claude-sonnet-4-5-20250929").input == 3
    assert price_of("claude-opus-4-5").output == 25 and price_of("claude-opus-4-1").output == 75
    assert price_of("gpt-5-mini").input == 0.25 and price_of("gpt-5.1-codex").input == 1.25
    assert price_of("claude-new-thing").input == 3 and price_of(None).input == 1.25
    # OpenAI counts cached input inside input_tokens; Anthropic apart.
    assert usage_cost(
        {"input_tokens": 1000, "cached_input_tokens": 1000, "output_tokens": 0}, "gpt-5"
    ) == pytest.approx(1000 * 0.125e-6)
    assert usage_cost({"input_tokens": 10, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 100},
                      "claude-sonnet-4") == pytest.approx((10 * 3 + 1000 * 0.3 + 100 * 3.75) / 1e6)  # fmt: skip


def test_claude_stream_json_cost_counts_a_message_once_and_the_result_wins() -> None:
    m = CostMeter()
    msg = {"id": "msg_1", "model": "claude-sonnet-4-5", "usage": {"input_tokens": 1000, "output_tokens": 100}}
    lines = [
        {"type": "system", "subtype": "init", "model": "claude-sonnet-4-5"},
        {"type": "assistant", "message": {**msg, "content": [{"type": "text", "text": "a"}]}},
        {"type": "assistant", "message": {**msg, "content": [{"type": "tool_use", "name": "Edit"}]}},
        {"type": "user", "message": {"content": []}},
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    m.feed(data[:37])  # lines split anywhere
    m.feed(data[37:] + b"not json\n")
    assert m.known and m.cost == pytest.approx(1000 * 3e-6 + 100 * 15e-6)
    m.feed(b'{"type":"result","subtype":"success","total_cost_usd":0.0123,"num_turns":4}\n')
    assert (m.cost, m.turns) == (0.0123, 4)


def test_codex_json_cost_and_turns() -> None:
    m = CostMeter(model="gpt-5-mini")
    m.feed(b'{"type":"thread.started","thread_id":"t"}\n{"type":"turn.completed","usage":'
           b'{"input_tokens":2000,"cached_input_tokens":1000,"output_tokens":500}}\n')  # fmt: skip
    assert m.turns == 1 and m.cost == pytest.approx((1000 * 0.25 + 1000 * 0.025 + 500 * 2) / 1e6)
    assert not CostMeter().known


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_cli_refusals_name_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    ws = str(tmp_path)
    cases = [
        (["agent", "run", "-w", str(tmp_path / "nope"), "claude", "--prompt", "x"], "--workspace"),
        (["agent", "run", "-w", ws, "sh a.sh", "--key-env", "K"], "--key-host"),
        (["agent", "run", "-w", ws, "sh a.sh", "--key-env", "K", "--key-host", "*.com"], "--key-host"),
        (["agent", "run", "-w", ws, "claude", "--key-header", "X: {value}"], "--key-header"),
        (["agent", "run", "-w", ws, "claude", "--base-url", "http://x"], "--base-url"),
        (["agent", "run", "-w", ws, "claude", "--key-file", str(tmp_path / "none")], "--key-file"),
        (["agent", "run", "-w", ws, "claude", "--timeout", "0"], "--timeout"),
        (["agent", "run", "-w", ws, "claude", "--max-cost", "-1"], "--max-cost"),
        (["agent", "run", "-w", ws, "sh a.sh", "--key-file", str(tmp_path)], "--key-file"),
    ]
    for argv, named in cases:
        code, err = _cli(capsys, *argv)
        assert code == 2 and named in err, (argv, err)


def test_run_record_never_holds_the_key() -> None:
    from worker.agents.run import RunRequest

    req = RunRequest("claude", "p", provider=PROVIDERS["anthropic"], key_value="sk-ant-secret-value")
    assert "sk-ant-secret-value" not in repr(req)
    got = launch.build(req.agent, req.prompt, req.extra, provider=req.provider)
    assert "sk-ant-secret-value" not in got.command and "sk-ant-secret-value" not in json.dumps(got.env)


def test_agent_args_after_the_separator_are_the_agents() -> None:
    from worker.cli import build_parser
    from worker.cli.agents.run import agent_args

    args = build_parser().parse_args(
        ["agent", "run", "-w", ".", "--json", "codex", "--prompt", "p", "--timeout", "5", "--", "-m", "gpt-5-mini"]
    )
    assert agent_args(args) == ["-m", "gpt-5-mini"]
    assert (args.agent, args.prompt, args.timeout, args.json) == ("codex", "p", 5.0, True)
    args = build_parser().parse_args(["agent", "run", "-w", ".", "--timeout", "7", "codex", "--", "--x"])
    assert (agent_args(args), args.timeout) == (["--x"], 7.0)
