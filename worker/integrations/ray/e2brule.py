"""How a cluster's front door carries E2B's API (:mod:`worker.integrations.e2b`, served by
``loom-worker serve --ray`` as by ``serve``): the part of :func:`.forward.carried`'s rule
for E2B's paths (:func:`worker.auth.e2b_kind`), one rule, as for loom's own routes:

- **Every request that names one sandbox goes whole to the sandbox's node**, whose own app
  (with E2B's routes: :mod:`.nodeapp`) answers it: envd's and the code interpreter's
  (the sandbox named by the ``E2b-Sandbox-Id`` header; a signed ``/files`` URL names none,
  and goes to the sandbox that signed it), and the control plane's requests under one
  sandbox (``/sandboxes/{id}/...``, ``/v2/sandboxes/{id}/...``): the sandbox's record is on
  its node.
- What spans the nodes is the front door's (:data:`E2B_FRONT`): a sandbox created (the
  node chosen here, the request then carried to it: :mod:`.e2bfront`) and the sandboxes
  listed (every node's lists merged).
- Refused (501, naming why): what names no single sandbox and spans the nodes otherwise
  (:data:`E2B_REFUSED`, and any other path of E2B's control plane outside a sandbox:
  templates, snapshots, teams, ... hold nothing a cluster could answer from one place),
  and under a sandbox what makes new sandboxes (:data:`E2B_REFUSED_UNDER_SANDBOX`).
"""

from __future__ import annotations

import re
from typing import Literal

from ...auth import Kind, e2b_kind

Decision = Literal["forward", "front", "refuse"]

#: The collections of E2B's sandboxes (a sandbox's own routes are below them).
SANDBOX_COLLECTIONS = (("sandboxes",), ("v2", "sandboxes"))
#: Words after ``/sandboxes/`` that are not a sandbox's id.
NOT_SANDBOX_IDS = frozenset({"metrics"})

_PLACED = (
    "spans the nodes: a new sandbox is placed on a node with a free slot, chosen here, and its request carried "
    "to that node, whose control plane makes the sandbox and its record"
)
_GATHERED = "spans the nodes: every node's sandboxes, merged here, paginated and filtered as E2B's API does"

#: E2B's requests the front door answers itself, by (method, path), with why.
E2B_FRONT: dict[tuple[str, str], str] = {
    ("POST", "/sandboxes"): _PLACED,
    ("POST", "/v2/sandboxes"): _PLACED,
    ("GET", "/sandboxes"): _GATHERED,
    ("GET", "/v2/sandboxes"): _GATHERED,
}

#: E2B's requests refused outside any sandbox, by (method, path), with why (any other
#: path of the control plane outside a sandbox is refused with :data:`ELSEWHERE`).
E2B_REFUSED: dict[tuple[str, str], str] = {
    ("GET", "/sandboxes/metrics"): (
        "the metrics of several sandboxes at once span the nodes: ask each sandbox's, "
        "GET /sandboxes/{sandboxID}/metrics, which this front door carries to its node"
    ),
}

#: Under one sandbox, by (method, the path after the sandbox's id), with why.
E2B_REFUSED_UNDER_SANDBOX: dict[tuple[str, str], str] = {
    ("POST", "fork"): (
        "E2B's fork makes new sandboxes, each of which must hold a slot of the cluster on the source's node "
        "(copy-on-write works within one filesystem): not carried yet; fork with loom's API, "
        "POST /v1/workspaces/{id}/fork, which places the forks"
    ),
}

ELSEWHERE = (
    "E2B's API outside one sandbox spans the nodes, and a cluster's front door carries only creating and "
    "listing sandboxes there (and every request that names one sandbox, to its node)"
)
IN_SANDBOX = (
    "E2B's in-sandbox API (envd, the code interpreter): the node of the sandbox named by E2b-Sandbox-Id "
    "(a signed /files URL: of the sandbox that signed it) answers"
)
UNDER_SANDBOX = "E2B's control plane for one sandbox: the sandbox's node answers (its record is there)"


#: The template of a route of every path: the code interpreter's answer on its port
#: (``E2b-Sandbox-Port: 49999``) to a path it does not have.
CATCH_ALL = re.compile(r"/\{[^/{}]+:path\}")
ANY_PATH = (
    "a route of any path, matched by E2B's port header (the code interpreter's 404 for a path it does not "
    "have): the same answer here as on a node; its own paths (/execute, /contexts...) name a sandbox and go to "
    "its node"
)


def sandbox_in_path(path: str) -> tuple[str, str] | None:
    """(the sandbox's id, the path after it) of a control-plane path under one sandbox
    (``/sandboxes/{id}``, ``/v2/sandboxes/{id}/...``); None for any other path."""
    parts = path.strip("/").split("/")
    for collection in SANDBOX_COLLECTIONS:
        n = len(collection)
        if tuple(parts[:n]) == collection and len(parts) > n and parts[n] and parts[n] not in NOT_SANDBOX_IDS:
            return parts[n], "/".join(parts[n + 1 :])
    return None


def e2b_carried(method: str, path: str) -> tuple[Decision, str] | None:
    """How the front door carries ``method path`` of E2B's API (a request's path or a
    route's template): forwarded to a sandbox's node, served at the front, or refused,
    each with why; None for a path that is not E2B's."""
    if CATCH_ALL.fullmatch(path):
        return "front", ANY_PATH
    # (a mounted service's route is its path's prefix: /process.Process)
    kind = e2b_kind(path) or e2b_kind(path + "/")
    if kind is None:
        return None
    if kind is Kind.E2B_SANDBOX:
        return "forward", IN_SANDBOX
    under = sandbox_in_path(path)
    if under is not None:
        why = E2B_REFUSED_UNDER_SANDBOX.get((method, under[1]))
        return ("refuse", why) if why is not None else ("forward", UNDER_SANDBOX)
    top = "/" + path.strip("/")
    if (method, top) in E2B_FRONT:
        return "front", E2B_FRONT[(method, top)]
    return "refuse", E2B_REFUSED.get((method, top), ELSEWHERE)
