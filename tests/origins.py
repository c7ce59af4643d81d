"""HTTPS servers of the tests' own, on this machine's loopback, for the secrets tests: an
origin that records every request it gets (headers, target, body) and a git forge (git's
own ``git http-backend`` behind Basic authentication). Both run in a thread of their own
and present certificates of a test CA (``trustme``) that only the gateway is told to
trust (``LOOM_EGRESS_UPSTREAM_CA``).

The origin is written with h11 so a test controls exactly what it answers: ``/reflect``
sends the request's headers back (in a header and in the body, as a careless API would),
``/big/N`` sends N bytes (``?reflect``: with the Authorization header every 64 KiB or
so), ``/reject`` answers 401 without reading the body (for ``Expect: 100-continue``),
anything else ``ok <target>``.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import random
import ssl
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import h11
import trustme


@dataclass
class Seen:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    chunked: bool = False
    connection: int = 0  # which TLS connection it came on (keep-alive: several per one)

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


@dataclass
class Origin:
    """An HTTPS origin on ``address``:``port`` for the names its certificate holds."""

    ca: trustme.CA
    names: tuple[str, ...]
    address: str = "127.0.0.1"
    port: int = 0
    tls: bool = True  # False: plain HTTP
    seen: list[Seen] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _server: Any = None
    _connections: int = 0

    def start(self) -> Origin:
        ctx: ssl.SSLContext | None = None
        if self.tls:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.ca.issue_cert(*self.names).configure_cert(ctx)
        ready = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()

            async def main() -> None:
                self._server = await asyncio.start_server(self._serve, self.address, self.port, ssl=ctx)
                self.port = self._server.sockets[0].getsockname()[1]
                ready.set()
                async with self._server:
                    await self._server.serve_forever()

            try:
                loop.run_until_complete(main())
            except (asyncio.CancelledError, RuntimeError):
                pass

        threading.Thread(target=run, daemon=True).start()
        if not ready.wait(10):
            raise RuntimeError("the test origin did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        number = self._connections
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                req = await _next(conn, reader)
                if not isinstance(req, h11.Request):
                    return
                seen = Seen(
                    req.method.decode(),
                    req.target.decode("latin-1"),
                    [(k.decode(), v.decode("latin-1")) for k, v in req.headers.raw_items()],
                    connection=number,
                )
                seen.chunked = any(v.lower() == "chunked" for v in seen.header("transfer-encoding"))
                self.seen.append(seen)
                expects = any(v.lower() == "100-continue" for v in seen.header("expect"))
                if seen.target.startswith("/reject"):
                    await self._answer(conn, writer, 401, b"no\n")
                    return
                if expects:
                    writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
                while True:
                    event = await _next(conn, reader)
                    if isinstance(event, h11.Data):
                        seen.body += bytes(event.data)
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        return
                await self._respond(conn, writer, seen)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (h11.ProtocolError, OSError, ssl.SSLError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _respond(self, conn: h11.Connection, writer: asyncio.StreamWriter, seen: Seen) -> None:
        if seen.target.startswith("/reflect"):
            text = "".join(f"{k}: {v}\n" for k, v in seen.headers).encode() + b"target: " + seen.target.encode()
            auth = ", ".join(seen.header("authorization")) or "-"
            await self._answer(conn, writer, 200, text + b"\n", [("X-Seen-Authorization", auth)])
        elif seen.target.startswith("/big/"):
            n = int(seen.target.split("/")[2].split("?")[0])
            writer.write(conn.send(h11.Response(status_code=200, headers=[("Content-Length", str(n))])) or b"")
            if seen.method == "HEAD":
                n = 0
            chunk = b"x" * (1 << 20)
            if seen.target.endswith("?reflect"):  # the Authorization header inside, here and there
                auth = (seen.header("authorization") or ["-"])[0].encode()
                chunk = (b"x" * 65_521 + auth) * 16
                chunk = chunk[: 1 << 20]
            while n:
                part = chunk[: min(n, len(chunk))]
                writer.write(conn.send(h11.Data(data=part)) or b"")
                n -= len(part)
                await writer.drain()
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
        else:
            await self._answer(conn, writer, 200, f"ok {seen.target} {len(seen.body)}\n".encode())

    @staticmethod
    async def _answer(
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        hdrs = [("Content-Length", str(len(body))), ("Content-Type", "text/plain"), *(headers or [])]
        out = conn.send(h11.Response(status_code=status, headers=hdrs)) or b""
        out += (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
        writer.write(out)
        await writer.drain()


async def _next(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
            continue
        return event


class GitForge:
    """``git http-backend`` over HTTPS with Basic authentication (user ``git``, the
    given password), serving bare repositories under ``root``. Pushes need the same."""

    def __init__(self, ca: trustme.CA, names: tuple[str, ...], root: Path, password: str, address: str) -> None:
        self.root = root
        self.password = password
        self.refused = 0
        self.authorized = 0
        forge = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _cgi(self) -> None:
                want = "Basic " + base64.b64encode(f"git:{forge.password}".encode()).decode()
                if self.headers.get("Authorization") != want:
                    forge.refused += 1
                    body = b"authentication required\n"
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="forge"')
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                forge.authorized += 1
                body = self._body()
                path, _, query = self.path.partition("?")
                env = {
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "GIT_PROJECT_ROOT": str(forge.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": self.command,
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_USER": "git",
                    "REMOTE_ADDR": "127.0.0.1",
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                }
                out = subprocess.run(
                    ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
                ).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                if not _:
                    head, _, payload = out.partition(b"\n\n")
                status = 200
                headers = []
                for line in head.decode("latin-1").splitlines():
                    k, _, v = line.partition(":")
                    if k.lower() == "status":
                        status = int(v.split()[0])
                    elif k:
                        headers.append((k, v.strip()))
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            do_GET = do_POST = _cgi

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(*names).configure_cert(ctx)
        self.server = ThreadingHTTPServer((address, 443), Handler)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Net:
    """The secrets tests' little internet on loopback: HTTPS origins for api.test,
    other.test and third.test, a forge for git.test, each on port 443 of its own random
    127.x.y.z (so the default port works, and runs at once do not collide), with a test
    CA; and plain.test, plain HTTP on port 80."""

    ca: trustme.CA
    ca_file: Path
    addresses: dict[str, str]
    origins: dict[str, Origin]
    forge: GitForge
    repo: Path

    @classmethod
    def start(cls, tmp_path: Path) -> Net:
        ca = trustme.CA()
        ca_file = tmp_path / "origins-ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        base = f"127.{random.randint(100, 250)}.{random.randint(0, 250)}"
        names = ("api.test", "other.test", "third.test", "git.test", "plain.test")
        addresses = {n: f"{base}.{i + 1}" for i, n in enumerate(names)}
        origins = {n: Origin(ca, (n,), address=addresses[n], port=443).start() for n in names[:3]}
        origins["plain.test"] = Origin(ca, ("plain.test",), address=addresses["plain.test"], port=80, tls=False).start()
        repo = bare_repo(tmp_path / "forge")
        password = "forge-password-" + uuid.uuid4().hex
        forge = GitForge(ca, ("git.test",), tmp_path / "forge", password, addresses["git.test"])
        return cls(ca, ca_file, addresses, origins, forge, repo)

    def stop(self) -> None:
        for o in self.origins.values():
            o.stop()
        self.forge.stop()

    def seen(self, name: str) -> list[Seen]:
        return self.origins[name].seen

    def settings(self, tmp_path: Path) -> dict[str, Any]:
        """The worker settings of a test: loopback allowed, the origins' CA trusted by the
        gateway; the sandbox trusts the public roots and that CA (as an operator gives it a
        private registry's), so a host without secrets is reachable through a plain tunnel."""
        trust = tmp_path / "sandbox-trust.pem"
        trust.write_bytes(Path("/etc/ssl/certs/ca-certificates.crt").read_bytes() + self.ca_file.read_bytes())
        return {"egress_trusted_networks": "127.0.0.0/8", "egress_upstream_ca": self.ca_file, "ca_bundle": trust}

    def resolve_for(self, registry: Any) -> None:
        """Make ``registry``'s gateway resolve the test names to their addresses."""
        make = registry.pool.egress_factory

        async def resolver(host: str, port: int) -> list[Any]:
            if host not in self.addresses:
                raise OSError(-2, "Name or service not known")
            return [ipaddress.ip_address(self.addresses[host])]

        def factory() -> Any:
            gw = make()
            gw.upstream.resolver = resolver
            return gw

        registry.pool.egress_factory = factory


def bare_repo(forge: Path) -> Path:
    """``forge/repo.git`` with one commit on main."""
    repo = forge / "repo.git"
    seed = forge.parent / "seed"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", "--bare", str(repo)], check=True)
    subprocess.run([*git, "init", "-q", str(seed)], check=True)
    (seed / "README").write_text("hello from the forge\n")
    subprocess.run([*git, "-C", str(seed), "add", "."], check=True)
    subprocess.run([*git, "-C", str(seed), "commit", "-qm", "first"], check=True)
    subprocess.run([*git, "-C", str(seed), "push", "-q", str(repo), "HEAD:main"], check=True)
    return repo
