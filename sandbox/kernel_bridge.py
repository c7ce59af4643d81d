"""The kernel bridge: a small program run in the sandbox by the IMAGE's ``python3`` (it
needs ``jupyter_client`` and ``ipykernel`` from the image; the agent, stdlib-only, runs
from the agent runtime and has neither). One bridge per code context, started as a
background process of the workspace (:mod:`sandbox.kernels`): its supervisor owns it, it
counts against the workspace's background processes and the sandbox's limits, outlives
the connections to it and ends with the sandbox.

It starts the kernel (what ``python3 -m ipykernel_launcher -f <connection file>`` runs, as
``jupyter_client``'s ``KernelManager`` would, without importing it: the kernel boots
while the bridge imports zmq; ZMQ over unix sockets in its own directory, messages signed by
``jupyter_client``'s ``Session``), raises the kernel's ``oom_score_adj`` (so the memory
limit's OOM killer takes the kernel, not the bridge), interrupts it with SIGINT to its
process group (what Ctrl-C and ipykernel's interrupt mode do), listens on a loopback TCP port and prints one line on its
stdout (kept by its supervisor, so any worker process finds it)::

    {"loom_kernel_bridge": 1, "port": P, "token": T, "language": ..., "cwd": ..., "env": {...}}

or, when the image lacks what it needs, ``{"loom_kernel_bridge": 1, "error": "missing",
"missing": [...], "python": "3.11.2"}`` and exits 3 (``"error": "start"`` and a ``detail``
when the kernel would not start: exit 4).

A client connects (the host, through ``open_tunnel(port)``), sends ``{"token": T}`` and
then newline-delimited JSON requests, one at a time, each answered by lines:

- ``{"op": "execute", "code", "timeout", "grace"}``: events as the kernel sends them,
  ``{"type": "stdout"|"stderr", "text"}`` and ``{"type": "result", "data": {mime: value},
  "metadata": {...}, "main": bool}``, then ``{"type": "end", "status": "ok" | "error" |
  "interrupted" | "restarted" | "kernel_died", "execution_count", "error": {"name",
  "value", "traceback": [...]}, "notes": [...], "cut": {...}, "exit": {...}}``. Past
  ``timeout`` the kernel is interrupted (SIGINT, as Ctrl-C); if it has not finished
  ``grace`` seconds later it is restarted. A client that sends ``{"op": "interrupt"}`` or
  goes away mid-execution interrupts it the same way (an interrupt that comes after the
  execution's end is ignored, unanswered).
- ``{"op": "info"}``, ``{"op": "restart"}``, ``{"op": "shutdown"}`` (the kernel stopped,
  then the bridge exits).

Each stream keeps :data:`MAX_STREAM` bytes per execution (then a line says how much more
was not kept); a MIME value over :data:`MAX_VALUE` is dropped (its text says so); the
results of one execution keep :data:`MAX_RESULTS` bytes in all.

The token is no secret from the sandbox's own code (the bridge's output is kept by a
supervisor of the same user): it makes sure the host reached this context's bridge, not
whatever else listens on a reused port. The kernel is the sandbox's, as anything its user
runs.

Python >= 3.8 (the image's), standard library + zmq and jupyter_client.session (imported
once the kernel is launched).
"""

import json
import os
import secrets
import signal
import socket
import sys
import tempfile
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # for mypy only
    from typing import Any  # noqa: F401  (used in type comments)

PROTOCOL = 1
MAX_STREAM = 1 << 20
MAX_VALUE = 10 << 20
MAX_RESULTS = 48 << 20
MAX_RESULT_COUNT = 1000
#: How often a silent execution checks that its kernel still lives.
LIVENESS_EVERY = 0.25
NEEDS = ("jupyter_client", "ipykernel", "zmq")


def _say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def missing_modules():
    """The modules of :data:`NEEDS` this python3 cannot import."""
    import importlib.util

    out = []
    for name in NEEDS:
        try:
            if importlib.util.find_spec(name) is None:
                out.append(name)
        except (ImportError, ValueError):
            out.append(name)
    return out


if "Kernel" not in globals():  # imported as a module (tests, mypy): in the sandbox it is one program
    from .kernel_process import Kernel, oom_kills


class Lines:
    """Newline-delimited requests from one client socket, read as they come."""

    def __init__(self, conn):
        self.conn = conn
        self.buf = b""
        self.eof = False

    def fill(self):
        """Read what the socket has (it was seen readable); False at its end."""
        try:
            chunk = self.conn.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        if len(self.buf) > (64 << 20):
            raise ValueError("a request line of more than 64 MiB")
        return True

    def pop(self):
        """The next whole line, or None."""
        i = self.buf.find(b"\n")
        if i < 0:
            return None
        line, self.buf = self.buf[:i], self.buf[i + 1 :]
        return line

    def readline(self):
        """The next line, waiting for it; b"" at the end."""
        while True:
            line = self.pop()
            if line is not None:
                return line
            if self.eof or not self.fill():
                return b""


class Execution:
    """One execution's caps and what it sends, so the client sees what was kept."""

    def __init__(self, send):
        self.send = send
        self.kept = {"stdout": 0, "stderr": 0}
        self.lost = {"stdout": 0, "stderr": 0}
        self.results_bytes = 0
        self.results = 0
        self.results_lost = 0

    def stream(self, name, text):
        if name not in self.kept:
            name = "stdout"
        room = MAX_STREAM - self.kept[name]
        data = text.encode("utf-8", "surrogatepass")
        if len(data) > room:
            keep = data[: max(0, room)].decode("utf-8", "ignore")
            self.lost[name] += len(data) - len(keep.encode("utf-8", "surrogatepass"))
            text = keep
        if text:
            self.kept[name] += len(text.encode("utf-8", "surrogatepass"))
            self.send({"type": name, "text": text})

    def result(self, data, metadata, main):
        if not isinstance(data, dict):
            return
        notes = []
        kept = {}
        for mime, value in data.items():
            size = len(value) if isinstance(value, str) else len(json.dumps(value))
            if size > MAX_VALUE:
                notes.append("[%s of %d bytes not kept: a value may have %d MiB]" % (mime, size, MAX_VALUE >> 20))
            else:
                kept[mime] = value
        size = sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in kept.values())
        if self.results >= MAX_RESULT_COUNT or self.results_bytes + size > MAX_RESULTS:
            self.results_lost += 1
            return
        if notes:
            text = kept.get("text/plain")
            kept["text/plain"] = ((text + "\n") if isinstance(text, str) and text else "") + "\n".join(notes)
        self.results += 1
        self.results_bytes += size
        self.send({"type": "result", "data": kept, "metadata": metadata or {}, "main": bool(main)})

    def finish(self):
        for name in ("stdout", "stderr"):
            if self.lost[name]:
                self.send(
                    {
                        "type": name,
                        "text": "\n[%d more bytes of %s not kept: an execution keeps %d MiB of each stream]\n"
                        % (self.lost[name], name, MAX_STREAM >> 20),
                    }
                )
        if self.results_lost:
            self.send(
                {
                    "type": "stderr",
                    "text": "\n[%d more results not kept: an execution keeps %d results, %d MiB in all]\n"
                    % (self.results_lost, MAX_RESULT_COUNT, MAX_RESULTS >> 20),
                }
            )
        return {k: v for k, v in self.lost.items() if v}


class Bridge:
    def __init__(self, cfg):
        self.cfg = cfg
        self.token = secrets.token_hex(16)
        self.workdir = tempfile.mkdtemp(prefix="loom-kernel-")
        self.kernel = Kernel(cfg, self.workdir)
        self.lock = threading.Lock()
        self.died_since = False  # the kernel ended between executions
        self.stopping = False

    # -- one client ----------------------------------------------------------------

    def serve(self, conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = Lines(conn)

        def send(obj):
            conn.sendall((json.dumps(obj) + "\n").encode("utf-8", "surrogatepass"))

        try:
            hello = json.loads(reader.readline() or b"null")
            if not isinstance(hello, dict) or not secrets.compare_digest(str(hello.get("token", "")), self.token):
                send({"type": "refused", "detail": "wrong token"})
                return
            send({"type": "hello", "protocol": PROTOCOL, **self._info()})
            while True:
                line = reader.readline()
                if not line:
                    return
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("not a request")
                op = req.get("op")
                if op == "execute":
                    with self.lock:
                        self.execute(conn, reader, send, req)
                elif op == "info":
                    send({"type": "info", **self._info()})
                elif op == "restart":
                    with self.lock:
                        self.kernel.start(restart=True)
                        self.died_since = False
                    send({"type": "restarted", **self._info()})
                elif op == "interrupt":
                    pass  # for an execution that has ended since: nothing to interrupt, nothing to answer
                elif op == "shutdown":
                    with self.lock:
                        self.stopping = True
                        self.kernel.shutdown()
                    send({"type": "stopped"})
                    os._exit(0)
                else:
                    send({"type": "error", "detail": "unknown op %r" % (op,)})
        except (OSError, ValueError):
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _info(self):
        alive = self.kernel.alive()
        return {
            "alive": alive,
            "execution_count": self.kernel.execution_count,
            "language": self.cfg["language"],
            "cwd": os.getcwd(),
            "pid": self.kernel.pid() if alive else None,
        }

    # -- an execution --------------------------------------------------------------

    def execute(self, conn, reader, send, req):
        k = self.kernel
        notes = []
        if self.died_since or not k.alive():
            notes.append("kernel_replaced")
            try:
                k.start(restart=True)
            except Exception as e:
                send({"type": "end", "status": "kernel_died", "notes": ["start_failed"], "detail": str(e)[:2000]})
                return
            self.died_since = False
        timeout = float(req.get("timeout") or 60.0)
        grace = float(req.get("grace") or 3.0)
        out = Execution(send)
        ooms = oom_kills()
        content = {
            "code": str(req.get("code", "")),
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        msg_id = k.send("execute_request", content)
        zmq = k.zmq
        poller = zmq.Poller()
        poller.register(k.shell, zmq.POLLIN)
        poller.register(k.iopub, zmq.POLLIN)
        poller.register(conn.fileno(), zmq.POLLIN)
        now = time.monotonic()
        deadline = now + timeout
        interrupted_at = None
        why = None  # "timeout" | "asked" | "client_gone"
        reply = None  # type: Any
        idle = False
        error = None
        status = None
        next_check = now + LIVENESS_EVERY
        while reply is None or not idle:
            now = time.monotonic()
            if interrupted_at is None and now >= deadline:
                interrupted_at, why = now, why or "timeout"
                k.interrupt()
            if interrupted_at is not None and now >= interrupted_at + grace:
                status = "restarted"
                try:
                    k.start(restart=True)
                except Exception as e:
                    notes.append("restart_failed: " + str(e)[:500])
                    self.died_since = True
                break
            until = deadline if interrupted_at is None else interrupted_at + grace
            wait_ms = max(0, min(until - now, next_check - now, 1.0)) * 1000
            events = dict(poller.poll(int(wait_ms) + 1))
            if not events and time.monotonic() >= next_check:
                next_check = time.monotonic() + LIVENESS_EVERY
                if not k.alive():
                    while True:  # what it sent before it died
                        msg = k.recv(k.iopub)
                        if msg is None:
                            break
                        self._iopub(msg, msg_id, out)
                    status = "kernel_died"
                    self.died_since = True
                    break
                continue
            if conn.fileno() in events and not reader.fill():
                why = why or "client_gone"
                if interrupted_at is None:
                    interrupted_at = time.monotonic()
                    k.interrupt()
                poller.unregister(conn.fileno())
            while True:  # (an interrupt may have come with the request)
                line = reader.pop()
                if line is None:
                    break
                try:
                    asked = json.loads(line).get("op") == "interrupt"
                except (ValueError, AttributeError):
                    asked = False
                if asked and interrupted_at is None:
                    interrupted_at, why = time.monotonic(), "asked"
                    k.interrupt()
            if k.shell in events:
                while True:
                    msg = k.recv(k.shell)
                    if msg is None:
                        break
                    if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "execute_reply":
                        reply = msg["content"]
            if k.iopub in events:
                while True:
                    msg = k.recv(k.iopub)
                    if msg is None:
                        break
                    got = self._iopub(msg, msg_id, out)
                    if got == "idle":
                        idle = True
                    elif isinstance(got, dict):
                        error = got
        end = {"type": "end", "notes": notes}  # type: Any
        if status is None:
            rstatus = (reply or {}).get("status")
            count = (reply or {}).get("execution_count")
            if isinstance(count, int):
                k.execution_count = count
                end["execution_count"] = count
            if rstatus == "error" and error is None:
                error = {
                    "name": reply.get("ename", ""),
                    "value": reply.get("evalue", ""),
                    "traceback": reply.get("traceback", []),
                }
            if interrupted_at is not None:
                status = "interrupted"
            elif rstatus == "ok":
                status = "ok"
            else:
                status = "error"
        elif status == "kernel_died":
            end["exit"] = k.exit_status()
            end["log"] = k.log.text()[-2000:]
            after = oom_kills()
            end["oom"] = ooms is not None and after is not None and after > ooms
        end["status"] = status
        end["why"] = why
        if error is not None:
            end["error"] = error
        end["cut"] = out.finish()
        if why == "client_gone":
            return
        send(end)

    def _iopub(self, msg, msg_id, out):
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            return None
        t, c = msg["msg_type"], msg["content"]
        if t == "stream":
            out.stream(c.get("name"), c.get("text", ""))
        elif t in ("display_data", "execute_result"):
            out.result(c.get("data"), c.get("metadata"), t == "execute_result")
        elif t == "error":
            return {"name": c.get("ename", ""), "value": c.get("evalue", ""), "traceback": c.get("traceback", [])}
        elif t == "status" and c.get("execution_state") == "idle":
            return "idle"
        return None

    # -- the program ---------------------------------------------------------------

    def watch(self):
        """Between executions: a kernel that died is noted (replaced at the next one)."""
        while not self.stopping:
            time.sleep(1.0)
            if self.lock.acquire(False):
                try:
                    if not self.stopping and not self.kernel.alive():
                        self.died_since = True
                finally:
                    self.lock.release()

    def run(self):
        self.kernel.launch()  # (it boots while the bridge imports zmq and listens)
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        try:
            self.kernel.start()
        except Exception as e:
            _say(
                {
                    "loom_kernel_bridge": PROTOCOL,
                    "error": "start",
                    "detail": (str(e) + "\n" + self.kernel.log.text())[-4000:],
                }
            )
            self.kernel.shutdown()
            sys.exit(4)
        cfg = self.cfg
        _say(
            {
                "loom_kernel_bridge": PROTOCOL,
                "port": srv.getsockname()[1],
                "token": self.token,
                "language": cfg["language"],
                "cwd": os.getcwd(),
                "workdir": cfg.get("workdir", "."),
                "env": cfg.get("env") or {},
                "pid": os.getpid(),
            }
        )
        w = threading.Thread(target=self.watch)
        w.daemon = True
        w.start()
        while True:
            conn, _addr = srv.accept()
            t = threading.Thread(target=self.serve, args=(conn,))
            t.daemon = True
            t.start()


def main():
    cfg = json.loads(sys.stdin.buffer.readline())
    lost = missing_modules()
    if lost:
        _say(
            {
                "loom_kernel_bridge": PROTOCOL,
                "error": "missing",
                "missing": lost,
                "python": "%d.%d.%d" % sys.version_info[:3],
                "executable": sys.executable,
            }
        )
        sys.exit(3)
    # (jupyter_client imports ipykernel to find its kernel, which imports debugpy: quiet)
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the kernel, never the bridge
    bridge = Bridge(cfg)

    def stop(_sig, _frame):
        bridge.stopping = True
        bridge.kernel.shutdown()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    bridge.run()


#: The ``-c`` program the sandbox runs: this module's source follows on stdin (a short
#: command line in ``ps``), then the config line. It first drops the working directory from
#: ``sys.path`` (``-c`` puts it first, as ``''``): the bridge starts in the workspace, where
#: a ``secrets.py`` or ``json.py`` of the project would otherwise be imported in place of
#: the standard library's. (Not ``-I`` or ``-P``: ``-I`` would also hide the image's
#: PYTHONPATH and user site, ``-P`` needs Python 3.11.) The kernel is started the same
#: way (``kernel_process.LAUNCHER``); its code finds the project's modules as in Jupyter.
BOOT = (
    "import sys;sys.path[:]=[p for p in sys.path if p];r=sys.stdin.buffer;n=int(r.readline());"
    "exec(compile(r.read(n),'loom-kernel-bridge','exec'),{'__name__':'__main__'})"
)

if __name__ == "__main__":
    main()
