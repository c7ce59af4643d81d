"""What every route group of the service shares: the workspace id parameter, the problem
model and the error responses each route documents, the JSON response class, and the
statuses the routes document. The statuses themselves are decided in one place,
:mod:`.errors` (the error table); a large body is 413 (:mod:`.body_limit`), a refused
caller 401/403 (:mod:`worker.auth`); tool failures are results (``success: false``),
not HTTP errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from sandbox.base import StatusReporter

from ..jsontext import finite
from ..service import WORKSPACE_ID_PATTERN, encode_json

WorkspaceId = Annotated[str, PathParam(pattern=WORKSPACE_ID_PATTERN, description="Workspace id.")]


class StrictModel(BaseModel):
    """A request or response body: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class Problem(StrictModel):
    detail: str


class SafeJSONResponse(JSONResponse):
    """The service's JSON response: a lone surrogate that reached a field (bytes of a file
    name or an output that are not UTF-8, which the tools and the changelog routes quote
    first) is sent as a ``\\uXXXX`` escape instead of failing the request with a 500, and a
    non-finite number (an Infinity or NaN a refused body held, echoed in its 422) as null."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return encode_json(content)
        except ValueError:  # a non-finite number: an echo of a refused input
            return encode_json(finite(content))


Responses = dict[int | str, dict[str, Any]]

#: Every route but the public ones (the refusals of :mod:`worker.auth` and the body limit).
ERRORS: Responses = {
    401: {"model": Problem, "description": "Missing or wrong bearer token"},
    413: {"model": Problem, "description": "Request body too large"},
}
#: Routes of one workspace.
WS_ERRORS: Responses = {**ERRORS, 404: {"model": Problem, "description": "No such workspace"}}
#: Routes that run a tool call.
CALL_ERRORS: Responses = {**WS_ERRORS, 429: {"model": Problem, "description": "Too many concurrent calls"}}


async def sandbox_runs(backend: object, path: Path) -> bool:
    """Whether the workspace's sandbox runs now, asked without starting one and without
    sampling its usage (a second of the engine's time per look: a listing of terminals,
    processes or code contexts needs none). A backend that cannot tell: True (its own
    calls then answer). Raises DaemonUnavailableError."""
    if not isinstance(backend, StatusReporter):
        return True
    found = await backend.status(path, usage=False)
    return bool(found and found.get("running"))
