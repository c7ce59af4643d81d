"""``loom-worker port-forward --workspace DIR [--address ADDR] [HOST_PORT:]SANDBOX_PORT...``:
reach a server listening inside the sandbox from this host, as ``kubectl port-forward``
does for a pod.

The sandbox keeps no network interface: this process listens on the host (``127.0.0.1``
unless ``--address`` says otherwise) and carries each connection it accepts through the
agent's channel to ``SANDBOX_PORT`` on the sandbox's own loopback (:mod:`sandbox.tunnel`).
So the server must listen on the sandbox's loopback or on all its addresses (``0.0.0.0``,
``::``), as any server does by default. ``8000`` forwards host port 8000 to sandbox port
8000, ``9000:8000`` host 9000 to sandbox 8000, ``:8000`` a free host port (printed) to
sandbox 8000. Any TCP protocol passes: HTTP, WebSockets, a database.

It prints ``Forwarding from ADDR:HOST_PORT -> SANDBOX_PORT`` for each listener, then runs
until Ctrl-C or SIGTERM (exit 0). A connection to a port where nothing listens in the
sandbox is closed and said on stderr. While it runs the sandbox is kept from its idle
exit (the server in it would go with it).

Binding anything but a loopback address needs ``--address`` and is said on stderr:
everyone who can reach that address then reaches the server in the sandbox.

Exit codes: 0 stopped by a signal; 1 a host port cannot be listened on; 2 usage error;
125 the sandbox cannot be started (no engine, no image...).
"""

from __future__ import annotations

import os
import sys

from .common import unsafe_local_refused

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from ..settings import Settings

#: Seconds between the requests that keep the sandbox from its idle exit.
KEEPALIVE = 60.0
_LOOPBACK = ("127.", "::1", "localhost")


def _usage(message: str) -> int:
    print(f"loom-worker port-forward: error: {message}", file=sys.stderr)
    return 2


def _say(text: str, *, err: bool = True) -> None:
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def parse_spec(spec: str) -> tuple[int, int]:
    """``[HOST_PORT:]SANDBOX_PORT`` as (host port, 0 for any free one; sandbox port).
    Raises ValueError naming the problem."""
    host, sep, sandbox = spec.rpartition(":")
    if not sep:
        host = sandbox
    try:
        sport = int(sandbox)
        hport = int(host) if host else 0
    except ValueError:
        raise ValueError(f"{spec!r} is not [HOST_PORT:]SANDBOX_PORT (ports are numbers)") from None
    if not 1 <= sport <= 65535 or not 0 <= hport <= 65535:
        raise ValueError(f"{spec!r}: ports are 1-65535 (host port 0: any free one)")
    return hport, sport


def is_loopback(address: str) -> bool:
    return address.startswith(_LOOPBACK)


async def forward(
    sandbox: Any, address: str, pairs: list[tuple[int, int]], *, ready: Any = None, stop: Any = None
) -> int:
    """Listen on ``address`` for each (host port, sandbox port) and relay every
    connection through a tunnel of ``sandbox`` until ``stop`` (an asyncio.Event) is set.
    ``ready(lines)`` gets the ``Forwarding from`` lines once every listener is up.
    Returns the exit code (1 when a listener cannot be opened)."""
    import asyncio

    from sandbox.capabilities import tunnels
    from sandbox.errors import AgentError, SandboxError
    from sandbox.tunnel import relay

    stop = stop or asyncio.Event()
    active: set[asyncio.Task[Any]] = set()

    def handler(sport: int) -> Any:
        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            if task is not None:
                active.add(task)
            try:
                try:
                    tunnel = await tunnels(sandbox).open_tunnel(sport)
                except AgentError as e:
                    _say(f"loom-worker port-forward: connection to sandbox port {sport} refused: {e}")
                    writer.transport.abort()
                    return
                except SandboxError as e:
                    _say(f"loom-worker port-forward: the sandbox is unavailable: {e}")
                    writer.transport.abort()
                    return
                error = await relay(tunnel, reader, writer)
                if error:
                    _say(f"loom-worker port-forward: a connection to sandbox port {sport} broke: {error}")
            finally:
                if task is not None:
                    active.discard(task)

        return on_connection

    servers = []
    lines = []
    try:
        for hport, sport in pairs:
            try:
                # A large buffer: the relay reads the client in big pieces (upload speed).
                server = await asyncio.start_server(handler(sport), address, hport, limit=4 << 20)
            except OSError as e:
                _say(f"loom-worker port-forward: cannot listen on {address}:{hport}: {e.strerror or e}")
                return 1
            servers.append(server)
            sock = server.sockets[0].getsockname()
            shown = f"[{sock[0]}]" if ":" in sock[0] else sock[0]
            lines.append(f"Forwarding from {shown}:{sock[1]} -> {sport}")
        if ready is not None:
            ready(lines)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), KEEPALIVE)
            except TimeoutError:
                try:  # a request: the sandbox's idle clock starts again
                    await sandbox.info()
                except SandboxError as e:
                    _say(f"loom-worker port-forward: the sandbox did not answer: {e}")
        return 0
    finally:
        for server in servers:
            server.close()
        for task in list(active):
            task.cancel()
        await asyncio.gather(*active, return_exceptions=True)


def _cmd_port_forward(args: argparse.Namespace, _settings: Settings | None) -> int:
    pairs = []
    for spec in args.ports:
        try:
            pairs.append(parse_spec(spec))
        except ValueError as e:
            return _usage(str(e))
    ws = os.path.realpath(os.path.expanduser(args.workspace))
    if not os.path.isdir(ws):
        return _usage(f"--workspace {args.workspace} is not a directory")
    backend = getattr(args, "backend", "docker")
    if refused := unsafe_local_refused(backend):
        return _usage(refused)
    address = args.address
    if not is_loopback(address):
        _say(
            f"loom-worker port-forward: listening on {address}, not loopback: whoever can reach it reaches the "
            "server in the sandbox"
        )
    import asyncio
    import signal

    from sandbox.errors import SandboxError

    from . import verbosity
    from .common import load_settings

    settings = load_settings()
    verbosity.configure(settings)

    async def run() -> int:
        from ..registry import ToolRegistry, default_registry

        if backend == "local":
            from sandbox.local import LocalProcessBackend

            registry = ToolRegistry(backend=LocalProcessBackend())
        else:
            registry = default_registry(settings, changelog=False, catalog=False)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(s, stop.set)
        async with registry:
            try:
                sandbox = (await registry.workspace(ws)).sandbox
                await sandbox.info()  # started now, not at the first connection
            except SandboxError as e:
                _say(f"loom-worker port-forward: the sandbox is unavailable: {e}")
                return 125

            def ready(lines: list[str]) -> None:
                for line in lines:
                    _say(line, err=False)

            return await forward(sandbox, address, pairs, ready=ready, stop=stop)

    try:
        import uvloop

        return uvloop.run(run())
    except ImportError:  # pragma: no cover - uvloop is installed wherever the worker is
        return asyncio.run(run())


def register(subparsers: Any) -> None:
    import argparse

    p = subparsers.add_parser(
        "port-forward",
        help="Reach a server listening in the sandbox from this host (as kubectl port-forward).",
        description=(
            "Listen on this host and carry each connection to a port on the sandbox's loopback, through the "
            "agent's channel (the sandbox keeps no network). PORT: SANDBOX_PORT (the same port here), "
            "HOST_PORT:SANDBOX_PORT, or :SANDBOX_PORT (a free port here, printed). Runs until Ctrl-C."
        ),
        epilog="Exit status: 0 stopped by Ctrl-C or SIGTERM; 1 a host port cannot be listened on; 125 the sandbox "
        "cannot start; 2 usage error.",
    )
    p.add_argument("--workspace", "-w", required=True, help="Workspace directory.")
    p.add_argument(
        "--address",
        default="127.0.0.1",
        help="Address to listen on (default 127.0.0.1). Anything but loopback exposes the server to others.",
    )
    p.add_argument("--backend", choices=("docker", "local"), default="docker", help=argparse.SUPPRESS)
    p.add_argument("ports", nargs="+", metavar="[HOST_PORT:]SANDBOX_PORT", help="What to forward.")
    p.set_defaults(func=_cmd_port_forward, own_settings=True)
