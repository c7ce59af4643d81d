"""``loom-worker exec --workspace DIR [--timeout S] [--cwd DIR] -- CMD [ARG...]``: run a
command in the workspace's sandbox with its output on ours as it comes, for CI logs and
scripts. With ``-t``/``--tty`` the command runs on a terminal instead, as ``docker exec
-it`` runs it (:mod:`worker.cli.shell`'s session: our terminal in raw mode, every key
typed to it, its exit code ours); without ``-t`` nothing below changes.

What runs: the words after ``--`` as a program and its arguments, exactly (no shell
reads them: they are quoted for ``sh -c``, so ``$HOME`` or ``*`` stay literal); one word
alone is a shell command (``exec -w . -- 'make test && make lint'``). It runs as
``shell_execute`` runs a model's command: the same sandbox, limits and tree-kill, its
standard input ``/dev/null``, and every file it changes recorded in the workspace's
changelog (``loom-worker log``, ``loom-worker undo --call ID``). With ``--env``,
``--user``, ``--stdin`` or an absolute ``--cwd`` it runs through the harness API
(:mod:`worker.harness`) instead: the same recording, and those options.

What comes out: the command's stdout on our stdout and its stderr on our stderr, byte
for byte (any bytes, not only text), as the sandbox reads them. Our own words go to
stderr only when the command did not simply exit (``loom-worker exec: Command timed out
after 5s and was killed``), and log lines only at warning and above unless asked (``-v``,
``LOOM_LOG_LEVEL``), as every command does.

Exit codes (those of ``timeout(1)`` and ``docker``): the command's own; **124** it timed
out; **128+N** a signal N ended it (130 for a Ctrl-C passed on); **137** it was killed
for a limit (memory, output, disk); **125** loom-worker or the sandbox failed
(infrastructure: no engine, no image, the sandbox lost); **126** the command was refused
by policy; **2** a usage error.

Ctrl-C (or SIGTERM, as a CI job's timeout sends) is passed to the command's process
group; a second one sends SIGKILL; a third leaves at once (exit 130) and the command's
fate is the local worker's: it ends at its own timeout, its changes recorded.

Like ``call``, it runs in the per-user local worker when it can and in this process
otherwise (``LOOM_CLI_DAEMON=0``), with the same output and exit codes either way.
"""

from __future__ import annotations

import os
import sys

from .common import unsafe_local_refused

# Not `typing.TYPE_CHECKING`: importing typing costs milliseconds on every call.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from ..settings import Settings
    from ..streaming import ToolOutput

#: ``shell_execute``'s cap on a command's timeout (``worker.tools.shell.MAX_TIMEOUT``; a
#: unit test holds them equal): the default of ``--timeout`` and its largest value.
MAX_TIMEOUT = 300.0


def _usage(message: str) -> int:
    print(f"loom-worker exec: error: {message}", file=sys.stderr)
    return 2


def shell_words(words: list[str]) -> str:
    """The command ``sh -c`` runs for ``words``: one word is a shell command as it is;
    several are a program and its arguments, each quoted so the shell reads none."""
    if len(words) == 1:
        return words[0]
    import shlex

    return shlex.join(words)


class Output:
    """The command's bytes, written to our stdout and stderr as they come (unbuffered).
    A stream whose reader went away (``| head``) is no longer written; the command runs on."""

    def __init__(self) -> None:
        self._fds = {"stdout": 1, "stderr": 2}
        self.dropped = 0
        self.closed: set[str] = set()

    def write(self, stream: str, data: bytes, dropped: int = 0) -> None:
        if dropped:
            self.dropped += dropped
        if stream in self.closed or not data:
            return
        fd = self._fds.get(stream, 2)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except BrokenPipeError:
            self.closed.add(stream)

    def finish(self, code: int, result: dict[str, Any]) -> None:
        """Our words after the command's, on stderr, when it did not simply exit."""
        if self.dropped:
            self.note(f"{self.dropped} bytes of output were not shown (this process read too slowly)")
        data = result.get("data") or {}
        if not result.get("success") and data.get("outcome") != "exit" and result.get("error"):
            self.note(str(result["error"]))

    def note(self, text: str) -> None:
        if "stderr" not in self.closed:
            self.write("stderr", f"loom-worker exec: {text}\n".encode(errors="replace"))


class Interrupts:
    """Ctrl-C and SIGTERM while the command runs: the first passes the signal on, the
    second sends SIGKILL, the third leaves at once."""

    def __init__(self, send: Any) -> None:
        self.send = send  # send(sig) -> None
        self.count = 0

    def __call__(self, signum: int, _frame: Any = None) -> None:
        import signal

        self.count += 1
        if self.count >= 3:
            raise KeyboardInterrupt
        self.send(signal.SIGKILL if self.count == 2 else signum)

    def install(self) -> Any:
        import signal

        old = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore


# -- through the local worker -----------------------------------------------------------------


def _via_worker(frame: dict[str, Any], backend: str, out: Output) -> tuple[int, dict[str, Any]] | str:
    """The command through the local worker: its exit code and result, or why it must run
    in this process (nothing was sent then)."""
    import base64

    from ..localworker.client import Lost, Unavailable, open_worker
    from ..localworker.identity import daemon_key

    key = daemon_key(backend)
    why = ""
    for _attempt in range(2):
        try:
            client = open_worker(key, backend)
        except Unavailable as e:
            return str(e)

        def signal_command(sig: int, client: Any = client) -> None:
            try:
                client.send({"op": "signal", "id": client.last_id, "signal": int(sig)})
            except OSError:
                pass

        def on_frame(f: dict[str, Any]) -> None:
            if f.get("t") == "output":
                out.write(str(f.get("stream")), base64.b64decode(str(f.get("data", ""))), int(f.get("dropped") or 0))

        restore = Interrupts(signal_command).install()
        try:
            answer = client.request({**frame, "key": key}, _log_line, on_frame)
        except Unavailable as e:
            return str(e)
        except Lost as e:
            return _lost(str(e))
        finally:
            restore()
            client.close()
        kind = answer.get("t")
        if kind == "retry":
            why = f"the local worker asked for a fresh one twice ({answer.get('reason')})"
            continue
        if kind == "result" and isinstance(answer.get("result"), dict) and isinstance(answer.get("exit"), int):
            return answer["exit"], answer["result"]
        return _lost(f"the local worker could not run the command: {answer.get('message', answer)}")
    return why


def _lost(why: str) -> tuple[int, dict[str, Any]]:
    """The worker went away after the command was sent: it is not run again (it may
    have run); an infrastructure failure, exit 125."""
    from .tools import fail_dict

    error = (
        f"Local worker lost (infrastructure failure; retry later): {why}. The command may or may not have run; "
        "`loom-worker log` shows what it changed"
    )
    return 125, fail_dict(error, {"error_kind": "infrastructure", "exception": "LocalWorkerLost"})


def _log_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# -- in this process ---------------------------------------------------------------------------


def _in_process(frame: dict[str, Any], backend: str, out: Output, why: str | None) -> tuple[int, dict[str, Any]]:
    import asyncio
    import signal

    from ..localworker.calls import Calls
    from . import verbosity
    from .common import load_settings

    settings = load_settings()
    verbosity.configure(settings)
    if why:
        from sandbox.logs import get_logger

        get_logger("worker.cli").info("cli.local_worker_unavailable", reason=why)
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop is installed wherever the worker is
        runner = asyncio.Runner()
    calls = Calls(settings, backend)

    async def run() -> tuple[int, dict[str, Any]]:
        from sandbox.base import ExecControl

        control = ExecControl()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        pending: set[asyncio.Task[None]] = set()

        def send(sig: int) -> None:
            t = loop.create_task(control.signal(sig))
            pending.add(t)
            t.add_done_callback(pending.discard)

        interrupts = Interrupts(send)

        def on_signal(signum: int) -> None:
            try:
                interrupts(signum)
            except KeyboardInterrupt:
                task.cancel()

        for s in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(s, on_signal, s)

        async def on_output(chunk: ToolOutput) -> None:
            out.write(chunk.stream, chunk.data, chunk.dropped)

        return await calls.exec(
            frame["workspace"],
            frame["command"],
            timeout=frame["timeout"],
            cwd=frame["cwd"],
            call_id=frame["call_id"],
            on_output=on_output,
            control=control,
            harness=frame.get("harness"),
        )

    try:
        return runner.run(run())
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        try:
            runner.run(calls.aclose())
        finally:
            runner.close()


# -- the command -------------------------------------------------------------------------------


#: The most standard input ``--stdin`` takes (``worker.harness.MAX_STDIN``).
MAX_STDIN = 64 << 20


def _harness_options(args: argparse.Namespace) -> dict[str, Any] | str | None:
    """The harness API's options of this command (``--env``, ``--user``, ``--stdin``, an
    absolute ``--cwd``), None when it has none (it then runs as ``shell_execute``), or a
    usage message."""
    env: dict[str, str] = {}
    for item in args.env or []:
        key, sep, value = item.partition("=")
        if not sep or not key or "\x00" in item:
            return f"--env {item!r}: use KEY=VALUE"
        env[key] = value
    if not (env or args.user is not None or args.stdin or args.cwd.startswith("/")):
        return None
    out: dict[str, Any] = {"env": env, "user": args.user}
    if args.stdin:
        import base64

        data = sys.stdin.buffer.read(MAX_STDIN + 1)
        if len(data) > MAX_STDIN:
            return f"--stdin: more than {MAX_STDIN} bytes of input (write it to a file in the sandbox: loom-worker cp)"
        out["stdin"] = base64.b64encode(data).decode("ascii")
    return out


def _cmd_exec(args: argparse.Namespace, _settings: Settings | None) -> int:
    from . import verbosity

    words = list(args.cmd)
    if words and words[0] == "--":
        words = words[1:]
    if args.tty and len(words) > 1 and _is_number(words[0]) and "--" in words:
        # `exec -t 60 -- CMD`: -t was the timeout's short option before it meant a terminal
        return _usage(f"-t is --tty (a terminal, as docker exec -t); a timeout is --timeout {words[0]}")
    if not words or not any(w.strip() for w in words):
        return _usage("no command given (loom-worker exec --workspace DIR -- CMD [ARG...])")
    if any("\x00" in w for w in words):
        return _usage("a word of the command holds a NUL byte")
    ws = os.path.realpath(os.path.expanduser(args.workspace))
    if not os.path.isdir(ws):
        return _usage(f"--workspace {args.workspace} is not a directory")
    if args.tty:
        return _exec_tty(args, words)
    if args.timeout is None:
        args.timeout = MAX_TIMEOUT
    if not 0 < args.timeout <= MAX_TIMEOUT:
        return _usage(f"--timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds (got {args.timeout:g})")
    backend = getattr(args, "backend", "docker")
    if refused := unsafe_local_refused(backend):
        return _usage(refused)
    harness = _harness_options(args)
    if isinstance(harness, str):
        return _usage(harness)
    frame = {
        "op": "exec",
        "workspace": ws,
        "command": shell_words(words),
        "timeout": args.timeout,
        "cwd": args.cwd,
        "call_id": args.call_id,
        "tty": sys.stderr.isatty(),
        # Our stderr is the command's: log lines only when something is wrong, unless asked.
        "log_floor": verbosity.level(),
    }
    if harness is not None:
        frame["harness"] = harness
    out = Output()
    from ..localworker.client import switch

    why: str | None = None
    done: tuple[int, dict[str, Any]] | None = None
    try:
        if switch() is True:
            through = _via_worker(frame, backend, out)
            if isinstance(through, str):
                why = through
            else:
                done = through
        if done is None:
            done = _in_process(frame, backend, out, why)
    except KeyboardInterrupt:
        out.note("interrupted")
        return 130
    code, result = done
    out.finish(code, result)
    return code


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _exec_tty(args: argparse.Namespace, words: list[str]) -> int:
    """``exec -t``: the command on a terminal, as ``shell -- CMD`` runs it (``--timeout``,
    when given, kills it: exit 124)."""
    from . import termsession
    from .shell import options

    if args.user is not None or args.stdin:
        return _usage("-t gives the command our terminal: --user and --stdin do not go with it")
    if getattr(args, "backend", "docker") != "docker":
        return _usage("-t needs the docker backend (terminals)")
    if args.timeout is not None and not 0 < args.timeout <= 86_400:
        return _usage(f"--timeout with -t must be more than 0 and at most 86400 seconds (got {args.timeout:g})")
    opts = options(args, "loom-worker exec")
    if isinstance(opts, str):
        return _usage(opts)
    opts.timeout = args.timeout
    return termsession.run(opts)


def register(subparsers: Any, only: str | None = None) -> None:
    import argparse

    p = subparsers.add_parser(
        "exec",
        help="Run a command in the sandbox, its output on ours as it comes; exit with its code.",
        description=(
            "Run CMD in the workspace's sandbox (as shell_execute does: recorded in the changelog, undoable). "
            "Its stdout and stderr are ours, byte for byte, as they come. Several words are a program and its "
            "arguments (no shell reads them); one word is a shell command."
        ),
        epilog="Exit status: the command's own; 124 it timed out; 128+N a signal N ended it (130: Ctrl-C); 137 "
        "killed for a limit (memory, output, disk); 125 infrastructure failure (no engine, no image, the sandbox "
        "lost); 126 refused by policy; 2 usage error. With -t as loom-worker shell's: 0 detached, 129/143 "
        "SIGHUP/SIGTERM here (the command goes on).",
    )
    p.add_argument("--workspace", "-w", required=True, help="Workspace directory.")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"Seconds before the command is killed (exit 124). Default and most: {MAX_TIMEOUT:g} (with -t: none, "
        "at most 86400).",
    )
    p.add_argument(
        "--tty",
        "-t",
        action="store_true",
        help="Run it on a terminal, as docker exec -it: our terminal in raw mode, every key typed to it, its size "
        "followed; '~.' after Enter detaches. (Before this option, -t was --timeout's short form.)",
    )
    p.add_argument(
        "--cwd",
        default=".",
        help="Working directory, relative to the workspace (default: its root), or any absolute directory of the "
        "sandbox.",
    )
    p.add_argument("--env", "-e", action="append", metavar="KEY=VALUE", help="A variable of the command (repeatable).")
    p.add_argument(
        "--user",
        "-u",
        default=None,
        help="Run as this user of the image (name or uid[:gid]); root only where the workspace allows it "
        "(workspace set --allow-root).",
    )
    p.add_argument(
        "--stdin",
        "-i",
        action="store_true",
        help="Give the command our standard input (read to its end first, at most 64 MiB; no terminal).",
    )
    from .shell import add_terminal_options

    add_terminal_options(p)
    p.add_argument("--call-id", default=None, help="Id recorded with the call (changelog, logs).")
    p.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]", help="The command.")
    p.set_defaults(func=_cmd_exec, own_settings=True)
