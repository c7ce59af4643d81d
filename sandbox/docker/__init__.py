"""The Docker backend: the only package that imports the Docker SDK.

One hardened container per workspace, reused by every worker process, with a persistent
agent in it: a request costs a round trip over an already-open stream (~0.2 ms), not a
``docker exec`` (~40 ms). Blocking SDK calls run in threads (``asyncio.to_thread``);
idempotent daemon calls (inspect, create, start, info) are retried with tenacity; a command
is never retried. Docker errors are translated into :mod:`sandbox.errors` in
:mod:`.errors` and nowhere else.

Modules, one concern each:

- :mod:`.errors`         the SDK's errors translated, and which are worth a retry
- :mod:`.engine`         the SDK client and the calls made through it (thread, retry, translate)
- :mod:`.config`         the container's name, labels, mounts and hardening (``containers.create``)
- :mod:`.seccomp`        the sandbox's own seccomp profile, group by group with the reasons
- :mod:`.images`         images on the engine or pulled: policy, registries, progress, errors
- :mod:`.channel`        the agent channel: attach stream, ``docker exec``, direct socket, fd channel
- :mod:`.runtime_volume` the agent runtime's read-only volume
- :mod:`.checks`         the runtime the spec asks for is there and in effect (gVisor), and the
                         seccomp profile
- :mod:`.housekeeping`   list, gc, status and usage
- :mod:`.pool`           warm sandboxes: started before a workspace asks, claimed, refilled (runc)
- :mod:`.slots`          a warm sandbox's slot on the host and the record of its claim
- :mod:`.hostmounts`     the host's mounts the pool makes (a shared root, binds, their undoing)
- :mod:`.box`            :class:`DockerSandbox`, the sandbox object handed out
- :mod:`.backend`        :class:`DockerBackend`: lifecycle (create, reuse, claim, recover, stop)
"""

from .backend import DockerBackend, DockerSandbox
from .channel import DockerExecTransport, connect_agent_socket, connect_fd_channel
from .config import container_name, workspace_key

__all__ = [
    "DockerBackend",
    "DockerExecTransport",
    "DockerSandbox",
    "connect_agent_socket",
    "connect_fd_channel",
    "container_name",
    "workspace_key",
]
