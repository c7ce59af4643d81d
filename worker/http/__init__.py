"""The HTTP service: one FastAPI app (:mod:`.app`: tools, workspaces, MCP, metrics) and
its route groups, a module each: the call history (:mod:`.calls`), the changelog and
undo (:mod:`.changelog`), per-call diffs (:mod:`.changes`), egress (:mod:`.egress`), the
port proxy (:mod:`.ports`), background processes (:mod:`.processes`), sandbox state
(:mod:`.sandbox`), workspace settings (:mod:`.settings`) and the streaming execute
(:mod:`.stream`). The dashboard's static app is mounted from :mod:`worker.dashboard`."""

from .app import ExecuteRequest, SafeJSONResponse, UnsafeBindError, WorkspaceId, check_bind, create_app

__all__ = ["ExecuteRequest", "SafeJSONResponse", "UnsafeBindError", "WorkspaceId", "check_bind", "create_app"]
