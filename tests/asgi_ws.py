"""A WebSocket handshake made to an ASGI app in process, on the test's own loop (Starlette's
TestClient runs the app on a loop of its own, which a registry of the test's loop cannot
serve): what the app answers first, an acceptance, a close, or an HTTP answer (the ASGI
denial extension, offered unless ``denial=False``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    """``kind``: ``accept``, ``close`` or ``http``."""

    kind: str
    subprotocol: str | None = None
    code: int | None = None
    reason: str = ""
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def detail(self) -> str:
        """The ``detail`` of a JSON answer, or the close's reason."""
        if self.kind != "http":
            return self.reason
        return str(json.loads(self.body)["detail"])

    @property
    def refused(self) -> bool:
        return self.kind != "accept"


async def handshake(
    app: Any,
    path: str,
    headers: dict[str, str] | None = None,
    subprotocols: Sequence[str] = (),
    *,
    host: str = "127.0.0.1:8080",
    denial: bool = True,
) -> Answer:
    """The app's answer to a handshake to ``path`` (a query after ``?``); an accepted one
    is then closed by the client (1000)."""
    raw_path, _, query = path.partition("?")
    given = {"host": host, **{k.lower(): v for k, v in (headers or {}).items()}}
    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "scheme": "ws",
        "server": ("127.0.0.1", 8080),
        "client": ("127.0.0.1", 50000),
        "root_path": "",
        "path": raw_path,
        "raw_path": raw_path.encode(),
        "query_string": query.encode(),
        "headers": [(k.encode(), v.encode()) for k, v in given.items()],
        "subprotocols": list(subprotocols),
        "extensions": {"websocket.http.response": {}} if denial else {},
    }
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    inbox.put_nowait({"type": "websocket.connect"})
    answered: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    http = Answer("http")
    body: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        kind = message["type"]
        if answered.done():
            return
        if kind == "websocket.accept":
            answered.set_result(Answer("accept", subprotocol=message.get("subprotocol")))
        elif kind == "websocket.close":
            answered.set_result(Answer("close", code=message.get("code", 1000), reason=message.get("reason") or ""))
        elif kind == "websocket.http.response.start":
            http.status = message["status"]
            http.headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif kind == "websocket.http.response.body":
            body.append(message.get("body", b""))
            if not message.get("more_body", False):
                http.body = b"".join(body)
                answered.set_result(http)

    task = asyncio.create_task(app(scope, inbox.get, send))
    await asyncio.wait({task, answered}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
    await asyncio.wait_for(task, 60)
    assert answered.done(), f"{path}: the app ended without answering the handshake"
    return answered.result()
