"""The fd channel: where the host can reach the agent's direct channel (runc), the agent
hands a tunnel's connected socket itself to the host (``SCM_RIGHTS``), which then reads
and writes it at the speed of the sandbox's own loopback, with nothing relayed (the
host's side: ``sandbox.handover``).

``tunnel_fds`` offers it once, as ``channel.offer_direct`` offers the direct channel: a
``SOCK_SEQPACKET`` unix socket in a fresh private directory of /tmp, taken only by a peer
outside the container's pid namespace (the kernel reports its pid as 0), whose first
message carries the connection's secret, and removed as soon as the host has it (or
after ``channel.DIRECT_ACCEPT_TIMEOUT``). Then each socket travels as one message
``b"<tunnel id>\\n"`` with the descriptor.
"""

import array
import socket
import threading

from . import channel, jsonline, state
from .errors import Refused

#: None -> "listening" -> "open" (with "sock"), or "refused"; "lock" keeps concurrent
#: hand-overs' messages whole.
_fds = {"state": None, "sock": None, "lock": threading.Lock()}  # type: dict


def hand_over(tid, sock):
    """Hand ``sock`` to the host over the fd channel. True when it went (our copy is then
    closed); False leaves it to be relayed."""
    with _fds["lock"]:
        chan = _fds["sock"]
        if chan is None:
            return False
        try:
            fds = array.array("i", [sock.fileno()])
            chan.sendmsg([b"%d\n" % tid], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except OSError:
            return False
    sock.close()
    return True


def op_tunnel_fds(req):
    """Offer the host the fd channel (see the module doc). Returns the socket's path;
    once the answer is sent, a thread waits for the host. Raises Refused when it was
    offered before, OSError when the agent cannot listen."""
    if _fds["state"] is not None:
        raise Refused("invalid", "the fd channel was already offered")
    lst, d, path = channel.listen_for_host(socket.SOCK_SEQPACKET, 1)
    _fds["state"] = "listening"

    def after():
        threading.Thread(target=_accept_fds, args=(lst, d, path), daemon=True).start()

    return {"path": path, "_after_send": after}


def _accept_fds(lst, d, path):
    conn = channel.accept_host(lst, d, path)
    if conn is None:
        _fds["state"] = "refused"
        return
    try:
        conn.send(jsonline.dumps({"fds": True, "k": state.nonce}))
    except OSError:
        conn.close()
        _fds["state"] = "refused"
        return
    with _fds["lock"]:
        _fds["sock"] = conn
        _fds["state"] = "open"


def close():
    """The host is gone: the fd channel with it."""
    with _fds["lock"]:
        chan, _fds["sock"] = _fds["sock"], None
    if chan is not None:
        chan.close()
