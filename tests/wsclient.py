"""A small asyncio WebSocket client for the tests (over wsproto, the service's own
WebSocket library): connect with subprotocols and headers, send bytes or text, receive
messages and the close. Real connections to a real server (:func:`tests.servers.serve_app`),
on the test's own loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)


class Refused(Exception):
    """The handshake was refused with an HTTP status."""

    def __init__(self, status: int) -> None:
        super().__init__(f"handshake refused: HTTP {status}")
        self.status = status


@dataclass
class Closed(Exception):
    """The server closed the connection (or the stream ended: 1006)."""

    code: int
    reason: str


class WebSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: WSConnection) -> None:
        self.reader, self.writer, self.conn = reader, writer, conn
        self.subprotocol: str | None = None
        self._events: list[Event] = []
        self._text: list[str] = []
        self._bytes: list[bytes] = []
        self.closed: Closed | None = None

    async def _flush(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def _event(self) -> Event:
        while not self._events:
            data = await self.reader.read(65536)
            self.conn.receive_data(data or None)
            self._events.extend(self.conn.events())
        return self._events.pop(0)

    async def send_bytes(self, data: bytes) -> None:
        await self._flush(self.conn.send(BytesMessage(data=data)))

    async def send_text(self, text: str) -> None:
        await self._flush(self.conn.send(TextMessage(data=text)))

    async def send_json(self, value: Any) -> None:
        await self.send_text(json.dumps(value))

    async def receive(self) -> str | bytes:
        """The next whole message. Raises Closed (with the code and reason)."""
        if self.closed is not None:
            raise self.closed
        while True:
            event = await self._event()
            if isinstance(event, TextMessage):
                self._text.append(event.data)
                if event.message_finished:
                    text, self._text = "".join(self._text), []
                    return text
            elif isinstance(event, BytesMessage):
                self._bytes.append(bytes(event.data))
                if event.message_finished:
                    data, self._bytes = b"".join(self._bytes), []
                    return data
            elif isinstance(event, Ping):
                await self._flush(self.conn.send(event.response()))
            elif isinstance(event, CloseConnection):
                self.closed = Closed(event.code, event.reason or "")
                try:
                    await self._flush(self.conn.send(event.response()))
                except (ConnectionError, RuntimeError):
                    pass
                raise self.closed

    async def receive_json(self) -> Any:
        message = await self.receive()
        assert isinstance(message, str), message
        return json.loads(message)

    async def close(self, code: int = 1000) -> None:
        if self.closed is None:
            try:
                await self._flush(self.conn.send(CloseConnection(code=code)))
            except (ConnectionError, RuntimeError):
                pass
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    async def __aenter__(self) -> WebSocket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(url: str, *, subprotocols: Sequence[str] = (), headers: dict[str, str] | None = None) -> WebSocket:
    """Open a WebSocket to ``url`` (``ws://host:port/path?query``). Raises Refused."""
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    conn = WSConnection(ConnectionType.CLIENT)
    target = u.path + (f"?{u.query}" if u.query else "")
    extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    ws = WebSocket(reader, writer, conn)
    await ws._flush(
        conn.send(Request(host=u.netloc, target=target, subprotocols=list(subprotocols), extra_headers=extra))
    )
    while True:
        event = await ws._event()
        if isinstance(event, AcceptConnection):
            ws.subprotocol = event.subprotocol
            return ws
        if isinstance(event, RejectConnection):
            writer.close()
            raise Refused(event.status_code)
