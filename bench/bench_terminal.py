"""Terminal benchmark: a person's keystroke and a program's flood of output through a
terminal in the sandbox, for each way to one, beside ``docker exec -it`` into the same
container (the baseline), in one run, under each runtime:

* keystroke to echo, p50 and p99 (ms): one byte typed, timed until it comes back, ``--n``
  times, into ``cat`` on a terminal without echo or lines (``stty -icanon -echo``: the
  program echoes, as a shell's line editor or an editor does);
* output throughput (MB/s): ``cat`` of a ``--mb`` MB file (base64: no line breaks to
  translate), timed from the Enter that starts it to the file's last byte read.

The paths:

* ``loom-worker shell -w WS -- CMD`` (the CLI, a process of its own) on a pseudo-terminal
  this script owns (``pty.openpty``: its standard input and output are the slave; we
  type into the master and read it), exactly as a terminal emulator drives it;
* ``docker exec -it CONTAINER CMD`` into the sandbox's own container, on a pty of ours
  driven the same way (the baseline);
* for scale, a pseudo-terminal made inside the sandbox and read there, no client at all
  (the floor of every path that makes its terminal inside the sandbox: under gVisor, that
  terminal is gVisor's own, where ``docker exec -it`` gets one of the host from runsc);
* the service's WebSocket (``/v1/workspaces/{id}/terminals/{tid}/ws``, subprotocol
  ``loom.terminal.v1``, ``Authorization: Bearer``) of a ``loom-worker serve`` process:
  :func:`websocket_rows` needs only the service's URL and token. Where the service has no
  such route, its row says so ("route not present") rather than a number.

Each path's start (the CLI's import, the exec's setup, the WebSocket's handshake) is
left out: the clock runs only once the program in the terminal said it is ready. The
rounds are interleaved, so a busy moment hits every path alike; the table shows medians
of the rounds. Targets (issue 40): echo p50 <= 0.5x docker exec -it's, throughput >= 1x.

Usage: .venv/bin/python bench/bench_terminal.py [--runtime runc|runsc|both] [--n 500] [--mb 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import select
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from common import env_for, free_port

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "worker.cli"]
BIG = "/tmp/bench-terminal.txt"
END = b"THE-END-OF-IT"
#: cat with the terminal's echo off and its lines off: each byte comes back as cat reads
#: it; Ctrl-C still ends it (the terminal's signals are on).
ECHO_PROGRAM = ["sh", "-c", "stty -icanon -echo min 1; echo READY; exec cat"]
CAT_PROGRAM = ["sh", "-c", f"echo READY; read x; cat {BIG}"]
SIZE = (100, 30)


#: Run in the sandbox (``docker exec -i CONTAINER python3 -``): the same two measurements
#: on a pseudo-terminal made there, read by this program itself, no client: the floor of
#: any terminal made inside the sandbox (under gVisor, gVisor's own terminal). Prints JSON.
INSIDE = r"""
import json, os, subprocess, sys, time
n, big, end = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
def start(argv):
    m, s = os.openpty()
    p = subprocess.Popen(argv, stdin=s, stdout=s, stderr=s, start_new_session=True)
    os.close(s)
    seen = b""
    while b"READY" not in seen:
        seen += os.read(m, 4096)
    return m, p
m, p = start(["sh", "-c", "stty -icanon -echo min 1; echo READY; exec cat"])
lat = []
for i in range(n + 20):
    t = time.perf_counter(); os.write(m, b"a"); got = b""
    while b"a" not in got:
        got = os.read(m, 4096)
    if i >= 20:
        lat.append(time.perf_counter() - t)
p.kill(); p.wait(); os.close(m)
m, p = start(["sh", "-c", "echo READY; read x; cat " + big])
t = time.perf_counter(); os.write(m, b"\n"); tail = b""
while True:
    c = os.read(m, 1 << 20)
    if end in tail + c:
        break
    tail = c[-len(end):]
dt = time.perf_counter() - t
p.wait(); os.close(m)
lat.sort()
print(json.dumps({"p50": lat[len(lat) // 2] * 1e3, "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3,
                  "mbs": os.path.getsize(big) / dt / 1e6}))
"""


def inside_round(container: str, n: int) -> dict[str, Any]:
    argv = ["docker", "exec", "-i", container, "python3", "-", str(n), BIG, END.decode()]
    p = subprocess.run(argv, input=INSIDE.encode(), capture_output=True, timeout=600, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"the measurement inside the sandbox failed: {p.stderr.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(p.stdout)
    return result


def pct(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# -- a program on a pty of ours ------------------------------------------------------------------


class PtyProgram:
    """``argv`` with a pseudo-terminal of ours as its standard input, output and error."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=str(ROOT), start_new_session=True
        )
        os.close(slave)
        self.seen = bytearray()

    def read_until(self, needle: bytes, timeout: float = 120.0) -> None:
        """Read the master until ``needle`` has come (what came before it is dropped)."""
        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.master], [], [], left)[0]:
                raise TimeoutError(f"{needle!r} did not come; last output: {bytes(self.seen[-300:])!r}")
            try:
                self.seen += os.read(self.master, 1 << 16)
            except OSError as e:  # EIO: the program ended
                raise RuntimeError(f"the program ended before {needle!r}: {bytes(self.seen[-300:])!r}") from e
            del self.seen[: max(0, len(self.seen) - 4096)]
        self.seen = self.seen[self.seen.index(needle) + len(needle) :]

    def echo_latencies(self, n: int) -> list[float]:
        out = []
        for i in range(n + 20):
            t = time.perf_counter()
            os.write(self.master, b"a")
            got = b""
            while b"a" not in got:
                if not select.select([self.master], [], [], 60)[0]:
                    raise TimeoutError("a keystroke was not echoed within a minute")
                got = os.read(self.master, 4096)
            if i >= 20:  # (the first are warm-up)
                out.append(time.perf_counter() - t)
        return out

    def throughput(self, size: int) -> float:
        t = time.perf_counter()
        os.write(self.master, b"\n")
        tail = b""
        while True:
            chunk = os.read(self.master, 1 << 20)
            if END in tail + chunk:
                break
            tail = chunk[-len(END) :]
        return size / (time.perf_counter() - t) / 1e6

    def close(self) -> None:
        """Ctrl-C (the program in the terminal ends, and so does the client: a client
        killed instead would leave a terminal of the CLI's running), then SIGTERM."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.write(self.master, b"\x03")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self.master)


def pty_round(argv_of: Callable[[list[str]], list[str]], env: dict[str, str], n: int, size: int) -> dict[str, Any]:
    """One round of a pty-driven path: ``argv_of(program)`` is the command that runs the
    program in a terminal of the sandbox."""
    echo = PtyProgram(argv_of(ECHO_PROGRAM), env)
    try:
        echo.read_until(b"READY")
        lat = echo.echo_latencies(n)
    finally:
        echo.close()
    cat = PtyProgram(argv_of(CAT_PROGRAM), env)
    try:
        cat.read_until(b"READY")
        mbs = cat.throughput(size)
    finally:
        cat.close()
    return {"p50": pct(lat, 0.5) * 1e3, "p99": pct(lat, 0.99) * 1e3, "mbs": mbs}


# -- the WebSocket --------------------------------------------------------------------------------


class WsClient:
    """A minimal WebSocket client (wsproto, the service's own library) for binary frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: Any) -> None:
        self.reader, self.writer, self.conn = reader, writer, conn
        self.pending: list[Any] = []

    @classmethod
    async def connect(cls, url: str, token: str, protocol: str) -> WsClient:
        from urllib.parse import urlsplit

        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection, Request

        u = urlsplit(url)
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        conn = WSConnection(ConnectionType.CLIENT)
        target = u.path + (f"?{u.query}" if u.query else "")
        headers = [(b"authorization", f"Bearer {token}".encode())]
        writer.write(
            conn.send(
                Request(host=f"{u.hostname}:{u.port}", target=target, subprotocols=[protocol], extra_headers=headers)
            )
        )
        client = cls(reader, writer, conn)
        event = await client.event()
        if not isinstance(event, AcceptConnection):
            raise RuntimeError(f"the WebSocket handshake was refused: {event!r}")
        return client

    async def event(self) -> Any:
        while not self.pending:
            data = await self.reader.read(1 << 20)
            self.conn.receive_data(data or None)
            self.pending.extend(self.conn.events())
        return self.pending.pop(0)

    async def data(self) -> bytes | str:
        """The next message's payload (binary: bytes; text: str). Raises EOFError at a close."""
        from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

        while True:
            event = await self.event()
            if isinstance(event, BytesMessage | TextMessage):
                return event.data  # type: ignore[no-any-return]
            if isinstance(event, Ping):
                self.writer.write(self.conn.send(event.response()))
            elif isinstance(event, CloseConnection):
                raise EOFError(f"closed {event.code} {event.reason}")

    async def send(self, data: bytes) -> None:
        from wsproto.events import BytesMessage

        self.writer.write(self.conn.send(BytesMessage(data=data)))
        await self.writer.drain()

    async def close(self) -> None:
        self.writer.close()


async def websocket_rows(url: str, token: str, workspace_id: str, n: int, size: int) -> dict[str, Any] | str:
    """One round through the service at ``url``: the same two measurements as the pty
    paths, or why none could be made ("route not present" where the service has no
    terminal WebSocket)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        paths = (await http.get("/openapi.json")).json().get("paths", {})
        base = f"/v1/workspaces/{workspace_id}/terminals"
        if "/v1/workspaces/{workspace_id}/terminals" not in paths:
            return "route not present"

        async def session(program: list[str]) -> tuple[WsClient, str]:
            r = await http.post(base, json={"command": program, "cols": SIZE[0], "rows": SIZE[1]})
            if r.status_code != 201:
                raise RuntimeError(f"POST {base}: {r.status_code} {r.text[:300]}")
            tid = r.json()["id"]
            ws_url = url.replace("http", "ws", 1) + f"{base}/{tid}/ws"
            ws = await WsClient.connect(ws_url, token, "loom.terminal.v1")
            first = await ws.data()
            if not (isinstance(first, str) and json.loads(first).get("type") == "attached"):
                raise RuntimeError(f"the first frame was not 'attached': {first!r}")
            seen = b""
            while b"READY" not in seen:
                got = await ws.data()
                seen += got if isinstance(got, bytes) else b""
            return ws, tid

        async def binary(ws: WsClient) -> bytes:
            while True:
                got = await ws.data()
                if isinstance(got, bytes):
                    return got

        ws, tid = await session(ECHO_PROGRAM)
        lat = []
        try:
            for i in range(n + 20):
                t = time.perf_counter()
                await ws.send(b"a")
                while b"a" not in await binary(ws):
                    pass
                if i >= 20:
                    lat.append(time.perf_counter() - t)
        finally:
            await ws.close()
            await http.delete(f"{base}/{tid}")
        ws, tid = await session(CAT_PROGRAM)
        try:
            t = time.perf_counter()
            await ws.send(b"\n")
            tail = b""
            while True:
                chunk = await binary(ws)
                if END in tail + chunk:
                    break
                tail = chunk[-len(END) :]
            mbs = size / (time.perf_counter() - t) / 1e6
        finally:
            await ws.close()
            await http.delete(f"{base}/{tid}")
    return {"p50": pct(lat, 0.5) * 1e3, "p99": pct(lat, 0.99) * 1e3, "mbs": mbs}


async def start_service(env: dict[str, str], root: Path) -> tuple[asyncio.subprocess.Process, str, str]:
    """``loom-worker serve`` on a free loopback port (its workspaces under ``root``): the
    process, its URL and token."""
    port = free_port()
    token = secrets.token_hex(8)
    senv = {**env, "LOOM_WORKSPACE_ROOT": str(root), "LOOM_API_TOKEN": token, "LOOM_PORT": str(port)}
    proc = await asyncio.create_subprocess_exec(
        *CLI, "serve", env=senv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as c:
        for _ in range(600):
            try:
                if (await c.get(f"{url}/healthz")).status_code == 200:
                    return proc, url, token
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit("the service did not start")


# -- one runtime ------------------------------------------------------------------------------------


async def one_runtime(runtime: str, args: argparse.Namespace) -> list[tuple[str, list[dict[str, Any] | str]]]:
    from sandbox.docker import container_name

    tmp = Path(tempfile.mkdtemp(prefix="bench-term-", dir="/tmp"))
    root = tmp / "root"
    ws = root / ("ws-" + secrets.token_hex(3))
    ws.mkdir(parents=True)
    os.chown(ws, 1000, 1000)
    run = tmp / "run"
    run.mkdir(mode=0o700)
    env = {**env_for(runtime, tmp / "data", run), "LOOM_CLI_DAEMON": "0"}
    size = args.mb * 1_000_000
    make = f"head -c {size * 3 // 4} /dev/urandom | base64 -w0 > {BIG} && printf '\\n%s\\n' {END.decode()} >> {BIG}"
    rows: dict[str, list[dict[str, Any] | str]] = {"docker exec -it (baseline)": [], "loom-worker shell": []}
    rows["WebSocket (serve)"] = []
    rows["a pty inside the sandbox, no client (floor)"] = []
    service = None
    try:
        argv = [*CLI, "exec", "-w", str(ws), "--", make]
        p = await asyncio.to_thread(subprocess.run, argv, env=env, capture_output=True, cwd=str(ROOT))
        if p.returncode != 0:
            raise SystemExit(f"could not start the sandbox: {p.stderr.decode()[-2000:]}")
        container = container_name(ws)
        service, url, token = await start_service(env, root)

        def docker(program: list[str]) -> list[str]:
            return ["docker", "exec", "-it", container, *program]

        def shell(program: list[str]) -> list[str]:
            return [*CLI, "shell", "-w", str(ws), "--", *program]

        for _ in range(args.rounds):
            rows["docker exec -it (baseline)"].append(await asyncio.to_thread(pty_round, docker, env, args.n, size))
            rows["loom-worker shell"].append(await asyncio.to_thread(pty_round, shell, env, args.n, size))
            rows["WebSocket (serve)"].append(await websocket_rows(url, token, ws.name, args.n, size))
            floor = await asyncio.to_thread(inside_round, container, args.n)
            rows["a pty inside the sandbox, no client (floor)"].append(floor)
    finally:
        if service is not None and service.returncode is None:
            service.terminate()
            await service.wait()
        stop = [*CLI, "stop", "-w", str(ws)]
        await asyncio.to_thread(subprocess.run, stop, env=env, capture_output=True, cwd=str(ROOT))
        shutil.rmtree(tmp, ignore_errors=True)
    return [(f"{runtime}: {k}", v) for k, v in rows.items()]


def table(results: list[tuple[str, list[dict[str, Any] | str]]], args: argparse.Namespace) -> None:
    print(
        f"\nA terminal in the sandbox; medians of {args.rounds} rounds; echo: {args.n} keystrokes per round; "
        f"throughput: cat of a {args.mb} MB file\n"
    )
    print(
        "| runtime: path | echo p50 (ms) | echo p99 (ms) | throughput (MB/s) | p50 vs docker | throughput vs docker |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    base: dict[str, float] = {}
    for name, rounds in results:
        why = next((r for r in rounds if isinstance(r, str)), None)
        if why is not None:
            print(f"| {name} | {why} | | | | |")
            continue
        m = {k: statistics.median(float(r[k]) for r in rounds if isinstance(r, dict)) for k in ("p50", "p99", "mbs")}
        if name.endswith("(baseline)"):
            base = m
        print(
            f"| {name} | {m['p50']:.3f} | {m['p99']:.3f} | {m['mbs']:.0f} | {m['p50'] / base['p50']:.2f} "
            f"| {m['mbs'] / base['mbs']:.2f} |"
        )


async def main(args: argparse.Namespace) -> None:
    results = []
    for runtime in ["runc", "runsc"] if args.runtime == "both" else [args.runtime]:
        results += await one_runtime(runtime, args)
    table(results, args)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runtime", choices=("runc", "runsc", "both"), default="both")
    ap.add_argument("--n", type=int, default=500, help="Keystrokes per round.")
    ap.add_argument("--mb", type=int, default=100, help="Size of the file cat prints (MB).")
    ap.add_argument("--rounds", type=int, default=3)
    return ap.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
