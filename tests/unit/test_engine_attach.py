"""The engine's attach stream (``Engine.attach``), against a fake engine on a unix socket:
the upgrade and the bytes that come with it, an engine that never answers (the call ends
at the engine's timeout or with its caller, and closes its connection), and refusals."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import sandbox.docker.engine as engine_mod
from sandbox.docker.channel import DockerExecTransport
from sandbox.docker.engine import Engine
from sandbox.errors import DaemonUnavailableError, SandboxUnavailableError

Answer = Callable[[socket.socket], None]


class FakeEngine:
    """Answers ``GET /version`` (the SDK asks it first) and each attach with ``answer``;
    records the attach requests and whether each attach connection was closed by the
    client."""

    def __init__(self, path: Path | None, answer: Answer) -> None:
        """On a unix socket at ``path``, or on loopback TCP (``path`` None: ``url``)."""
        self.answer = answer
        self.requests: list[str] = []
        self.closed = threading.Event()
        if path is not None:
            self._srv = socket.socket(socket.AF_UNIX)
            self._srv.bind(str(path))
            self.url = f"unix://{path}"
        else:
            self._srv = socket.socket(socket.AF_INET)
            self._srv.bind(("127.0.0.1", 0))
            self.url = f"tcp://127.0.0.1:{self._srv.getsockname()[1]}"
        self._srv.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            while True:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                text = head.decode()
                if text.startswith("GET") and "/version" in text.split("\r\n")[0]:
                    body = json.dumps({"ApiVersion": "1.41", "Version": "20.10.24"}).encode()
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(body), body)
                    )
                    continue
                self.requests.append(text)
                self.answer(conn)
                while True:  # (the stream stays: until the client closes it)
                    try:
                        if conn.recv(4096) == b"":
                            self.closed.set()
                            return
                    except OSError:
                        return

    def close(self) -> None:
        self._srv.close()


MakeFake = Callable[[Answer], "FakeEngine"]


@pytest.fixture(params=["unix", "tcp"])
def fake(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[Answer], FakeEngine]]:
    """A fake engine on a unix socket, then on plain TCP (``DOCKER_HOST=tcp://``)."""
    made: list[FakeEngine] = []

    def make(answer: Answer) -> FakeEngine:
        made.append(FakeEngine(tmp_path / "docker.sock" if request.param == "unix" else None, answer))
        return made[-1]

    yield make
    for f in made:
        f.close()


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


def upgrade(conn: socket.socket) -> None:
    conn.sendall(
        b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
        b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n" + frame(1, b"hello\n")
    )


def hang(conn: socket.socket) -> None:
    pass  # reads nothing more, answers nothing


def refuse(status: bytes, message: str) -> Answer:
    def answer(conn: socket.socket) -> None:
        body = json.dumps({"message": message}).encode()
        conn.sendall(
            b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)
        )

    return answer


def hang_up(conn: socket.socket) -> None:
    conn.shutdown(socket.SHUT_WR)


def engine_at(f: FakeEngine) -> Engine:
    return Engine(base_url=f.url)


async def test_the_attach_upgrades_the_connection_and_keeps_the_bytes_that_came_with_the_answer(fake: MakeFake) -> None:
    f = fake(upgrade)
    engine = engine_at(f)
    transport = await DockerExecTransport.open(*await engine.attach("abc", "attach sandbox agent"))
    try:
        assert await transport.read() == (b"hello\n", b"")
        await transport.write(b"source\n")
        line, *headers = f.requests[0].split("\r\n")
        assert line == "POST /v1.41/containers/abc/attach?stdin=1&stdout=1&stderr=1&stream=1 HTTP/1.1"
        assert "Upgrade: tcp" in headers and "Connection: Upgrade" in headers
        host = "localhost" if f.url.startswith("unix:") else f.url.removeprefix("tcp://")
        assert f"Host: {host}" in headers
    finally:
        await transport.close()
    assert await asyncio.to_thread(f.closed.wait, 5)
    await engine.aclose()


async def test_an_engine_that_never_answers_the_attach_fails_it_at_its_timeout_and_closes_the_connection(
    fake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_mod, "TIMEOUT", 0.3)
    f = fake(hang)
    engine = engine_at(f)
    with pytest.raises(DaemonUnavailableError, match="attach sandbox agent: the Docker daemon did not answer in time"):
        await engine.attach("abc", "attach sandbox agent")
    assert await asyncio.to_thread(f.closed.wait, 5)
    await engine.aclose()


async def test_an_attach_whose_caller_gives_up_ends_with_it_and_closes_the_connection(fake: MakeFake) -> None:
    f = fake(hang)
    engine = engine_at(f)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(engine.attach("abc", "attach sandbox agent"), 0.2)
    assert await asyncio.to_thread(f.closed.wait, 5)
    await engine.aclose()


@pytest.mark.parametrize(
    ("answer", "error", "message"),
    [
        (refuse(b"404 Not Found", "No such container: abc"), SandboxUnavailableError, "No such container: abc"),
        (refuse(b"409 Conflict", "container abc is paused"), SandboxUnavailableError, "container abc is paused"),
        (refuse(b"500 Internal Server Error", "oops"), DaemonUnavailableError, "oops"),
        (hang_up, DaemonUnavailableError, "does not answer"),
    ],
)
async def test_an_attach_the_engine_refuses_names_the_call_and_why(
    fake: MakeFake, answer: Answer, error: type[Exception], message: str
) -> None:
    f = fake(answer)
    engine = engine_at(f)
    with pytest.raises(error, match=f"attach pooled sandbox: .*{message}") as e:
        await engine.attach("abc", "attach pooled sandbox")
    if error is SandboxUnavailableError:  # the sandbox's problem, not the daemon's
        assert not isinstance(e.value, DaemonUnavailableError)
    await engine.aclose()


def test_where_the_engine_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert Engine()._endpoint() == "/var/run/docker.sock"
    assert Engine(base_url="unix:///run/user/1000/docker.sock")._endpoint() == "/run/user/1000/docker.sock"
    assert Engine(base_url="unix://var/run/docker.sock")._endpoint() == "/var/run/docker.sock"  # docker's legacy form
    assert Engine(base_url="tcp://127.0.0.1:2375")._endpoint() == ("127.0.0.1", 2375)
    assert Engine(base_url="tcp://[::1]:2375")._endpoint() == ("::1", 2375)
    assert Engine(base_url="ssh://me@host")._endpoint() is None  # the SDK's attach
    assert Engine(client_factory=object)._endpoint() is None
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2375")
    assert Engine()._endpoint() == ("10.0.0.1", 2375)
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    assert Engine()._endpoint() is None
