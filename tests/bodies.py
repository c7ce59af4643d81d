"""Oversized requests for the tests of the request limit (``LOOM_MAX_BODY_BYTES``): bodies
generated a piece at a time (the test holds none of them), an HTTP POST that hears the
answer while it is still sending, and a process's peak RSS from ``/proc``."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

MiB = 1 << 20
#: The most a refused request may add to a server's peak RSS.
BOUND = 64 * MiB
_PIECE = b"x" * MiB


def body(total: int, prefix: bytes) -> Iterator[bytes]:
    """``total`` bytes: ``prefix`` (the start of a JSON request), then one 1 MiB piece
    again and again (never more than that piece in memory)."""
    yield prefix
    left = total - len(prefix)
    while left > 0:
        yield _PIECE if left >= MiB else _PIECE[:left]
        left -= MiB


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def reset_peak(pid: int) -> int:
    """Reset the peak RSS of ``pid`` to its current RSS (``clear_refs``: 5); return it."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return _status(pid, "VmRSS")


def grown(pid: int, rss: int) -> int:
    """How far the peak RSS of ``pid`` rose above ``rss`` since :func:`reset_peak`."""
    return _status(pid, "VmHWM") - rss


def http_post(
    port: int, path: str, chunks: Iterator[bytes], *, length: int | None, headers: str = ""
) -> tuple[int, bytes]:
    """POST ``chunks`` (with a Content-Length of ``length``, or chunked when None) and
    return the answer's status and body, read while sending: a server that answers
    early and stops reading is heard, however much was left to send."""
    sock = socket.create_connection(("127.0.0.1", port))
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{headers}{framing}\r\n\r\n"
    sock.sendall(head.encode())
    sock.setblocking(False)
    pieces = iter(chunks)
    out = memoryview(b"")
    sending, answer = True, b""
    try:
        while True:
            readable, writable, _ = select.select([sock], [sock] if sending else [], [], 120)
            assert readable or writable, "the server neither answered nor read"
            if readable:
                data = sock.recv(1 << 16)
                answer += data
                if not data or _complete(answer):
                    break
            if writable:
                if not out:
                    piece = next(pieces, None)
                    if piece is None:
                        out, sending = memoryview(b"0\r\n\r\n" if length is None else b""), bool(length is None)
                        if not out:
                            continue
                    else:
                        out = memoryview(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if length is None else piece)
                try:
                    out = out[sock.send(out) :]
                except BlockingIOError:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    sending = False
    finally:
        sock.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    return int(head.split(b"\r\n")[0].split()[1]), _body(head, rest)


def _complete(answer: bytes) -> bool:
    head, sep, rest = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(rest) >= int(value)
        if name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            return rest.endswith(b"0\r\n\r\n")
    return True


def _body(head: bytes, rest: bytes) -> bytes:
    """The body of an answer whose headers are ``head`` (chunked or not)."""
    if b"transfer-encoding: chunked" not in head.lower():
        return rest
    out = b""
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2 :]
    return out
