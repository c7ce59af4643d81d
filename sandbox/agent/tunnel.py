"""Tunnels: TCP connections to a port on the sandbox's own loopback, relayed over the
channel, so the host can reach a server running here while the sandbox still has no
network interface (``loom-worker port-forward``, the service's port proxy); or, with
``"process": ID`` (and ``"since"``) instead of a port, a background process's byte
stream (a terminal's: ``processes.attach``), its attach answer in the open's answer.

The host picks each tunnel's id (so its handler exists before any event can come)::

    tunnel_open  {"tunnel": T, "port": P, "window": W}    request -> {"tunnel": T, "address": ...}
    tunnel_send  {"tunnel": T, "raw": N, "eof": bool}     notification: N bytes for the server
    tunnel_ack   {"tunnel": T, "n": N}                     notification: the host took N bytes
    tunnel_close {"tunnel": T}                             notification: drop the connection

and gets events ``{"event": "tunnel", "tunnel": T, ...}`` with one of ``raw`` (bytes
from the server follow the line, see ``channel.send_raw``), ``acked`` (that many of the
host's bytes were written to the server), ``eof`` (the server will send no more) or
``closed`` (the connection is gone; ``error`` says why when it broke).

Flow control, both ways, so neither side buffers without bound: the agent sends at most
``W`` bytes the host has not acknowledged (``tunnel_ack``) and then stops reading the
server's socket; the host sends at most its own window of bytes that were not yet
``acked`` (written to the server). A slow server or a slow client slows its own
tunnel only.

One thread serves every tunnel of this agent (a selector), started at the first open:
threads count against the container's pids limit, which commands need.

With ``"pass": true`` and the fd channel open (``handover``: runc, where the host
reaches the agent's direct channel), the connected socket itself goes to the host and
the answer says ``"passed": true``: nothing is relayed. Otherwise, or if handing it over
fails, the tunnel is relayed as above.
"""

import errno
import os
import selectors
import socket
import threading

from . import channel, handover, processes
from .errors import Refused

#: Most bytes one ``data`` event carries.
CHUNK = 512 << 10
#: The host's window when it names none, and the most it may ask for.
DEFAULT_WINDOW = 1 << 20
MAX_WINDOW = 16 << 20
#: Bytes written straight from the channel's thread (:func:`op_tunnel_send`) that are
#: acknowledged together; far below any window the host may give (at least ``CHUNK``).
ACK_AT = 64 << 10
#: Open tunnels per agent.
MAX_TUNNELS = 256
CONNECT_TIMEOUT = 5.0

_lock = threading.Lock()
_tunnels = {}  # type: dict  # id -> _Tunnel
_pump = {"thread": None, "wake_r": -1, "wake_w": -1}  # type: dict


class _Tunnel(object):
    def __init__(self, tid, sock, window):
        self.tid = tid
        self.sock = sock
        self.credit = window  # bytes we may still send the host
        self.out = bytearray()  # the host's bytes not yet written to the server
        self.out_eof = False  # the host is done sending: shut down writing once out is empty
        self.read_eof = False
        self.write_shut = False
        self.closing = None  # why the host or an error ended it (None: it has not ended)
        self.interest = 0  # what the selector watches now
        self.unacked_writes = 0  # bytes written to the server not yet reported as acked
        self.quiet = False  # end it without telling the host (the host is gone)
        self.announced = False  # the host has the open's answer: the server's bytes may flow


def _event(t, **fields):
    msg = {"event": "tunnel", "tunnel": t.tid}
    msg.update(fields)
    channel.send(msg)


def _connect(port):
    """A connection to ``port`` on this sandbox's loopback: IPv4 first, then IPv6 (a
    server may listen on either). Raises Refused when nothing listens there."""
    last = None
    for family, addr in ((socket.AF_INET, ("127.0.0.1", port)), (socket.AF_INET6, ("::1", port))):
        try:
            s = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        except OSError as e:  # no IPv6 in this sandbox
            last = last or e
            continue
        s.settimeout(CONNECT_TIMEOUT)
        try:
            s.connect(addr)
        except OSError as e:
            s.close()
            if not isinstance(last, ConnectionRefusedError):
                last = e
            continue
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s, addr[0]
    if isinstance(last, ConnectionRefusedError) or getattr(last, "errno", None) in (
        errno.ECONNREFUSED,
        errno.EADDRNOTAVAIL,
        errno.EAFNOSUPPORT,
        errno.ENETUNREACH,
    ):
        raise Refused("connection_refused", "Nothing listens on port %d in the sandbox (its loopback)" % port)
    raise Refused("connection_failed", "Cannot connect to port %d in the sandbox: %s" % (port, last))


def op_tunnel_open(req):
    tid = req.get("tunnel")
    port = req.get("port")
    proc = req.get("process")
    window = req.get("window", DEFAULT_WINDOW)
    if not isinstance(tid, int) or isinstance(tid, bool) or tid < 1:
        raise Refused("invalid", "tunnel must be a positive integer")
    if proc is None and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
        raise Refused("invalid", "port must be 1-65535")
    if not isinstance(window, int) or isinstance(window, bool) or not CHUNK <= window <= MAX_WINDOW:
        raise Refused("invalid", "window must be %d-%d bytes" % (CHUNK, MAX_WINDOW))
    with _lock:
        if tid in _tunnels:
            raise Refused("conflict", "tunnel %d is already open" % tid)
        if len(_tunnels) >= MAX_TUNNELS:
            raise Refused("too_large", "Too many open tunnels (max %d)" % MAX_TUNNELS)
    attached = None
    if proc is not None:  # a background process's (a terminal's) byte stream
        sock, attached = processes.attach(proc, req.get("since"))
        address = "process:%s" % proc
    else:
        sock, address = _connect(port)
    if req.get("pass") and handover.hand_over(tid, sock):
        return {"tunnel": tid, "address": address, "passed": True, "attached": attached}
    t = _Tunnel(tid, sock, window)
    with _lock:
        if tid in _tunnels:
            sock.close()
            raise Refused("conflict", "tunnel %d is already open" % tid)
        # Known at once: the host's first bytes may come right after our answer, before
        # ``after`` runs on this thread.
        _tunnels[tid] = t
        _start_pump()

    def after():
        # Only once the host has the answer: from now on the server's bytes may flow.
        with _lock:
            t.announced = True
        _wake()

    sock.setblocking(False)
    return {"tunnel": tid, "address": address, "attached": attached, "_after_send": after}


def _find(req):
    with _lock:
        return _tunnels.get(req.get("tunnel"))


def op_tunnel_send(req):
    """The host's bytes for the server: written at once, on this (the channel's reader)
    thread, when nothing of the host's is waiting and the socket takes them (a keystroke
    then costs no hand-over to the pump thread: under gVisor each wake-up is a large part
    of a terminal's echo); the rest is the pump's. Bytes written here are acknowledged
    once :data:`ACK_AT` have gathered (or by the pump, with its own): the host's window
    is far larger, so a few unacknowledged keystrokes never hold it up."""
    t = _find(req)
    if t is None:
        return None  # closed meanwhile: the host has its ``closed`` event
    data = req.get("data") or b""
    if not isinstance(data, bytes):  # base64, as every other op sends bytes
        data = channel.unb64(data)
    ack = 0
    with _lock:
        if t.out_eof or t.closing is not None:
            return None
        if data and not t.out:
            try:
                n = t.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                n = 0  # (broken: the pump finds out when it tries the rest)
            data = data[n:]
            t.unacked_writes += n
            if t.unacked_writes >= ACK_AT:
                ack, t.unacked_writes = t.unacked_writes, 0
        t.out += data
        if req.get("eof"):
            t.out_eof = True
        wake = bool(t.out) or t.out_eof
    if ack:
        _event(t, acked=ack)
    if wake:
        _wake()
    return None


def op_tunnel_ack(req):
    t = _find(req)
    n = req.get("n")
    if t is None or not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        return None
    with _lock:
        t.credit += n
    _wake()
    return None


def op_tunnel_close(req):
    t = _find(req)
    if t is not None:
        with _lock:
            if t.closing is None:
                t.closing = ""
        _wake()
    return None


def close_all():
    """The host is gone: drop every tunnel, telling nobody, and the fd channel."""
    handover.close()
    with _lock:
        for t in _tunnels.values():
            t.quiet = True
            if t.closing is None:
                t.closing = ""
    _wake()


def _start_pump():
    """Called with ``_lock`` held."""
    if _pump["thread"] is not None:
        return
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    _pump["wake_r"], _pump["wake_w"] = r, w
    th = threading.Thread(target=_run, args=(r,), name="loom-tunnels")
    th.daemon = True
    _pump["thread"] = th
    th.start()


def _wake():
    w = _pump["wake_w"]
    if w < 0:
        return
    try:
        os.write(w, b"x")
    except OSError:
        pass  # the pipe is full: the pump is awake anyway


def _run(wake_r):
    sel = selectors.DefaultSelector()
    sel.register(wake_r, selectors.EVENT_READ, None)
    registered = {}  # type: dict  # id -> _Tunnel known to the selector
    while True:
        for key, mask in sel.select():
            t = key.data
            if t is None:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except OSError:
                    pass
                continue
            try:
                if mask & selectors.EVENT_READ:
                    _read(t)
                if mask & selectors.EVENT_WRITE:
                    _write(t)
            except OSError as e:
                with _lock:
                    if t.closing is None:
                        t.closing = os.strerror(e.errno) if e.errno else str(e)
        _settle(sel, registered)


def _read(t):
    with _lock:
        n = min(CHUNK, t.credit)
    if n <= 0:
        return
    try:
        data = t.sock.recv(n)
    except (BlockingIOError, InterruptedError):
        return
    if data:
        with _lock:
            t.credit -= len(data)
        channel.send_raw({"event": "tunnel", "tunnel": t.tid}, data)
    else:
        t.read_eof = True
        _event(t, eof=True)


def _write(t):
    with _lock:
        chunk = bytes(t.out[:CHUNK])
    if chunk:
        try:
            n = t.sock.send(chunk)
        except (BlockingIOError, InterruptedError):
            n = 0
        ack = 0
        with _lock:
            del t.out[:n]
            t.unacked_writes += n
            # Report in batches (each report is a message), but always once the buffer is empty.
            if t.unacked_writes and (not t.out or t.unacked_writes >= CHUNK):
                ack, t.unacked_writes = t.unacked_writes, 0
        if ack:
            _event(t, acked=ack)


def _settle(sel, registered):
    """After each round: shut down writing where the host is done, end tunnels that are
    over, and watch for what each tunnel can do next."""
    with _lock:
        tunnels = list(_tunnels.values())
    for t in tunnels:
        with _lock:
            if t.out_eof and not t.out and not t.write_shut and t.closing is None:
                t.write_shut = True
                try:
                    t.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
            done = t.closing is not None or (t.read_eof and t.write_shut)
            want = 0
            if not done:
                if not t.read_eof and t.credit > 0 and t.announced:
                    want |= selectors.EVENT_READ
                if t.out:
                    want |= selectors.EVENT_WRITE
        if done:
            with _lock:
                _tunnels.pop(t.tid, None)
            if t.tid in registered:
                sel.unregister(t.sock)
                del registered[t.tid]
            try:
                t.sock.close()
            except OSError:
                pass
            if t.quiet:
                continue
            if t.closing:
                _event(t, closed=True, error=t.closing)
            else:
                _event(t, closed=True)
            continue
        if want != t.interest:
            if t.interest == 0:
                sel.register(t.sock, want, t)
                registered[t.tid] = t
            elif want == 0:
                sel.unregister(t.sock)
                del registered[t.tid]
            else:
                sel.modify(t.sock, want, t)
            t.interest = want
