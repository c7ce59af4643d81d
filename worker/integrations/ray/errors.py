"""What the cluster layer raises::

    ClusterError
    ├── NodeLostError        (also SandboxUnavailableError: an infrastructure failure)
    │                        the workspace's node died or stopped answering
    ├── ClusterFullError     (also SandboxUnavailableError) no node has a free slot
    ├── CallInterruptedError (also SandboxUnavailableError) a call's connection to its
    │                        node broke before the answer, the node alive
    └── RayNotConnectedError the Ray cluster cannot be reached

A workspace that does not exist is :class:`worker.service.WorkspaceNotFound`, one that
exists already :class:`worker.service.WorkspaceExists`, as for the local service. Errors
the node's registry raises (``SettingsError``, ``ToolError``, a sandbox's ``AgentError``)
reach the caller as they were raised there.
"""

from __future__ import annotations

from sandbox.errors import SandboxUnavailableError


class ClusterError(Exception):
    """Base of the cluster layer's own errors."""


class NodeLostError(ClusterError, SandboxUnavailableError):
    """The node holding a workspace died (or does not answer): its calls cannot run.

    ``workspace`` is the workspace id, ``node`` the last node it was known on."""

    def __init__(self, workspace: str, node: str | None, detail: str = "") -> None:
        self.workspace, self.node = workspace, node
        where = f"node {node}" if node else "its node"
        msg = (
            f"workspace {workspace!r} is on {where}, which was lost (Ray reports it dead or unreachable); "
            "its files stay on that node's disk"
        )
        super().__init__(f"{msg}: {detail}" if detail else msg)


class ClusterFullError(ClusterError, SandboxUnavailableError):
    """No node of the cluster has a free sandbox slot (or none matches the pin)."""


class RayNotConnectedError(ClusterError, ConnectionError):
    """The Ray cluster at the given address cannot be reached."""


class CallInterruptedError(ClusterError, SandboxUnavailableError):
    """The connection carrying a call to a workspace's node broke before its answer, and
    Ray says the node is alive: the call may or may not have run there."""

    def __init__(self, workspace: str, node: str | None, detail: str = "") -> None:
        self.workspace, self.node = workspace, node
        msg = (
            f"the call to workspace {workspace!r} on node {node} lost its connection before the answer "
            "(the node is alive; the call may or may not have run: look at the workspace before repeating it)"
        )
        super().__init__(f"{msg}: {detail}" if detail else msg)
