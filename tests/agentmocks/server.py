"""Mock model providers on loopback, over HTTPS with a test CA: the Anthropic Messages API
(``POST /v1/messages``, streaming and not, ``/v1/messages/count_tokens``) and the OpenAI
Responses API (``POST /v1/responses``, streaming; ``GET /v1/models``), driven by a script
(tests/agentmocks/script.py). Every request is recorded (method, path, headers, JSON body) for
the tests' assertions, and a request whose key is not the expected one is refused with 401, as
the real APIs do.

One server answers both APIs, so a gateway host override can send ``api.anthropic.com`` and
``api.openai.com`` to the same ``127.0.0.1:port``.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import trustme
from aiohttp import web

from tests.agentmocks.script import Answer, Step, render_claude, render_codex

NAMES = ("api.anthropic.com", "api.openai.com", "localhost", "127.0.0.1")


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any

    def key(self) -> str | None:
        """The key this request carried (x-api-key or a Bearer token)."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None


@dataclass
class MockProviders:
    """Both mock APIs on one HTTPS port. ``script`` is the session every conversation follows;
    ``keys`` maps ``anthropic``/``openai`` to the key each expects (None: any)."""

    script: list[Step]
    keys: dict[str, str | None] = field(default_factory=dict)
    ca: trustme.CA = field(default_factory=trustme.CA)
    address: str = "127.0.0.1"
    port: int = 0
    tls: bool = True
    seen: list[Seen] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}:{self.port}"

    def ca_pem(self) -> bytes:
        return self.ca.cert_pem.bytes()

    def requests(self, api: str) -> list[Seen]:
        """Recorded model requests of one API (``anthropic`` or ``openai``)."""
        suffix = "/v1/messages" if api == "anthropic" else "/v1/responses"
        return [s for s in self.seen if s.path.split("?")[0] == suffix]

    def start(self) -> MockProviders:
        """Serve in a thread of its own. Raises RuntimeError if it does not come up."""
        ctx: ssl.SSLContext | None = None
        if self.tls:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.ca.issue_cert(*NAMES).configure_cert(ctx)
        ready = threading.Event()
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()

            async def main() -> None:
                self._runner = web.AppRunner(app, access_log=None)
                await self._runner.setup()
                site = web.TCPSite(self._runner, self.address, self.port, ssl_context=ctx)
                await site.start()
                self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
                ready.set()

            loop.run_until_complete(main())
            loop.run_forever()

        threading.Thread(target=run, daemon=True, name="agentmocks").start()
        if not ready.wait(10):
            raise RuntimeError("the mock providers did not start")
        return self

    def stop(self) -> None:
        loop, runner = self._loop, self._runner
        if loop is None or runner is None:
            return
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)

    def __enter__(self) -> MockProviders:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- dispatch ---------------------------------------------------------------------------------

    async def _handle(self, req: web.Request) -> web.StreamResponse:
        raw = await req.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        seen = Seen(req.method, str(req.rel_url), {k.lower(): v for k, v in req.headers.items()}, body)
        self.seen.append(seen)
        path = req.path
        if path.startswith("/v1/messages"):
            if not self._key_ok("anthropic", seen):
                return _error(401, "authentication_error", "invalid x-api-key")
            if path == "/v1/messages/count_tokens":
                return web.json_response({"input_tokens": _tokens(body)})
            if path == "/v1/messages" and req.method == "POST" and isinstance(body, dict):
                return await self._messages(req, body)
        elif path.startswith("/v1/responses") or path.startswith("/v1/models"):
            if not self._key_ok("openai", seen):
                return _error(401, "invalid_request_error", "Incorrect API key provided")
            if path == "/v1/models":
                return web.json_response({"object": "list", "data": [{"id": "gpt-5-codex", "object": "model"}]})
            if path == "/v1/responses" and req.method == "POST" and isinstance(body, dict):
                return await self._responses(req, body)
        elif req.method == "HEAD" or path == "/api/hello":
            return web.Response(status=200)
        return _error(404, "not_found_error", f"no route {req.method} {path}")

    def _key_ok(self, api: str, seen: Seen) -> bool:
        want = self.keys.get(api)
        return want is None or seen.key() == want

    def _step(self, done: int) -> Step:
        return self.script[done] if done < len(self.script) else Answer("Done.")

    # -- Anthropic Messages -----------------------------------------------------------------------

    async def _messages(self, req: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        messages = body.get("messages") or []
        done = sum(
            1
            for m in messages
            if m.get("role") == "user" and isinstance(m.get("content"), list)
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        )
        # Side requests (titles, summaries) carry no tools: a short text answer.
        step: Step = self._step(done) if body.get("tools") else Answer("ok")
        cwd = _claude_cwd(body)
        if isinstance(step, Answer):
            block: dict[str, Any] = {"type": "text", "text": step.text}
            stop = "end_turn"
        else:
            name, tool_input = render_claude(step, cwd)
            block = {"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": name, "input": tool_input}
            stop = "tool_use"
        model = body.get("model", "claude-mock")
        usage_in = _tokens(body)
        msg_id = "msg_" + uuid.uuid4().hex[:24]
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [block],
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": {"input_tokens": usage_in, "output_tokens": 20},
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(req)

        async def ev(kind: str, data: dict[str, Any]) -> None:
            await resp.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())

        await ev(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": usage_in, "output_tokens": 1},
                },
            },
        )
        if block["type"] == "text":
            await ev(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
            for part in _chunks(block["text"]):
                await ev(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": part}},
                )
        else:
            start = {**block, "input": {}}
            await ev("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start})
            for part in _chunks(json.dumps(block["input"])):
                await ev(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": part},
                    },
                )
        await ev("content_block_stop", {"type": "content_block_stop", "index": 0})
        await ev(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 20},
            },
        )
        await ev("message_stop", {"type": "message_stop"})
        await resp.write_eof()
        return resp

    # -- OpenAI Responses -------------------------------------------------------------------------

    async def _responses(self, req: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        items = body.get("input") or []
        done = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
        step = self._step(done)
        cwd = _codex_cwd(items)
        resp_id = "resp_" + uuid.uuid4().hex[:24]
        model = body.get("model", "gpt-mock")
        if isinstance(step, Answer):
            item_id = "msg_" + uuid.uuid4().hex[:24]
            item: dict[str, Any] = {
                "id": item_id,
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": step.text, "annotations": []}],
            }
        else:
            name, args = render_codex(step, cwd)
            item_id = "fc_" + uuid.uuid4().hex[:24]
            item = {
                "id": item_id,
                "type": "function_call",
                "status": "completed",
                "name": name,
                "call_id": "call_" + uuid.uuid4().hex[:24],
                "arguments": json.dumps(args),
            }
        usage = {
            "input_tokens": _tokens(body),
            "output_tokens": 20,
            "total_tokens": _tokens(body) + 20,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        base = {"id": resp_id, "object": "response", "created_at": 1, "model": model, "output": []}
        if not body.get("stream"):
            return web.json_response({**base, "status": "completed", "output": [item], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(req)
        seq = 0

        async def ev(data: dict[str, Any]) -> None:
            nonlocal seq
            data["sequence_number"] = seq
            seq += 1
            await resp.write(f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode())

        await ev({"type": "response.created", "response": {**base, "status": "in_progress"}})
        await ev({"type": "response.in_progress", "response": {**base, "status": "in_progress"}})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            await ev(
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            await ev(
                {
                    "type": "response.content_part.added",
                    "item_id": item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "part": part,
                }
            )
            for chunk in _chunks(text):
                await ev(
                    {
                        "type": "response.output_text.delta",
                        "item_id": item_id,
                        "output_index": 0,
                        "content_index": 0,
                        "delta": chunk,
                    }
                )
            await ev(
                {
                    "type": "response.output_text.done",
                    "item_id": item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "text": text,
                }
            )
            await ev(
                {
                    "type": "response.content_part.done",
                    "item_id": item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "part": item["content"][0],
                }
            )
        else:
            await ev(
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            for chunk in _chunks(item["arguments"]):
                await ev(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": item_id,
                        "output_index": 0,
                        "delta": chunk,
                    }
                )
            await ev(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item_id,
                    "output_index": 0,
                    "arguments": item["arguments"],
                }
            )
        await ev({"type": "response.output_item.done", "output_index": 0, "item": item})
        await ev(
            {
                "type": "response.completed",
                "response": {**base, "status": "completed", "output": [item], "usage": usage},
            }
        )
        await resp.write_eof()
        return resp


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


def _tokens(body: Any) -> int:
    """A plausible token count: a quarter of the request's JSON length."""
    return max(1, len(json.dumps(body)) // 4)


def _chunks(text: str, size: int = 40) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _claude_cwd(body: dict[str, Any]) -> str:
    for text in _strings([body.get("system"), body.get("messages")]):
        found = re.search(r"Primary working directory: (\S+)", text)
        if found:
            return found.group(1)
    return "/"


def _codex_cwd(items: list[Any]) -> str:
    for text in _strings(items):
        found = re.search(r"<cwd>([^<]+)</cwd>", text)
        if found:
            return found.group(1)
    return "/"
