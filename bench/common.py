"""What several benchmark scripts need: a free loopback port, and the environment of a
loom-worker process run from this checkout. The scripts import it as ``common`` (Python
puts a script's own folder on ``sys.path``)."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gvisor_spec() -> dict[str, str]:
    """The ``SandboxSpec`` fields of gVisor sandboxes as ``default_registry`` makes them:
    the platform (``LOOM_GVISOR_PLATFORM``, default systrap) and a directory for their
    direct channels."""
    return {
        "gvisor_platform": os.environ.get("LOOM_GVISOR_PLATFORM", "systrap"),
        "channel_dir": str(Path(tempfile.gettempdir()) / "loom-bench-channels"),
    }


def env_for(runtime: str, data: Path, run: Path) -> dict[str, str]:
    """The environment of a loom-worker process from this checkout: ours, without any
    ``LOOM_*`` of the caller but gVisor's platform, on ``runtime``, with its own data and
    run directories."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_") or k == "LOOM_GVISOR_PLATFORM"}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "LOOM_RUNTIME": runtime,
            "LOOM_DATA_DIR": str(data),
            "LOOM_LOG_LEVEL": "warning",
            "XDG_RUNTIME_DIR": str(run),
            "LOOM_IMAGE": os.environ.get("LOOM_IMAGE", "loom-sandbox:latest"),
        }
    )
    return env
