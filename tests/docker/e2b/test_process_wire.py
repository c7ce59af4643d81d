"""envd's process service on the wire, as any Connect client speaks it (not only E2B's
Python SDK): the JSON and binary protobuf codecs, unary calls and server streams with
Connect's envelopes, KeepAlive events at the interval the client asks for
(``Keepalive-Ping-Interval``), the deadline (``Connect-Timeout-Ms``) ending a stream with
``deadline_exceeded``, and the error codes and statuses E2B's SDKs act on."""

from __future__ import annotations

import json
import struct
from typing import Any

import e2b
import httpx
import pytest
from e2b.envd.process import process_pb as pb
from protobuf import Oneof

from tests.docker.e2b.conftest import E2BServer

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def _envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def _messages(body: bytes) -> list[tuple[int, bytes]]:
    """A Connect stream's envelopes: (flags, payload); the last has flag 0x02 (its end)."""
    out, i = [], 0
    while i < len(body):
        flags, n = struct.unpack(">BI", body[i : i + 5])
        out.append((flags, body[i + 5 : i + 5 + n]))
        i += 5 + n
    return out


def _client(server: E2BServer, sandbox_id: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url,
        headers={"E2b-Sandbox-Id": sandbox_id, "X-API-KEY": server.token},
        timeout=60,
    )


def _start(c: httpx.Client, cmd: str, *, codec: str = "json", **headers: str) -> list[tuple[int, bytes]]:
    req = pb.StartRequest(process=pb.ProcessConfig(cmd="/bin/bash", args=["-c", cmd]), stdin=False)
    payload = req.to_json().encode() if codec == "json" else req.to_binary()
    r = c.post(
        "/process.Process/Start",
        content=_envelope(payload),
        headers={"Content-Type": f"application/connect+{codec}", **headers},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == f"application/connect+{codec}"
    return _messages(r.content)


def _events(messages: list[tuple[int, bytes]]) -> tuple[list[Any], dict[str, Any]]:
    """The JSON stream's events (the oneof's field and value) and its end message."""
    *body, (last_flags, last) = messages
    assert last_flags & 0x02 and all(not f & 0x02 for f, _ in body)
    events = []
    for _, payload in body:
        ((field, value),) = json.loads(payload)["event"].items()
        events.append((field, value))
    return events, json.loads(last)


def test_codecs_keepalives_deadlines_and_errors(e2b_server: E2BServer) -> None:
    sbx = e2b.Sandbox.create()
    with _client(e2b_server, sbx.sandbox_id) as c:
        # a stream, JSON: start, keepalives while nothing comes (every second, as asked),
        # the output, the end; the stream's end message carries no error
        events, end = _events(_start(c, "sleep 2.5; echo done", **{"Keepalive-Ping-Interval": "1"}))
        kinds = [k for k, _ in events]
        assert kinds[0] == "start" and events[0][1]["pid"] > 0
        assert kinds.count("keepalive") >= 2
        assert ("data", {"stdout": "ZG9uZQo="}) in events  # base64 of "done\n"
        assert events[-1] == ("end", {"exited": True, "status": "exit status 0"})
        assert end == {}

        # the same in binary protobuf
        messages = _start(c, "echo bin; exit 4", codec="proto")
        decoded = [pb.StartResponse.from_binary(p).event.event for _, p in messages[:-1]]
        assert [e.field for e in decoded] == ["start", "data", "end"]
        assert decoded[1].value.output == Oneof("stdout", b"bin\n")
        assert decoded[2].value.exit_code == 4 and decoded[2].value.error == "exit status 4"

        # the deadline is the process's lifetime: the stream ends with deadline_exceeded
        events, end = _events(_start(c, "sleep 30", **{"Connect-Timeout-Ms": "1000"}))
        assert [k for k, _ in events] == ["start"]
        assert end["error"]["code"] == "deadline_exceeded" and "timeout" in end["error"]["message"]
        listed = c.post("/process.Process/List", json={}, headers={"Content-Type": "application/json"})
        assert listed.status_code == 200
        assert not any("sleep 30" in json.dumps(p) for p in listed.json().get("processes", []))

        # unary, binary protobuf
        r = c.post(
            "/process.Process/List",
            content=pb.ListRequest().to_binary(),
            headers={"Content-Type": "application/proto"},
        )
        assert r.status_code == 200 and r.headers["content-type"] == "application/proto"
        assert pb.ListResponse.from_binary(r.content).processes == []

        # errors: Connect's codes and HTTP statuses, envd's words
        sel = {"process": {"pid": 424242}}
        r = c.post("/process.Process/SendSignal", json={**sel, "signal": "SIGNAL_SIGKILL"})
        assert r.status_code == 404 and r.json() == {
            "code": "not_found",
            "message": "process with pid 424242 not found",
        }
        bg = sbx.commands.run("sleep 30", background=True)
        r = c.post("/process.Process/SendSignal", json={"process": {"pid": bg.pid}, "signal": "SIGNAL_UNSPECIFIED"})
        assert r.status_code == 501 and r.json()["code"] == "unimplemented"
        resize = {"process": {"pid": bg.pid}, "pty": {"size": {"cols": 5, "rows": 5}}}
        r = c.post("/process.Process/Update", json=resize)
        assert r.status_code == 500 and "tty not assigned" in r.json()["message"]
        bg.kill()
    # a sandbox that does not exist: unavailable, "was not found" (the SDK's
    # SandboxNotRunningException)
    with _client(e2b_server, "i00000000000000000000") as c:
        r = c.post("/process.Process/List", json={})
        assert r.status_code == 503 and r.json()["code"] == "unavailable"
        assert "was not found" in r.json()["message"]
    sbx.kill()
