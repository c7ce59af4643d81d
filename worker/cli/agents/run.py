"""``loom-worker agent run -w DIR AGENT [--prompt TEXT | --prompt-file F] [-- AGENT-ARGS]``:
an agent CLI (claude, codex, opencode) or any command in the workspace's sandbox, its
provider key a gateway secret the sandbox never sees (:mod:`worker.agents.run`).

The key comes from this environment's variable (``ANTHROPIC_API_KEY``, ``OPENAI_API_KEY``,
or ``--key-env NAME``) or ``--key-file F``, never from the command line. The agent's stdout
(JSON lines) comes on ours as it comes; its stderr on ours; our own words on stderr.

Exit status: the agent's own; 3 ``--max-cost`` stopped it; 124 ``--timeout`` did; 128+N a
signal N; 2 a usage error (named); 125 the sandbox failed; 1 another error of ours.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from ..common import path_arg

if TYPE_CHECKING:
    from ...agents.providers import Provider
    from ...settings import Settings

PROG = "loom-worker agent run"


def _usage(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def provider_of(args: argparse.Namespace) -> Provider | None:
    """The provider asked for: --key-env/--key-host, else the agent's preset; then
    --base-url. Raises ProviderError naming the option."""
    from ...agents import launch
    from ...agents.providers import ProviderError, custom

    if (args.key_env is None) != (args.key_host is None):
        raise ProviderError(
            "--key-env" if args.key_env is None else "--key-host", "give --key-env and --key-host together"
        )
    if args.key_env is not None:
        p: Provider | None = custom(args.key_env, args.key_host, args.key_header or "Authorization: Bearer {value}")
    else:
        if args.key_header is not None:
            raise ProviderError("--key-header", "goes with --key-env and --key-host")
        p = launch.provider_for(args.agent)
    if args.base_url is not None:
        if p is None:
            raise ProviderError("--base-url", "this agent has no provider: give --key-env and --key-host")
        p = p.with_base_url(args.base_url)
    return p


def _key(args: argparse.Namespace, p: Provider | None) -> tuple[str | None, Any]:
    """(the key's value from our environment, or None; the --key-file path or None)."""
    if p is None:
        if args.key_file is not None:
            raise ValueError("--key-file: this agent has no provider: give --key-env and --key-host")
        return None, None
    if args.key_file is not None:
        if not args.key_file.is_file():
            raise ValueError(f"--key-file {args.key_file}: not a file")
        return None, args.key_file
    value = os.environ.get(p.key_env)
    return (value.strip() or None) if value else None, None


def _prompt(args: argparse.Namespace) -> str | None:
    if args.prompt_file is not None:
        try:
            return str(args.prompt_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--prompt-file: cannot read it ({type(e).__name__})") from None
    return args.prompt  # type: ignore[no-any-return, unused-ignore]


def agent_args(args: argparse.Namespace) -> list[str]:
    """The agent's own arguments. Our options given after AGENT, which argparse leaves in
    the remainder, are parsed into ``args`` (a bad one exits 2) up to the first word that
    is not one of ours, or ``--``; the rest is the agent's."""
    extra = list(args.agent_args)
    late = argparse.ArgumentParser(prog=PROG, add_help=False)
    add_options(late)
    takes = {s: a.nargs != 0 for a in late._actions for s in a.option_strings}
    at = 0
    while at < len(extra) and extra[at] != "--":
        name = extra[at].split("=", 1)[0]
        if name not in takes:
            break
        at += 2 if takes[name] and "=" not in extra[at] else 1
    late.parse_args(extra[:at], namespace=args)
    extra = extra[at:]
    return extra[1:] if extra[:1] == ["--"] else extra


def _run(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from ...agents.providers import ProviderError
    from ...agents.run import RunRequest

    root = args.workspace.expanduser()
    if not root.is_dir():
        return _usage(f"--workspace {args.workspace}: not a directory")
    extra = agent_args(args)
    if args.timeout <= 0:
        return _usage("--timeout: a number of seconds > 0")
    if args.max_cost is not None and args.max_cost <= 0:
        return _usage("--max-cost: a number of USD > 0")
    try:
        provider = provider_of(args)
        key_value, key_file = _key(args, provider)
        prompt = _prompt(args)
    except (ProviderError, ValueError) as e:
        return _usage(str(e))
    req = RunRequest(
        args.agent, prompt, extra, provider, key_value=key_value, key_file=key_file,
        timeout=args.timeout, max_cost=args.max_cost, turns=not args.no_turns,
    )  # fmt: skip
    if args.tty:
        return _tty(args, settings, req)
    try:
        return asyncio.run(_headless(args, settings, req))
    except KeyboardInterrupt:
        _say("interrupted (the agent was killed)")
        return 130


async def _headless(args: argparse.Namespace, settings: Settings, req: Any) -> int:
    import json

    from sandbox.errors import AgentError, SandboxError

    from ...agents.run import RunError, as_dict, run_agent
    from ...egress.secrets import SecretError
    from ...registry import default_registry
    from ...workspace_settings import SettingsError

    def out(data: bytes) -> None:
        if not args.json:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()

    def err(data: bytes) -> None:
        sys.stderr.buffer.write(data)
        sys.stderr.buffer.flush()

    async with default_registry(settings, catalog=False) as registry:  # the changelog on
        try:
            result = await run_agent(
                registry, settings.data_dir, args.workspace.expanduser(), req, out=out, err=err,
                progress=_say if not args.quiet else lambda _m: None,
            )  # fmt: skip
        except (RunError, SettingsError, SecretError) as e:
            return _usage(str(e))
        except AgentError as e:
            _say(str(e))
            return 1
        except (SandboxError, NotImplementedError) as e:
            _say(f"the sandbox is unavailable: {e}")
            return 125
    if args.json:
        print(json.dumps(as_dict(result), indent=2))
    if result.outcome == "cost":
        _say(f"stopped: the run cost about ${result.cost_usd:.4f}, over --max-cost {req.max_cost} (exit 3)")
    elif result.outcome == "timeout":
        _say(f"stopped: --timeout {req.timeout:g}s passed; the agent and everything it started were killed")
    if not args.quiet:
        cost = "" if result.cost_usd is None else f", cost ${result.cost_usd:.4f}"
        _say(f"exit {result.exit_code}{cost}; transcript and run.json in {result.run_dir}")
    return result.exit_code


def _tty(args: argparse.Namespace, settings: Settings, req: Any) -> int:
    """Interactive: the agent on a loom terminal (``loom-worker shell``'s session)."""
    import asyncio

    from ...agents import launch
    from ...agents.run import RunError, provision, unprovision
    from ...egress.secrets import SecretError
    from ...registry import default_registry
    from ...workspace_settings import SettingsError
    from ..termsession import Options, run

    root = args.workspace.expanduser().resolve()
    how = launch.build(req.agent, req.prompt, req.extra, provider=req.provider, tty=True)

    async def setup() -> Any:
        async with default_registry(settings, catalog=False) as registry:
            return await provision(registry, root, req, data_dir=settings.data_dir)

    async def teardown(restore: Any) -> None:
        async with default_registry(settings, catalog=False) as registry:
            await unprovision(registry, root, restore)

    try:
        restore = asyncio.run(setup())
    except (RunError, SettingsError, SecretError) as e:
        return _usage(str(e))
    try:
        return run(Options(PROG, str(root), command=["sh", "-c", how.command], env=how.env, timeout=req.timeout))
    finally:
        asyncio.run(teardown(restore))


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="Run an agent CLI (claude, codex, opencode) or any command in the sandbox, its key kept on the host.",
        description="Run AGENT in the workspace's sandbox: headless (its JSON lines streamed and saved) or on a "
        "terminal (--tty). The provider's key, from this environment or --key-file, becomes a gateway secret of "
        "the provider's API host only: the sandbox sees a placeholder. AGENT is claude, codex, opencode, or a "
        "command (then give --key-env NAME --key-host HOST for its key).",
        epilog="Exit status: the agent's own; 3 --max-cost stopped it; 124 --timeout did; 128+N a signal N; "
        "2 usage error; 125 the sandbox failed; 1 another error.",
    )
    p.add_argument("--workspace", "-w", type=path_arg, required=True, help="The workspace directory.")
    p.add_argument("agent", metavar="AGENT", help="claude, codex, opencode, or a command (a shell line).")
    add_options(p)
    p.add_argument(
        "agent_args", nargs=argparse.REMAINDER, metavar="-- AGENT-ARGS", help="More arguments for the agent."
    )
    p.set_defaults(func=_run)


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of ``agent run`` other than -w, AGENT and the agent's arguments."""
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="The task.")
    prompt.add_argument("--prompt-file", type=path_arg, help="The task, from this file.")
    p.add_argument("--tty", action="store_true", help="Interactive, on a loom terminal (as loom-worker shell).")
    p.add_argument("--timeout", type=float, default=3600.0, help="Seconds before it is killed (default 3600).")
    p.add_argument("--max-cost", type=float, metavar="USD", help="Kill it when its cost passes this (exit 3).")
    p.add_argument("--key-env", metavar="NAME", help="The key's variable (here and, as a placeholder, there).")
    p.add_argument("--key-host", metavar="HOST", help="The only host the key is sent to (with --key-env).")
    p.add_argument("--key-header", metavar="TEMPLATE", help="How it is sent (default 'Authorization: Bearer {value}').")
    p.add_argument("--key-file", type=path_arg, metavar="FILE", help="Read the key from this file (at each use).")
    p.add_argument("--base-url", metavar="URL", help="The provider's API at another https:// URL (the key goes there).")
    p.add_argument(
        "--no-turns", action="store_true", help="One undo group for the whole session (no turn-by-turn hooks)."
    )
    p.add_argument("--json", action="store_true", help="Print the result as JSON instead of the agent's output.")
    p.add_argument("--quiet", "-q", action="store_true", help="No progress lines of ours.")
