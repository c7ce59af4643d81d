"""Lists as E2B's API pages them: filters, order, and the cursor.

``GET /v2/sandboxes`` takes ``metadata`` (one query parameter holding a query string,
``k=v&k2=v2``, each key and value URL-encoded: E2B's SDKs quote them and encode the whole
again), ``state`` (``running,paused``: one parameter, comma-separated, or repeated),
``startedAfter``, ``template``, ``order`` (``desc``, newest first, by default), ``limit``
(1-100, 100 by default) and ``nextToken``. The answer's ``X-Next-Token`` header carries
the cursor of the next page when there is one (the SDK's paginator reads it: no header, no
next page); ``X-Total-Running`` the running sandboxes matching the filters, before
pagination. ``GET /snapshots`` pages the same way. A cursor is the position after the
last item given (opaque to clients: base64url of JSON), so a page is stable while
sandboxes come and go.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote

from starlette.datastructures import QueryParams

from .answers import E2BError
from .records import SandboxRecord

T = TypeVar("T")
MAX_LIMIT = 100
STATES = ("running", "paused")


@dataclass(frozen=True)
class Query:
    metadata: dict[str, str] | None = None
    states: frozenset[str] | None = None
    started_after: float | None = None
    template: str | None = None
    descending: bool = True
    limit: int = MAX_LIMIT
    next_token: str | None = None

    def matches(self, rec: SandboxRecord) -> bool:
        if self.metadata is not None and any(rec.metadata.get(k) != v for k, v in self.metadata.items()):
            return False
        state = "paused" if rec.state == "paused" else "running"
        if self.states is not None and state not in self.states:
            return False
        if self.started_after is not None and rec.started_at < self.started_after:
            return False
        if self.template is not None and self.template not in (rec.template, rec.image):
            return False
        return True


def parse_metadata(text: str) -> dict[str, str]:
    """E2B's ``metadata`` filter (``k=v&k2=v2``, each part URL-encoded). Raises E2BError 400."""
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise E2BError(400, f"metadata: {text!r} is not a query string like key=value&key2=value2") from None
    return {unquote(k): unquote(v) for k, v in pairs}


def limit_of(params: QueryParams) -> int:
    raw = params.get("limit")
    if raw is None or raw == "":
        return MAX_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise E2BError(400, f"limit: {raw!r} is not a number") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise E2BError(400, f"limit: between 1 and {MAX_LIMIT}, not {limit}")
    return limit


def parse_query(params: QueryParams, *, paged: bool = True) -> Query:
    """The filters of ``GET /sandboxes`` (``paged=False``: metadata only, running ones)
    or ``GET /v2/sandboxes``. Raises E2BError 400 naming the parameter."""
    metadata = parse_metadata(params["metadata"]) if params.get("metadata") else None
    if not paged:
        return Query(metadata=metadata, states=frozenset({"running"}), limit=10_000)
    states = None
    raw_states = [s for v in params.getlist("state") for s in v.split(",") if s]
    if raw_states:
        unknown = [s for s in raw_states if s not in STATES]
        if unknown:
            raise E2BError(400, f"state: {unknown[0]!r} is not one of {', '.join(STATES)}")
        states = frozenset(raw_states)
    started = None
    if params.get("startedAfter"):
        try:
            started = datetime.fromisoformat(params["startedAfter"].replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise E2BError(400, f"startedAfter: {params['startedAfter']!r} is not an RFC 3339 date") from None
    order = params.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise E2BError(400, f"order: asc or desc, not {order!r}")
    return Query(
        metadata=metadata,
        states=states,
        started_after=started,
        template=params.get("template") or None,
        descending=order == "desc",
        limit=limit_of(params),
        next_token=params.get("nextToken") or None,
    )


def _cursor(key: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def _position(token: str) -> list[Any]:
    try:
        key = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        raise E2BError(400, "nextToken: not a cursor this service gave") from None
    if not isinstance(key, list) or len(key) != 2:
        raise E2BError(400, "nextToken: not a cursor this service gave")
    return key


def page(
    items: list[T], key: Callable[[T], tuple[float, str]], *, descending: bool, limit: int, token: str | None
) -> tuple[list[T], str | None]:
    """One page of ``items`` in ``key`` order (``descending``), after the position
    ``token`` names; and the cursor of the next page (None: this is the last). Raises
    E2BError 400 (a token that is not a cursor)."""
    ordered = sorted(items, key=key, reverse=descending)
    if token is not None:
        after = tuple(_position(token))
        ordered = [i for i in ordered if (key(i) < after if descending else key(i) > after)]
    shown = ordered[:limit]
    more = len(ordered) > limit
    return shown, (_cursor(key(shown[-1])) if more and shown else None)


__all__ = ["MAX_LIMIT", "Query", "limit_of", "page", "parse_metadata", "parse_query"]
