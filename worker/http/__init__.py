"""The HTTP service: one FastAPI app (:func:`create_app`, :mod:`.app`) composed of route
groups, a module each with its ``APIRouter`` and its models (listed in :mod:`.app`). Who
may call is decided in :mod:`worker.auth`; the dashboard's static app is served from
:mod:`worker.dashboard`."""

from .app import UnsafeBindError, check_bind, create_app
from .common import SafeJSONResponse, WorkspaceId
from .execute import ExecuteRequest

__all__ = ["ExecuteRequest", "SafeJSONResponse", "UnsafeBindError", "WorkspaceId", "check_bind", "create_app"]
