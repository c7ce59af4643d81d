"""Moving an allowed connection's bytes, counted and bounded.

Once the gateway has allowed a connection, the bytes go both ways between the sandbox's
socket and the destination's. Each direction runs on its own thread with blocking sockets
and ``os.splice`` through a pipe where the kernel offers it (the bytes never enter Python:
a download through the gateway runs close to a direct one), else ``recv_into``/``sendall``
with a large buffer. The event loop only waits for the end.

Every chunk is counted (the log's bytes each way) and charged to the workspace's
:class:`RateBudget`; a workspace over its bytes-per-minute budget has the connection cut
(both sockets shut down), which the log records as ``limited``; the sandbox itself is not
touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import threading
import time

CHUNK = 1 << 20
_SPLICE = getattr(os, "splice", None)
_F_SETPIPE_SZ = 1031


class RateBudget:
    """A token bucket of ``per_minute`` bytes, refilled continuously; shared by every
    connection of one workspace. Thread-safe."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._tokens = float(per_minute)
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(float(self.per_minute), self._tokens + (now - self._at) * self.per_minute / 60.0)
        self._at = now

    def take(self, n: int) -> bool:
        """Charge ``n`` bytes; False when the budget is spent (the bytes went through)."""
        with self._lock:
            self._refill()
            self._tokens -= n
            return self._tokens >= 0

    def allowance(self, cap: int) -> int:
        """How many bytes the next move may carry: at most one byte past what is left,
        so a move that fills its allowance overspends and is cut, while a stream that
        stays under the budget is never split. 0 when the budget is spent.

        Charging only after a move (as ``take`` does) would let one move of ``cap``
        bytes through a budget of fewer, which is the whole budget of a small limit."""
        with self._lock:
            self._refill()
            if self._tokens <= 0:
                return 0
            return min(cap, int(self._tokens) + 1)

    def available(self) -> bool:
        """Whether a new connection may open: a second's worth of the budget is back.
        (Any positive balance would let a workspace that was just cut reconnect at
        once and go on a byte at a time.)"""
        with self._lock:
            self._refill()
            return self._tokens >= max(1.0, self.per_minute / 60.0)


class Pump:
    """Both directions of one connection. ``up`` counts sandbox -> destination bytes."""

    def __init__(self, inner: socket.socket, outer: socket.socket, budget: RateBudget | None) -> None:
        self.inner = inner
        self.outer = outer
        self.budget = budget
        self.up = 0
        self.down = 0
        self.limited = False
        self._cut = threading.Event()

    async def run(self, *, down_only: bool = False) -> None:
        """Move bytes until both directions ended (or the budget cut them); with
        ``down_only`` only the destination's answer to the sandbox."""
        loop = asyncio.get_running_loop()
        done: list[asyncio.Future[None]] = []
        ways = ((self.inner, self.outer, True), (self.outer, self.inner, False))
        for src, dst, upward in ways[1:] if down_only else ways:
            fut: asyncio.Future[None] = loop.create_future()
            done.append(fut)
            threading.Thread(target=self._direction, args=(src, dst, upward, loop, fut), daemon=True).start()
        try:
            await asyncio.gather(*done)
        except asyncio.CancelledError:
            self.cut()
            raise

    def cut(self) -> None:
        """End both directions now (a blocked splice or recv returns)."""
        self._cut.set()
        for s in (self.inner, self.outer):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _allowance(self) -> int:
        """Bytes the next move may carry (0: spent, the connection is cut)."""
        if self.budget is None:
            return CHUNK
        n = self.budget.allowance(CHUNK)
        if n == 0:
            self.limited = True
            self.cut()
        return n

    def _charge(self, n: int, upward: bool) -> bool:
        if upward:
            self.up += n
        else:
            self.down += n
        if self.budget is not None and not self.budget.take(n):
            self.limited = True
            self.cut()
            return False
        return True

    def _direction(
        self,
        src: socket.socket,
        dst: socket.socket,
        upward: bool,
        loop: asyncio.AbstractEventLoop,
        fut: asyncio.Future[None],
    ) -> None:
        try:
            if _SPLICE is not None:
                self._splice(src, dst, upward)
            else:
                self._copy(src, dst, upward)
        except OSError:
            pass
        finally:
            # Half-close: the other side learns this direction ended and may still answer.
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            with contextlib.suppress(RuntimeError):  # the loop closed under us
                loop.call_soon_threadsafe(_settle, fut)

    def _splice(self, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        assert _SPLICE is not None
        r, w = os.pipe()
        with contextlib.suppress(OSError):  # a larger pipe: fewer, larger moves
            fcntl.fcntl(w, _F_SETPIPE_SZ, CHUNK)
        try:
            sfd, dfd = src.fileno(), dst.fileno()
            while not self._cut.is_set():
                want = self._allowance()
                if want == 0:
                    return
                n = _SPLICE(sfd, w, want)
                if n <= 0:
                    return
                left = n
                while left:
                    m = _SPLICE(r, dfd, left)
                    if m <= 0:
                        return
                    left -= m
                if not self._charge(n, upward):
                    return
        finally:
            os.close(r)
            os.close(w)

    def _copy(self, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while not self._cut.is_set():
            want = self._allowance()
            if want == 0:
                return
            n = src.recv_into(buf, want)
            if n <= 0:
                return
            dst.sendall(view[:n])
            if not self._charge(n, upward):
                return


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
