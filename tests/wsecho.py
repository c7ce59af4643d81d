"""A WebSocket echo server in Python's standard library alone (3.8+), for the tests of the
port proxy and ``port-forward``: run in a sandbox (``python3 wsecho.py PORT``), or on this
host in a thread (:func:`serve`).

- ``GET /refuse...`` answers ``403`` with a body; a request without ``Upgrade: websocket``
  ``200 plain http``; ``GET /last-close`` the close code and reason of the last client
  that closed (``1000 bye``).
- A handshake is accepted with the first subprotocol offered among ``echo.v1`` and
  ``chat.v2`` (none otherwise).
- Text and binary messages are echoed (fragmented ones joined), but these texts:
  ``who`` answers JSON of the handshake (path, headers, subprotocol); ``close:CODE:REASON``
  closes with that code; ``frag`` answers ``frag-one frag-two`` in two frames; ``ping``
  sends a ping and answers ``pong:PAYLOAD`` when the pong comes; ``drop`` ends the
  connection without a close; ``big:N`` answers N bytes of ``b`` as binary; ``flood:N``
  sends N binary messages of 64 KiB, as fast as the connection takes them (``GET
  /flood-sent`` says how many were sent so far).
"""

import base64
import hashlib
import json
import socket
import socketserver
import struct
import sys
import threading

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
SUBPROTOCOLS = ("echo.v1", "chat.v2")
LAST_CLOSE = {"value": "none"}
FLOOD = {"sent": 0}


def _frame(opcode, payload, fin=True):
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    return head + payload


class Handler(socketserver.BaseRequestHandler):
    def _exact(self, n):
        out = b""
        while len(out) < n:
            data = self.request.recv(n - len(out))
            if not data:
                raise ConnectionError("closed")
            out += data
        return out

    def _frame_in(self):
        b0, b1 = self._exact(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._exact(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._exact(8))[0]
        mask = self._exact(4) if b1 & 0x80 else None
        payload = bytearray(self._exact(n))
        if mask:
            for i in range(n):
                payload[i] ^= mask[i % 4]
        return bool(b0 & 0x80), b0 & 0x0F, bytes(payload)

    def _send(self, opcode, payload, fin=True):
        self.request.sendall(_frame(opcode, payload, fin))

    def _answer(self, status, body):
        head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        self.request.sendall((head + "Connection: close\r\n\r\n").encode() + body)

    def handle(self):
        head = b""
        while b"\r\n\r\n" not in head:
            data = self.request.recv(65536)
            if not data:
                return
            head += data
        lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if path.startswith("/refuse"):
            self._answer("403 Forbidden", b"refused by the app\n")
            return
        if path == "/last-close":
            self._answer("200 OK", LAST_CLOSE["value"].encode())
            return
        if path == "/flood-sent":
            self._answer("200 OK", str(FLOOD["sent"]).encode())
            return
        if headers.get("upgrade", "").lower() != "websocket":
            self._answer("200 OK", b"plain http\n")
            return
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
        chosen = next((p for p in offered if p in SUBPROTOCOLS), None)
        key = headers["sec-websocket-key"].encode()
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
        answer = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        answer += f"Sec-WebSocket-Accept: {accept}\r\n"
        if chosen:
            answer += f"Sec-WebSocket-Protocol: {chosen}\r\n"
        self.request.sendall((answer + "\r\n").encode())
        seen = {"path": path, "headers": headers, "subprotocol": chosen}
        try:
            self._loop(seen)
        except ConnectionError:
            pass

    def _loop(self, seen):
        parts, kind = [], None
        while True:
            fin, opcode, payload = self._frame_in()
            if opcode == 8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                LAST_CLOSE["value"] = f"{code} {payload[2:].decode('utf-8', 'replace')}"
                self._send(8, payload[:2])
                return
            if opcode == 9:
                self._send(10, payload)
                continue
            if opcode == 10:
                self._send(1, b"pong:" + payload)
                continue
            if opcode in (1, 2):
                parts, kind = [payload], opcode
            else:
                parts.append(payload)
            if not fin:
                continue
            message = b"".join(parts)
            if kind == 2:
                self._send(2, message)
                continue
            text = message.decode("utf-8")
            if text == "who":
                self._send(1, json.dumps(seen).encode())
            elif text.startswith("close:"):
                _, code, reason = text.split(":", 2)
                self._send(8, struct.pack("!H", int(code)) + reason.encode())
                while self._frame_in()[1] != 8:
                    pass
                return
            elif text == "frag":
                self._send(1, b"frag-one ", fin=False)
                self._send(0, b"frag-two")
            elif text == "ping":
                self._send(9, b"p1")
            elif text == "drop":
                self.request.shutdown(socket.SHUT_RDWR)
                return
            elif text.startswith("big:"):
                self._send(2, b"b" * int(text[4:]))
            elif text.startswith("flood:"):
                FLOOD["sent"] = 0
                for _ in range(int(text[6:])):
                    self._send(2, b"f" * 65536)
                    FLOOD["sent"] += 1
            else:
                self._send(1, message)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(port=0):
    """A server on 127.0.0.1:``port`` (0: a free one) in a thread; ``server_address[1]``
    is its port, ``shutdown()`` and ``server_close()`` end it."""
    LAST_CLOSE["value"] = "none"
    server = Server(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
