"""E2B's answers as a cluster's front door reads, merges and makes them (no I/O here: the
requests are :mod:`.e2bfront`'s).

- **Errors** in E2B's shapes (:func:`e2b_error`): the control plane's, envd's and the code
  interpreter's ``{"code": <status>, "message": ...}``; envd's Connect-RPC services'
  ``{"code": "<Connect code>", "message": ...}`` (Connect's JSON error, which its clients
  read from a unary answer and from a stream refused before it began alike).
- **Access tokens**: a sandbox's ``envdAccessToken`` (and ``trafficAccessToken``) is an
  HMAC of its id under the token of the service that hands it out
  (:meth:`worker.auth.Access.envd_token`), and a client sends it back to the front door,
  which checks it: so the tokens in the node's answers are replaced with the front door's
  own (:func:`front_tokens`). A node's never leaves it.
- **Lists** gathered from every node (:func:`merged_page`): the nodes' JSON arrays merged,
  sorted as E2B sorts sandboxes (by ``startedAt``, newest first unless ``order=asc``;
  then by id), and cut into pages here: ``limit`` (1 to 100, 100 by default) and
  ``nextToken``, an opaque cursor naming the last item handed out (the next page starts
  after it, in that order, so sandboxes created or killed between pages shift nothing),
  sent in ``X-Next-Token`` as E2B does. Each node is asked for all it has that passes the
  filters (``metadata``, ``state``, ``template``, ``startedAt``, ...: every parameter
  but the pagination's is passed on as given, and checked there), page by page
  (:func:`node_query`).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fastapi.responses import JSONResponse

Messages = list[dict[str, Any]]
Headers = list[tuple[bytes, bytes]]

#: E2B's page size, and its most.
PAGE_LIMIT = 100
#: envd's Connect-RPC services (their errors are Connect's).
CONNECT_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")
#: A sandbox's access tokens in the control plane's answers: envd's, and the one the
#: code interpreter's SDK sends on some requests (the same token: ``worker.auth``).
TOKEN_FIELDS = ("envdAccessToken", "trafficAccessToken")
#: The fields naming an item of a list, in the order looked for.
ID_FIELDS = ("sandboxID", "snapshotID", "id")


def e2b_error(path: str, status: int, connect_code: str, message: str) -> JSONResponse:
    """An error of E2B's API at ``path``, in the shape its clients read there."""
    code: str | int = connect_code if path.startswith(CONNECT_PREFIXES) else status
    return JSONResponse({"code": code, "message": message}, status_code=status)


# -- answers as ASGI messages ----------------------------------------------------------------


def answer_of(messages: Messages) -> tuple[int, Headers, bytes]:
    """(status, headers, body) of a whole answer's ASGI messages."""
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(bytes(m.get("body", b"")) for m in messages if m["type"] == "http.response.body")
    return int(start["status"]), list(start.get("headers") or []), body


def messages_of(status: int, headers: Headers, body: bytes) -> Messages:
    """A whole answer as ASGI messages (its ``content-length`` that of ``body``)."""
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    kept.append((b"content-length", str(len(body)).encode()))
    return [
        {"type": "http.response.start", "status": status, "headers": kept},
        {"type": "http.response.body", "body": body, "more_body": False},
    ]


def header(headers: Headers, name: bytes) -> str | None:
    """The value of header ``name`` (lower case), None without one."""
    return next((v.decode("latin-1") for k, v in headers if k.lower() == name), None)


def _json(headers: Headers, body: bytes) -> Any:
    """The JSON of a body (ValueError when it is not JSON)."""
    if not (header(headers, b"content-type") or "").startswith("application/json"):
        raise ValueError("not JSON")
    return json.loads(body)


def created_id(messages: Messages) -> str | None:
    """The ``sandboxID`` of a create's answer (None: it made none)."""
    status, headers, body = answer_of(messages)
    try:
        data = _json(headers, body) if status in (200, 201) else None
    except ValueError:
        return None
    sid = data.get("sandboxID") if isinstance(data, dict) else None
    return sid if isinstance(sid, str) else None


def front_tokens(messages: Messages, token_of: Callable[[str], str]) -> Messages:
    """A whole answer with each sandbox's access tokens (:data:`TOKEN_FIELDS` of a JSON
    object that has its ``sandboxID``) replaced by ``token_of(sandbox id)``; other answers
    unchanged."""
    status, headers, body = answer_of(messages)
    try:
        data = _json(headers, body)
    except ValueError:
        return messages
    changed = False

    def walk(node: Any) -> None:
        nonlocal changed
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            sid = node.get("sandboxID")
            for name in TOKEN_FIELDS:
                if isinstance(sid, str) and isinstance(node.get(name), str):
                    node[name] = token_of(sid)
                    changed = True
            for value in node.values():
                walk(value)

    walk(data)
    if not changed:
        return messages
    return messages_of(status, headers, json.dumps(data, separators=(",", ":")).encode())


# -- lists gathered from every node ----------------------------------------------------------


@dataclass(frozen=True)
class ListQuery:
    """A list request's pagination, as the front door applies it."""

    #: Items per page; None: all (E2B's v1 list has no pages).
    limit: int | None
    #: The sort key of the last item handed out before (from ``nextToken``).
    after: tuple[str, str] | None
    descending: bool


def list_query(query: bytes, *, paginated: bool) -> ListQuery:
    """The pagination of a list request's query. Raises ValueError (a ``limit`` not 1 to
    100, a ``nextToken`` not one of ours), with a message for the client."""
    params = dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True))
    descending = params.get("order", "desc") != "asc"
    if not paginated:
        return ListQuery(None, None, descending)
    try:
        limit = int(params.get("limit") or PAGE_LIMIT)
    except ValueError:
        raise ValueError(f"limit must be a number from 1 to {PAGE_LIMIT}") from None
    if not 1 <= limit <= PAGE_LIMIT:
        raise ValueError(f"limit must be a number from 1 to {PAGE_LIMIT}")
    token = params.get("nextToken")
    return ListQuery(limit, _cursor(token) if token else None, descending)


def _cursor(token: str) -> tuple[str, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        data = None
    if not (isinstance(data, list) and len(data) == 2 and all(isinstance(x, str) for x in data)):
        raise ValueError("nextToken is not one this service handed out: start the list again without it")
    return data[0], data[1]


def _token(key: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).rstrip(b"=").decode()


def node_query(query: bytes, next_token: str | None, *, paginated: bool) -> bytes:
    """The query a node is asked with: the client's filters as given; for a paginated
    list, the node's own page (``nextToken``) of the largest size."""
    params = [(k, v) for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if k not in _PAGING]
    if paginated:
        params.append(("limit", str(PAGE_LIMIT)))
        if next_token:
            params.append(("nextToken", next_token))
    return urlencode(params).encode()


_PAGING = frozenset({"limit", "nextToken"})
_EPOCH = datetime.min.replace(tzinfo=UTC)


def _started(item: Any) -> datetime:
    raw = item.get("startedAt") if isinstance(item, dict) else None
    try:
        when = datetime.fromisoformat(str(raw))
        return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):
        return _EPOCH


def _id(item: Any) -> str:
    if isinstance(item, dict):
        for name in ID_FIELDS:
            if isinstance(item.get(name), str):
                return str(item[name])
    return json.dumps(item, sort_keys=True)


def sort_key(item: Any) -> tuple[str, str]:
    """An item's place in a list: its start (UTC, ISO 8601; items without one first),
    then its id."""
    # (one fixed-width form: compared as text, in time order)
    return _started(item).isoformat(timespec="microseconds"), _id(item)


def merged_page(lists: list[list[Any]], q: ListQuery) -> tuple[list[Any], str | None]:
    """Every node's items as one list in E2B's order, the page ``q`` asks for, and the
    ``nextToken`` of the next page (None: it was the last)."""
    items = sorted((i for one in lists for i in one), key=sort_key, reverse=q.descending)
    if q.after is not None:
        after = q.after
        items = [i for i in items if (sort_key(i) < after if q.descending else sort_key(i) > after)]
    if q.limit is None or len(items) <= q.limit:
        return items, None
    page = items[: q.limit]
    return page, _token(sort_key(page[-1]))


def list_items(headers: Headers, body: bytes) -> list[Any]:
    """The items of a node's list answer. Raises ValueError when it is not a JSON array."""
    data = _json(headers, body)
    if not isinstance(data, list):
        raise ValueError("a list answer that is not a JSON array")
    return data
