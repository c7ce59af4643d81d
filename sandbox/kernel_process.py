"""The kernel's process, for the kernel bridge (:mod:`sandbox.kernel_bridge`): started as
``python3 -m ipykernel_launcher -f <connection file>`` is (jupyter_client's
``KernelManager``'s command, without importing it: the kernel boots while the bridge
imports zmq; :data:`LAUNCHER` says how it differs), spoken to on shell and iopub with
messages signed by jupyter_client's ``Session``, interrupted with SIGINT to its process
group (Ctrl-C; ipykernel's interrupt mode), its ``oom_score_adj`` raised so that the
memory limit's OOM killer takes it, not the bridge.

Not imported in the sandbox: its source comes first in the one program the sandbox runs
(:func:`sandbox.kernels.bridge_source`), the bridge's after it. Python >= 3.8, standard
library (zmq and jupyter_client once the kernel is launched).
"""

import json
import os
import secrets
import signal
import sys
import tempfile
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # for mypy only
    from typing import Any  # noqa: F401  (used in type comments)

#: What ``python3 -m ipykernel_launcher`` runs, with the working directory (the
#: workspace) out of ``sys.path`` while the kernel loads: a project's ``signal.py`` or
#: ``secrets.py`` would otherwise be imported in place of the standard library's and the
#: kernel never start. ipykernel_launcher drops it only as ``''`` before ipykernel 6.22
#: (Debian 12 has 6.17), and ``-m`` puts the full path there; with ``-c`` it is ``''``.
#: IPython puts ``''`` back for the code (``InteractiveShellApp.init_path``), so the code
#: imports the project's modules as in Jupyter.
LAUNCHER = (
    "import sys;sys.path[:]=[p for p in sys.path if p];from ipykernel import kernelapp as app;app.launch_new_instance()"
)
#: How long a kernel has to start and answer.
START_TIMEOUT = 60.0


class Tail:
    """The last bytes a pipe (the kernel's own stdout and stderr) carried."""

    def __init__(self, fd, keep=8192):
        self.keep = keep
        self.data = b""
        t = threading.Thread(target=self._read, args=(fd,))
        t.daemon = True
        t.start()

    def _read(self, fd):
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.data = (self.data + chunk)[-self.keep :]

    def text(self):
        return self.data.decode("utf-8", "replace").strip()


def oom_kills():
    """How many times the OOM killer fired in this sandbox's memory cgroup (None: cannot
    tell, as under gVisor, whose worker reads it on the host)."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


class Kernel:
    """One IPython kernel: its process (started here as jupyter_client's KernelManager
    would start it, without importing it: the kernel boots while the bridge imports zmq)
    and the two sockets the bridge speaks to it on (shell, iopub)."""

    def __init__(self, cfg, workdir):
        self.cfg = cfg
        env = dict(os.environ)
        env.update(cfg.get("env") or {})
        env.setdefault("MPLCONFIGDIR", os.path.join(tempfile.gettempdir(), "loom-matplotlib-%d" % os.getuid()))
        env["JUPYTER_RUNTIME_DIR"] = workdir
        env["IPYTHONDIR"] = os.path.join(workdir, "ipython")
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        env["JUPYTER_PLATFORM_DIRS"] = "1"
        self.env = env
        r, w = os.pipe()
        self.log_w = w
        self.log = Tail(r)
        self.conn_file = os.path.join(workdir, "kernel.json")
        # Unix sockets in the kernel's own directory ("ipc": <ip>-<port>), not TCP ports on
        # the loopback. Ports picked free and let go (jupyter_client's way) can be taken
        # before the kernel binds them: by the source port of any connection made meanwhile,
        # the bridge's own two sockets among them (they connect while the kernel boots and
        # retry every 100 ms). ipykernel then dies with "Address already in use" (once in CI).
        self.info = {
            "shell_port": 1,
            "iopub_port": 2,
            "stdin_port": 3,
            "control_port": 4,
            "hb_port": 5,
            "ip": os.path.join(workdir, "k"),
            "key": secrets.token_hex(16),
            "transport": "ipc",
            "signature_scheme": "hmac-sha256",
            "kernel_name": cfg.get("kernel", "python3"),
        }
        with open(self.conn_file, "w") as f:
            json.dump(self.info, f)
        self.proc = None  # type: Any
        self.zmq = None  # type: Any
        self.session = None  # type: Any
        self.ctx = None  # type: Any
        self.shell = None  # type: Any
        self.iopub = None  # type: Any
        self.execution_count = 0

    def launch(self):
        """Start the kernel's process (not waiting for it)."""
        import subprocess

        argv = [sys.executable, "-c", LAUNCHER, "-f", self.conn_file]
        self.proc = subprocess.Popen(
            argv,
            env=self.env,
            cwd=os.getcwd(),
            stdin=subprocess.DEVNULL,
            stdout=self.log_w,
            stderr=self.log_w,
            start_new_session=True,  # its own process group: an interrupt reaches what it runs
            close_fds=True,
        )
        self.execution_count = 0
        self._oom_first()

    def start(self, restart=False):
        """Start (or restart) the kernel and wait until it answers. Raises RuntimeError."""
        self._close_sockets()
        if restart or self.proc is None:
            self.kill()
            self.launch()
        if self.zmq is None:
            import zmq
            from jupyter_client.session import Session

            self.zmq = zmq
            self.ctx = zmq.Context()
            self.session = Session(key=self.info["key"].encode(), signature_scheme="hmac-sha256")
        zmq = self.zmq
        self.shell = self.ctx.socket(zmq.DEALER)
        self.shell.linger = 0
        self.shell.connect(self.address("shell_port"))
        self.iopub = self.ctx.socket(zmq.SUB)
        self.iopub.linger = 0
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(self.address("iopub_port"))
        self._wait_ready()

    def address(self, channel):
        """The ZMQ address of the kernel's ``channel`` (``"shell_port"``, ...)."""
        return "ipc://%s-%d" % (self.info["ip"], self.info[channel])

    def _oom_first(self):
        """The memory limit's OOM killer takes the kernel, not the bridge."""
        try:
            with open("/proc/%d/oom_score_adj" % self.proc.pid, "w") as f:
                f.write("1000")
        except OSError:
            pass

    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def exit_status(self):
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return {}
        return {"signal": -code} if code < 0 else {"code": code}

    def _close_sockets(self):
        for s in (self.shell, self.iopub):
            if s is not None:
                s.close(linger=0)
        self.shell = self.iopub = None

    def _wait_ready(self):
        """kernel_info until the kernel answers on shell and iopub (the subscription is up),
        then what it sent meanwhile read and dropped."""
        deadline = time.monotonic() + START_TIMEOUT
        poller = self.zmq.Poller()
        poller.register(self.shell, self.zmq.POLLIN)
        poller.register(self.iopub, self.zmq.POLLIN)
        shell_ok = iopub_ok = False
        while not (shell_ok and iopub_ok):
            if time.monotonic() > deadline:
                raise RuntimeError("the kernel did not answer within %d s" % START_TIMEOUT)
            if not self.alive():
                raise RuntimeError("the kernel exited while starting (%s)" % (self.exit_status() or "?"))
            # Asked again until both answered: the subscription to iopub comes up after
            # the kernel may have published the first answer's status.
            self.session.send(self.shell, "kernel_info_request", {})
            for sock, _ev in poller.poll(200):
                msg = self.recv(sock)
                if msg is None:
                    continue
                if sock is self.shell and msg["msg_type"] == "kernel_info_reply":
                    shell_ok = True
                elif sock is self.iopub:
                    iopub_ok = True
        quiet = time.monotonic() + 0.05
        while time.monotonic() < quiet:  # the answers to the other kernel_info requests
            for sock, _ev in poller.poll(20):
                if self.recv(sock) is not None:
                    quiet = time.monotonic() + 0.05

    def send(self, msg_type, content):
        """Send a request on shell; its msg_id."""
        return self.session.send(self.shell, msg_type, content)["header"]["msg_id"]

    def recv(self, sock):
        try:
            frames = sock.recv_multipart(self.zmq.NOBLOCK)
        except self.zmq.Again:
            return None
        _idents, frames = self.session.feed_identities(frames)
        return self.session.deserialize(frames)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def interrupt(self):
        """SIGINT to the kernel's process group, as Ctrl-C (ipykernel's interrupt mode)."""
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except OSError:
                pass

    def kill(self):
        """End the kernel and everything it started (its process group)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except Exception:
            pass

    def shutdown(self):
        self._close_sockets()
        self.kill()
