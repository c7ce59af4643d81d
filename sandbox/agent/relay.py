"""The egress relay: the sandbox's loopback doors to the host's egress gateway.

Runs in the container's main agent when the workspace may reach the network (the worker
mounted the gateway's socket directory and says so in the config). It decides nothing:
it accepts on the sandbox's own loopback and passes the bytes, unread, to the gateway's
unix socket, with one header line saying which door they came in by:

* 127.0.0.1:3128, the HTTP proxy every client is pointed at (HTTP_PROXY & co.);
* 127.0.0.1:53/udp, the resolver /etc/resolv.conf names: each query goes to the gateway,
  which answers allowed names with a loopback address 127.77.x.y and every other name
  with NXDOMAIN;
* ports 80 and 443 of each 127.77.x.y address the gateway answered with, for programs
  that ignore the proxy settings and dial the address themselves.

Everything is checked on the host (the name, its TLS server name or HTTP Host, the
addresses it resolves to); a program here can talk to the socket itself and gains
nothing by it.
"""

import os
import signal
import socket
import struct
import threading

HEADER = b"LOOM-EGRESS/1 "
MAX_CONNECTIONS = 256
CHUNK = 1 << 20
SYNTHETIC = (127, 77)
TRANSPARENT_PORTS = (80, 443)

_socket = [""]  # the gateway's socket path, set by start()
_active = [0]  # relayed connections open now
_lock = threading.Lock()
_bound = set()  # type: set  # the 127.77.x.y addresses listened on


def start(config):
    """Start the relay's listeners (threads). ``config``: {"socket": path, "proxy_port":
    n, "dns_port": n}. Listeners that cannot bind are skipped (a command may hold the port)."""
    _socket[0] = str(config["socket"])
    try:
        lst = _listen("127.0.0.1", int(config.get("proxy_port", 3128)))
    except OSError:
        lst = None
    if lst is not None:
        _thread(_accept_loop, lst, b"proxy")
    try:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", int(config.get("dns_port", 53))))
    except OSError:
        udp = None
    if udp is not None:
        _thread(_dns_loop, udp)


def _thread(fn, *args):
    t = threading.Thread(target=_quiet_pipe, args=(fn,) + args)
    t.daemon = True
    t.start()


def _quiet_pipe(fn, *args):
    # The agent leaves SIGPIPE at its default (so commands inherit it), which ends the
    # process on a write to a closed socket; splice has no MSG_NOSIGNAL. Blocked in the
    # relay's threads (they start no process), such a write just fails with EPIPE.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
    fn(*args)


def _listen(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        s.listen(128)
    except OSError:
        s.close()
        raise
    return s


def _gateway(header):
    g = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        g.connect(_socket[0])
        g.sendall(HEADER + header + b"\n")
    except OSError:
        g.close()
        raise
    return g


def _accept_loop(lst, kind):
    while True:
        try:
            conn, _ = lst.accept()
        except OSError:
            continue
        with _lock:
            full = _active[0] >= MAX_CONNECTIONS
            if not full:
                _active[0] += 1
        if full:
            conn.close()
            continue
        if kind is None:  # a transparent door: the address the program dialled
            addr, port = conn.getsockname()[:2]
            header = ("tcp %s %d" % (addr, port)).encode()
        else:
            header = kind
        _thread(_serve, conn, header)


def _serve(conn, header):
    try:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        try:
            g = _gateway(header)
        except OSError:
            conn.close()
            return
        down = threading.Thread(target=_quiet_pipe, args=(_pipe, g, conn))
        down.daemon = True
        down.start()
        _pipe(conn, g)
        down.join()
        g.close()
        conn.close()
    finally:
        with _lock:
            _active[0] -= 1


def _pipe(src, dst):
    """Copy src to dst until EOF (through a pipe with splice where there is one), then
    half-close dst so its reader sees the end while the other way may go on."""
    splice = getattr(os, "splice", None)
    try:
        if splice is not None:
            r, w = os.pipe()
            try:
                while True:
                    n = splice(src.fileno(), w, CHUNK)
                    if n <= 0:
                        break
                    while n:
                        m = splice(r, dst.fileno(), n)
                        if m <= 0:
                            raise OSError("short splice")
                        n -= m
            finally:
                os.close(r)
                os.close(w)
        else:
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            while True:
                n = src.recv_into(buf)
                if n <= 0:
                    break
                dst.sendall(view[:n])
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _dns_loop(udp):
    g = None
    while True:
        try:
            msg, peer = udp.recvfrom(1024)
        except OSError:
            continue
        answer = None
        for _attempt in range(2):
            try:
                if g is None:
                    g = _gateway(b"dns")
                g.sendall(struct.pack(">H", len(msg)) + msg)
                n = struct.unpack(">H", _read_exact(g, 2))[0]
                answer = _read_exact(g, n)
                break
            except (OSError, ValueError):
                if g is not None:
                    g.close()
                g = None
        if answer is None:
            continue  # no gateway: the client's resolver times out (1 attempt, 2 s)
        _open_doors(answer)
        try:
            udp.sendto(answer, peer)
        except OSError:
            pass


def _read_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ValueError("gateway closed")
        out += chunk
    return out


def _open_doors(answer):
    """Listen on ports 80 and 443 of a 127.77.x.y address the gateway just handed out, so
    a program that dials it itself reaches the gateway too (the gateway's own answer
    layout: the question, then one A record whose data ends the message)."""
    if len(answer) < 16 or struct.unpack(">H", answer[6:8])[0] != 1:
        return
    rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", answer[-14:-4])
    addr = answer[-4:]
    if rtype != 1 or rdlen != 4 or tuple(addr[:2]) != SYNTHETIC:
        return
    host = socket.inet_ntoa(addr)
    with _lock:
        if host in _bound:
            return
        _bound.add(host)
    for port in TRANSPARENT_PORTS:
        try:
            lst = _listen(host, port)
        except OSError:
            continue
        _thread(_accept_loop, lst, None)
