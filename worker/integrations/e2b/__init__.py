"""E2B's API, served by loom (``pip install 'loom-worker[e2b]'``; docs/e2b.md): the
official E2B SDKs, and every framework built on them, run unchanged against
``loom-worker serve`` with ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` set to the service's
address and ``E2B_API_KEY`` to its token.

An E2B sandbox is a loom workspace (its id is the workspace's id): what E2B's API changes
in it is in the workspace's changelog, undoable, and shown by the dashboard like any
other. The modules:

    :mod:`.target`       which sandbox a request is for (``E2b-Sandbox-Id``), its paths
    :mod:`.control`      the control plane: /sandboxes, /v2/sandboxes, ... (E2B's OpenAPI);
                         beside it :mod:`.usage` (metrics), :mod:`.snapshots` (snapshots,
                         forks), :mod:`.refusals` (501s, E2B's 404), :mod:`.listing`
                         (filters, pages), :mod:`.answers` (E2B's shapes and errors)
    :mod:`.conventions`  E2B's conventions as loom's settings: templates, /home/user, env
                         vars, network
    :mod:`.records`      the host's record of each sandbox; :mod:`.plane` lifetimes, starts,
                         kill and pause, the gate of a sandbox's own API; :mod:`.warm`
                         sandboxes made ahead
    :mod:`.process`      envd's process service (Connect-RPC, ``process.Process``)
    :mod:`.filesystem`   envd's filesystem service (``filesystem.Filesystem``)
    :mod:`.files`        envd's ``/files`` (download, upload, signed URLs) and ``/health``
    :mod:`.interpreter`  the code interpreter's ``/execute`` and ``/contexts`` (port 49999)

Found by entry point (``loom_worker.integrations``, name ``e2b``): the core never imports
this package; :func:`routes` is what ``loom-worker serve`` mounts.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

# What routes() imports from the extra, looked for when the entry point loads: without the
# extra, loading it fails as a missing module does (worker.plugins: IntegrationUnavailable,
# so `serve` goes on without E2B's API), not when `serve` asks for the routes.
for _needed in ("e2b", "connectrpc"):
    if find_spec(_needed) is None:
        raise ModuleNotFoundError(f"No module named {_needed!r}", name=_needed)


def routes(settings: Any) -> list[Any]:
    """The routes of E2B's API, matched before loom's own (``create_app(routes=...)``)."""
    from . import control, files, filesystem, interpreter, process

    out: list[Any] = []
    # The interpreter's first: its routes match only the requests for its port (the
    # E2b-Sandbox-Port header 49999), whatever their path, so envd's /health is not its.
    for module in (interpreter, control, process, filesystem, files):
        out.extend(module.routes(settings))
    return out
