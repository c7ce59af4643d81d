"""What every route group of the service shares: the workspace id parameter, the problem
model and the error responses each route documents, the JSON response class, and the
answers to the service's own errors (:mod:`worker.service`).

Client input never produces a 500: bad bodies are 422 naming the field, unknown
workspaces 404, a name taken 409, a full service 429 (``Retry-After``), a large body 413
(:mod:`.body_limit`), a refused caller 401/403 (:mod:`worker.auth`); tool failures are
results (``success: false``), not HTTP errors.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Path as PathParam
from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from ..jsontext import finite
from ..service import WORKSPACE_ID_PATTERN, Busy, InvalidWorkspaceId, WorkspaceExists, WorkspaceNotFound, encode_json
from .state import NotHeldHere

WorkspaceId = Annotated[str, PathParam(pattern=WORKSPACE_ID_PATTERN, description="Workspace id.")]

ExceptionHandler = Callable[[Request, Any], Coroutine[Any, Any, Response]]
#: A module's answers to its errors, as ``FastAPI(exception_handlers=...)`` takes them.
Handlers = dict[int | type[Exception], ExceptionHandler]


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


async def _not_found(_r: Request, e: Exception) -> Response:
    return JSONResponse({"detail": str(e)}, status_code=404)


async def _bad_id(_r: Request, e: Exception) -> Response:
    return JSONResponse({"detail": str(e)}, status_code=422)


async def _exists(_r: Request, e: Exception) -> Response:
    return JSONResponse({"detail": str(e)}, status_code=409)


async def _busy(_r: Request, e: Exception) -> Response:
    return JSONResponse({"detail": str(e)}, status_code=429, headers={"Retry-After": "1"})


async def _not_here(_r: Request, e: Exception) -> Response:
    return JSONResponse({"detail": str(e)}, status_code=501)


async def _invalid(_r: Request, e: Exception) -> Response:
    # FastAPI's own handler, answering with the safe response: the errors echo the input,
    # and a body's Infinity or NaN there made that handler fail with a 500.
    assert isinstance(e, RequestValidationError)
    return SafeJSONResponse({"detail": jsonable_encoder(e.errors())}, status_code=422)


#: The answers to :mod:`worker.service`'s errors, for every route.
HANDLERS: Handlers = {
    WorkspaceNotFound: _not_found,
    InvalidWorkspaceId: _bad_id,
    WorkspaceExists: _exists,
    Busy: _busy,
    NotHeldHere: _not_here,
    RequestValidationError: _invalid,
}
