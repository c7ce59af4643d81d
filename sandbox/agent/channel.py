"""The agent's channel to the host: how messages are framed and where they go.

Every message is one JSON line carrying the connection's secret (``k``); bytes travel
base64-encoded, except a tunnel's: a message with ``"raw": N`` is followed by N bytes as
they are (no base64, no JSON escaping, which cost more than the bytes' copy: ~3 ms per
MiB on a small VM), both ways. Answers and events go to stdout (the container's attach stream) until
the host takes the direct channel, a unix socket the agent offers once (see
:func:`offer_direct`); from then on everything goes there. Requests come in on stdin or
on that socket; ``main`` reads them.
"""

import binascii
import errno
import os
import socket
import struct
import threading
import time

from . import jsonline, state
from .errors import Refused

TYPE_CHECKING = False
if TYPE_CHECKING:  # for mypy only: importing typing would cost every start of the agent
    from typing import Any  # noqa: F401  (used in a type comment)

_out_lock = threading.Lock()
_out = None  # type: Any  # stdout's buffer, then the direct channel's socket (_SocketOut)
_direct = {"state": None}  # type: dict  # None -> "listening" -> "open" (once per agent)
#: How long the listener waits for the host (it connects right after our answer).
DIRECT_ACCEPT_TIMEOUT = 5.0


# (binascii, not base64: that module imports re, which the agent's boot does not import)
def b64(data):
    """``base64.b64encode(data).decode("ascii")``."""
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def unb64(data):
    """``base64.b64decode(data)``: ``data`` a str of ASCII or bytes-like; characters outside
    the alphabet are skipped. Raises ValueError (binascii.Error for bad padding)."""
    return binascii.a2b_base64(data)


def open_stdout(stream):
    """Send to ``stream`` (the agent's stdout) until the direct channel opens."""
    global _out
    _out = stream


def send(obj):
    # Every message carries the connection's secret: a command that manages to write into
    # our stdout (gVisor does not honour non-dumpable for /proc/<pid>/fd) cannot forge one.
    obj["k"] = state.nonce
    line = jsonline.dumps(obj) + b"\n"
    with _out_lock:
        _out.write(line)
        _out.flush()


#: The most raw bytes one message may carry, either way; a request with an id (a write's
#: content, a command's stdin) and an answer (a read, a command's output) may carry more:
#: up to state.MAX_WRITE and RAW_ANSWER.
MAX_RAW = 4 << 20
#: The most raw bytes an answer carries (a command's two streams at their largest cap,
#: their markers; the host's ``protocol.MAX_RAW_ANSWER``).
RAW_ANSWER = 33 << 20


def send_raw(obj, data):
    """``obj`` with ``"raw": len(data)``, then ``data`` as it is (see the module doc)."""
    obj["k"] = state.nonce
    obj["raw"] = len(data)
    line = jsonline.dumps(obj) + b"\n"
    with _out_lock:
        if len(data) <= 65536:
            _out.write(line + data)  # one write, one sendall on the direct socket
        else:
            # (no copy of a large payload: the lock keeps anything from coming between)
            _out.write(line)
            _out.write(data)
        _out.flush()


def read_raw(reader, req):
    """The raw bytes a request announces (``"raw": N``), read from ``reader`` into
    ``req["data"]``. Returns False at the end of the stream; raises ValueError for a
    length out of bounds."""
    n = req.get("raw")
    if n is None:
        return True
    limit = MAX_RAW if "id" not in req else max(MAX_RAW, state.MAX_WRITE)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= limit:
        raise ValueError("raw must be 0-%d bytes" % limit)
    data = reader.read(n) if n else b""
    if len(data) < n:
        return False
    req["data"] = data
    return True


def offer_direct(serve):
    """Offer the host a faster channel than the attach stream.

    Over ``docker attach``/``exec`` every message passes through the engine (two copies
    and a pipe each way, ~0.4 ms per round trip); a unix socket is ~0.04 ms. The agent
    listens in a fresh private directory on its /tmp; the host, outside the container,
    reaches that socket through ``/proc/<container pid>/root`` (it needs ptrace-read
    access to the container's processes; when it has none, it keeps the attach stream).

    Only a peer *outside* this container's pid namespace is accepted (the kernel reports
    its pid as 0): a command inside the sandbox that races to connect is turned away. The
    first line on the socket carries this connection's secret, so the host knows it
    reached this agent and not a listener planted by a command. The socket file is gone
    as soon as the host is connected (or after DIRECT_ACCEPT_TIMEOUT).

    Returns the ``direct`` op's answer; once it is sent, a thread waits for the host and
    then runs ``serve(reader)`` with the socket's reader. Raises Refused when the channel
    was offered before, OSError when the agent cannot listen (no writable /tmp).
    """
    if _direct["state"] is not None:
        raise Refused("invalid", "the direct channel was already offered")
    lst, d, path = listen_for_host(socket.SOCK_STREAM, 4)
    _direct["state"] = "listening"

    def after():
        threading.Thread(target=_accept_direct, args=(lst, d, path, serve), daemon=True).start()

    return {"path": path, "_after_send": after}


#: Where the host's end of a dialled direct channel is mounted (read-only) in the sandbox.
DIAL_DIR = "/.loom-host/"


def dial_direct(path, serve):
    """The direct channel where the host cannot reach into the sandbox (gVisor: its /tmp
    lives in the sandbox's own kernel): the host listens on a unix socket in a directory
    of its own, mounted read-only at DIAL_DIR, and the agent connects to it (gVisor passes
    such a connection to the host with ``--host-uds=open``). A unix socket through
    gVisor costs ~0.05 ms a round trip, the engine's attach stream ~0.5 ms.

    The agent connects here, before its answer, so the host, which listens already, has
    the connection by the time it reads the answer; the first line on the socket carries
    this connection's secret, as for :func:`offer_direct`. Returns the ``direct`` op's
    answer; once it is sent, the channel is switched and a thread serves it. Raises
    Refused for a path outside DIAL_DIR or when the channel was offered before, OSError
    when the socket cannot be reached."""
    if _direct["state"] is not None:
        raise Refused("invalid", "the direct channel was already offered")
    if not isinstance(path, str) or not path.startswith(DIAL_DIR) or "/" in path[len(DIAL_DIR) :] or ".." in path:
        raise Refused("invalid", "dial: the host's socket must be a file directly in %s" % DIAL_DIR)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        conn.settimeout(DIRECT_ACCEPT_TIMEOUT)
        conn.connect(path)
        conn.settimeout(None)
    except OSError:
        conn.close()
        raise
    _direct["state"] = "listening"

    def after():
        threading.Thread(target=_switch_direct, args=(conn, serve), daemon=True).start()

    return {"path": path, "_after_send": after}


class _SocketOut(object):
    """What ``send`` writes to once the direct channel is open: one ``send`` per message,
    without SIGPIPE (a host that vanished must not kill the container's keeper; the
    reader sees the EOF and cleans up)."""

    def __init__(self, sock):
        self.sock = sock

    def write(self, data):
        try:
            self.sock.sendall(data, socket.MSG_NOSIGNAL)
        except OSError:
            pass

    def flush(self):
        pass


def private_dir(prefix):
    """A new directory of mode 0700 under /tmp, ``prefix`` and 16 random hex digits, made
    as ``tempfile.mkdtemp`` makes one (mkdir fails on a name that exists: another name is
    tried). Written here because importing tempfile (random, shutil, hashlib...) was a
    tenth of the agent's imports at every start. Raises OSError."""
    for _ in range(100):
        d = "/tmp/" + prefix + os.urandom(8).hex()
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        return d
    raise FileExistsError(errno.EEXIST, "No usable name for a directory in /tmp")


def listen_for_host(kind, backlog):
    """A private unix socket (``kind``: SOCK_STREAM or SOCK_SEQPACKET) in a fresh directory
    under /tmp, for the host to connect to from outside. Returns (listener, directory,
    path). Raises OSError when the agent cannot listen (no writable /tmp)."""
    d = private_dir("loom-direct-")
    path = os.path.join(d, "s")
    lst = socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC)
    try:
        lst.bind(path)
        lst.listen(backlog)
    except OSError:
        lst.close()
        _rm_socket(d, path)
        raise
    return lst, d, path


def _rm_socket(d, path):
    for fn, arg in ((os.unlink, path), (os.rmdir, d)):
        try:
            fn(arg)
        except OSError:
            pass


def accept_host(lst, d, path):
    """The first connection on ``lst`` from a peer outside this container's pid namespace
    (the kernel reports its pid as 0), within DIRECT_ACCEPT_TIMEOUT; a process of this
    container that connects is turned away. The listener and its file are gone when this
    returns, whatever happens: the channel is offered once. Returns the connection
    (blocking) or None."""
    deadline = time.monotonic() + DIRECT_ACCEPT_TIMEOUT
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            lst.settimeout(left)
            try:
                c, _ = lst.accept()
            except OSError:  # timeout: the host stayed on the attach stream
                return None
            cred = c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", cred)[0] != 0:  # a process of this container, not the host
                c.close()
                continue
            c.settimeout(None)
            return c
    finally:
        lst.close()
        _rm_socket(d, path)


def _accept_direct(lst, d, path, serve):
    conn = accept_host(lst, d, path)
    if conn is None:
        _direct["state"] = "refused"
        return
    _switch_direct(conn, serve)


def _switch_direct(conn, serve):
    global _out
    hello = jsonline.dumps({"direct": True, "k": state.nonce}) + b"\n"
    with _out_lock:
        # From here on every answer and event goes to the socket, after this first line
        # (so nothing can come before it); the attach stream stays open only to tell
        # either side that the other is gone.
        _out = _SocketOut(conn)
        _out.write(hello)
        _direct["state"] = "open"
    serve(conn.makefile("rb", buffering=256 << 10))
