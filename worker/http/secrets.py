"""HTTP routes for secrets (:mod:`worker.egress.secrets`): write-only.

    GET    /v1/workspaces/{id}/secrets            the secrets that apply (its own and the defaults)
    PUT    /v1/workspaces/{id}/secrets/{name}     {"value", "hosts", "header" | "query"}: set one
    DELETE /v1/workspaces/{id}/secrets/{name}
    GET    /v1/secrets                            the process-wide defaults (every workspace)
    PUT    /v1/secrets/{name}
    DELETE /v1/secrets/{name}

No answer ever holds a value: a secret is shown by its name, hosts, how it is used and its
placeholder. The body is read and checked here rather than by FastAPI's validation, whose
422 repeats the input it refused (the value, for a body that lacks another field); a
refusal here names the field and never echoes anything. Under the service's token
(``LOOM_API_TOKEN``) like every route.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from ..egress.provision import advice
from ..egress.secrets import NAME, SecretError
from .common import WorkspaceId
from .errors import Gone, Unavailable
from .state import service_of

router = APIRouter(tags=["secrets"])
SecretName = Annotated[str, PathParam(pattern=NAME.pattern, description="The secret's name (its variable).")]


class SecretIn(BaseModel):
    """A secret to set (the request body; documented here, checked by hand)."""

    model_config = ConfigDict(extra="forbid")

    value: str = Field(description="The value. Never returned, logged or shown again.", max_length=8192)
    hosts: list[str] = Field(description="Where it is sent: entries as in the egress allowlist.", min_length=1)
    header: str | None = Field(
        None,
        description="A header template: 'Authorization: Bearer {value}', 'X-API-Key: {}', or "
        "'Authorization: Basic {USER:value}' (git over HTTPS).",
    )
    query: str | None = Field(None, description="Or a query parameter the value is given as.")


_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": SecretIn.model_json_schema()}}}}


def _store(request: Request) -> Any:
    configs = service_of(request.app).local.configs
    secrets = None if configs is None else configs.secrets
    if secrets is None:
        raise SecretError("secrets", "this service keeps no secrets (no per-workspace settings)")
    return secrets.store


async def _body(request: Request) -> dict[str, Any]:
    """Raises SecretError naming what is wrong (never quoting it)."""
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise SecretError("body", "a JSON object") from None
    if not isinstance(body, dict):
        raise SecretError("body", "a JSON object")
    for key in body:
        if key not in SecretIn.model_fields:
            raise SecretError(str(key)[:64], "unknown field (value, hosts, header, query)")
    if "value" not in body:
        raise SecretError("value", "required")
    return body


async def _put(request: Request, root: Path | None, name: str) -> dict[str, Any]:
    """Raises SecretError (a 422 naming the field), Unavailable (a 503 naming only the
    kind of failure: an OSError's message could hold what was being written)."""
    store = _store(request)
    body = await _body(request)

    def write() -> tuple[bool, Any]:  # (a locked, fsync'd write: off the event loop)
        existed = name in store.load(root)
        hosts, header, query = body.get("hosts"), body.get("header"), body.get("query")
        return existed, store.set(root, name, hosts=hosts, header=header, query=query, value=body["value"])

    try:
        existed, secret = await asyncio.to_thread(write)
        configs = service_of(request.app).local.configs
        policy = None if root is None or configs is None else configs.policy(root)
    except SecretError:
        raise
    except (OSError, ValueError) as e:  # (a settings file that does not parse)
        raise Unavailable(f"could not be stored: {type(e).__name__}") from None
    return {"secret": secret.public(), "message": advice(secret, not existed, policy)}


def _list(request: Request, root: Path | None) -> dict[str, Any]:
    store = _store(request)
    secrets = store.load(None) if root is None else store.effective(root)
    if root is not None:
        store.load(root)  # a file that does not parse is reported, not hidden
    return {"secrets": [s.public() for s in sorted(secrets.values(), key=lambda s: s.name)]}


async def _delete(request: Request, root: Path | None, name: str) -> dict[str, Any]:
    deleted = await asyncio.to_thread(_store(request).delete, root, name)
    if not deleted:
        raise Gone(f"no secret {name} here")
    return {"deleted": name}


async def _root(request: Request, workspace_id: str) -> Path:
    path: Path = await service_of(request.app).workspaces.locate(workspace_id)
    return path.resolve()


@router.get("/v1/workspaces/{workspace_id}/secrets")
async def list_secrets(request: Request, workspace_id: WorkspaceId) -> Any:
    """The secrets that apply to the workspace (its own, and the defaults it does not
    override), without their values."""
    return _wrap(_list(request, await _root(request, workspace_id)), id=workspace_id)


@router.put("/v1/workspaces/{workspace_id}/secrets/{name}", openapi_extra=_BODY)
async def put_secret(request: Request, workspace_id: WorkspaceId, name: SecretName) -> Any:
    """Create or change one of the workspace's secrets. A new one is in the sandbox (as a
    placeholder in ``$NAME``) from its next call; a changed value is used by the next
    request."""
    return _wrap(await _put(request, await _root(request, workspace_id), name), id=workspace_id)


@router.delete("/v1/workspaces/{workspace_id}/secrets/{name}")
async def delete_secret(request: Request, workspace_id: WorkspaceId, name: SecretName) -> Any:
    return _wrap(await _delete(request, await _root(request, workspace_id), name), id=workspace_id)


@router.get("/v1/secrets")
async def list_defaults(request: Request) -> Any:
    """The process-wide default secrets (every workspace's, unless it has its own of that
    name), without their values."""
    return _list(request, None)


@router.put("/v1/secrets/{name}", openapi_extra=_BODY)
async def put_default(request: Request, name: SecretName) -> Any:
    return await _put(request, None, name)


@router.delete("/v1/secrets/{name}")
async def delete_default(request: Request, name: SecretName) -> Any:
    return await _delete(request, None, name)


def _wrap(out: dict[str, Any], **extra: Any) -> Any:
    return {**extra, **out}
