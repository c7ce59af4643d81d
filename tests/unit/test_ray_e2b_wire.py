"""E2B's API on a cluster's front door, without a cluster: the carrying rule for E2B's paths
(:mod:`worker.integrations.ray.e2brule`), and what the front door reads, merges and makes
of the nodes' answers (:mod:`worker.integrations.ray.e2bwire`): lists merged and paginated,
access tokens replaced, errors in E2B's shapes. (On the real cluster, with E2B's SDK:
tests/ray/test_ray_e2b.py.)"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

import pytest

from worker.auth import Access
from worker.integrations.ray.e2brule import e2b_carried, sandbox_in_path
from worker.integrations.ray.e2bwire import (
    PAGE_LIMIT,
    answer_of,
    created_id,
    e2b_error,
    front_tokens,
    list_items,
    list_query,
    merged_page,
    messages_of,
    node_query,
)

JSON = [(b"content-type", b"application/json")]


def test_the_rule_for_e2bs_paths() -> None:
    expected = {
        # envd's and the code interpreter's: the sandbox named by the header (or signature)
        ("POST", "/process.Process/Start"): "forward",
        ("POST", "/filesystem.Filesystem/ListDir"): "forward",
        ("GET", "/files"): "forward",
        ("POST", "/files"): "forward",
        ("GET", "/health"): "forward",
        ("POST", "/execute"): "forward",
        ("POST", "/contexts/c1/restart"): "forward",
        # the control plane under one sandbox: its node
        ("GET", "/sandboxes/i1"): "forward",
        ("DELETE", "/sandboxes/i1"): "forward",
        ("POST", "/sandboxes/i1/connect"): "forward",
        ("POST", "/v2/sandboxes/i1/connect"): "forward",
        ("POST", "/sandboxes/i1/timeout"): "forward",
        ("GET", "/v2/sandboxes/i1/logs"): "forward",
        # what spans the nodes
        ("POST", "/sandboxes"): "front",
        ("POST", "/v2/sandboxes"): "front",
        ("GET", "/sandboxes"): "front",
        ("GET", "/v2/sandboxes/"): "front",
        ("POST", "/sandboxes/i1/fork"): "refuse",
        ("GET", "/sandboxes/metrics"): "refuse",
        ("GET", "/snapshots"): "refuse",
        ("POST", "/v3/templates"): "refuse",
        ("GET", "/teams"): "refuse",
        ("PUT", "/v2/sandboxes"): "refuse",
    }
    for (method, path), decision in expected.items():
        found = e2b_carried(method, path)
        assert found is not None and found[0] == decision and found[1], (method, path, found)
    assert e2b_carried("GET", "/v1/workspaces") is None and e2b_carried("GET", "/healthz") is None
    assert sandbox_in_path("/v2/sandboxes/i1/connect") == ("i1", "connect")
    assert sandbox_in_path("/sandboxes/i1") == ("i1", "")
    assert sandbox_in_path("/sandboxes/metrics") is None and sandbox_in_path("/sandboxes") is None


def _listed(sid: str, started: str, **more: Any) -> dict[str, Any]:
    return {"sandboxID": sid, "startedAt": started, **more}


def test_lists_of_several_nodes_merge_newest_first_in_pages() -> None:
    a = [_listed("a1", "2026-01-01T00:00:01Z"), _listed("a2", "2026-01-01T00:00:04.5Z")]
    b = [_listed("b1", "2026-01-01T00:00:03+00:00"), _listed("b2", "2026-01-01T00:00:02Z")]
    c = [_listed("c1", "2026-01-01T01:00:04+01:00")]  # (04 s past midnight UTC, as a2 but earlier)
    everything = ["a2", "c1", "b1", "b2", "a1"]
    # All in one page by default; no token.
    page, token = merged_page([a, b, c], list_query(b"", paginated=True))
    assert [i["sandboxID"] for i in page] == everything and token is None
    # Pages of two: each token leads on from the last item handed out.
    seen, token = [], None
    while True:
        q = list_query(f"limit=2{'&nextToken=' + token if token else ''}".encode(), paginated=True)
        page, token = merged_page([a, b, c], q)
        seen.append([i["sandboxID"] for i in page])
        if token is None:
            break
    assert seen == [["a2", "c1"], ["b1", "b2"], ["a1"]]
    # A sandbox made or killed between two pages shifts nothing already handed out.
    _, token = merged_page([a, b, c], list_query(b"limit=2", paginated=True))
    new = [*a, _listed("a3", "2026-01-01T00:00:09Z")]
    rest, _ = merged_page([new, b[1:], c], list_query(f"limit=10&nextToken={token}".encode(), paginated=True))
    assert [i["sandboxID"] for i in rest] == ["b2", "a1"]
    # Oldest first when asked; E2B's v1 list is one page, whatever the query says.
    page, _ = merged_page([a, b, c], list_query(b"order=asc", paginated=True))
    assert [i["sandboxID"] for i in page] == everything[::-1]
    page, token = merged_page([a, b, c], list_query(b"limit=1", paginated=False))
    assert len(page) == 5 and token is None


def test_a_list_query_is_checked_and_the_nodes_asked_for_all() -> None:
    for bad in (b"limit=0", b"limit=101", b"limit=x", b"nextToken=nope", b"nextToken=bm9wZQ"):
        with pytest.raises(ValueError):
            list_query(bad, paginated=True)
    q = b"metadata=user%3Dabc%26app%3Dprod&state=running,paused&limit=5&nextToken=xyz&order=asc"
    asked = dict(parse_qsl(node_query(q, None, paginated=True).decode()))
    assert asked == {
        "metadata": "user=abc&app=prod",
        "state": "running,paused",
        "order": "asc",
        "limit": str(PAGE_LIMIT),
    }
    assert dict(parse_qsl(node_query(q, "n2", paginated=True).decode()))["nextToken"] == "n2"
    assert "limit" not in dict(parse_qsl(node_query(b"metadata=a%3Db", None, paginated=False).decode()))
    assert list_items(JSON, b"[1]") == [1]
    for headers, body in [(JSON, b"{}"), ([(b"content-type", b"text/plain")], b"[]")]:
        with pytest.raises(ValueError):
            list_items(headers, body)


def test_the_nodes_access_tokens_are_replaced_with_the_front_doors() -> None:
    front = Access("front-token")
    node = Access(None)  # (a node without a token: a key of its own process)
    sandbox = {
        "sandboxID": "i1",
        "envdAccessToken": node.envd_token("i1"),
        "trafficAccessToken": node.envd_token("i1"),
        "domain": None,
    }
    body = json.dumps({"items": [sandbox, {"sandboxID": "i2", "envdAccessToken": None}]}).encode()
    messages = messages_of(201, [*JSON, (b"x-e2b", b"1")], body)
    status, headers, out = answer_of(front_tokens(messages, front.envd_token))
    data = json.loads(out)
    assert status == 201 and (b"x-e2b", b"1") in headers
    assert data["items"][0] == {
        **sandbox,
        "envdAccessToken": front.envd_token("i1"),
        "trafficAccessToken": front.envd_token("i1"),
    }
    assert data["items"][1] == {"sandboxID": "i2", "envdAccessToken": None}
    assert dict(headers)[b"content-length"] == str(len(out)).encode()
    assert node.envd_token("i1").encode() not in out
    # An answer without a token, or not JSON, is sent as it came.
    for m in (messages_of(200, JSON, b'{"sandboxID": "i1"}'), messages_of(200, [], b"envdAccessToken")):
        assert front_tokens(m, front.envd_token) is m


def test_the_sandbox_a_create_made() -> None:
    assert created_id(messages_of(201, JSON, b'{"sandboxID": "i1", "envdAccessToken": "t"}')) == "i1"
    assert created_id(messages_of(200, JSON, b'{"sandboxID": "i1"}')) == "i1"
    for status, body in [(429, b'{"sandboxID": "i1"}'), (201, b"[]"), (201, b"{}"), (201, b"not json")]:
        assert created_id(messages_of(status, JSON, body)) is None, (status, body)


def test_errors_are_in_the_shape_e2bs_clients_read() -> None:
    r = e2b_error("/process.Process/Start", 503, "unavailable", "node lost")
    assert r.status_code == 503 and json.loads(r.body) == {"code": "unavailable", "message": "node lost"}
    r = e2b_error("/sandboxes/i1/connect", 503, "unavailable", "node lost")
    assert json.loads(r.body) == {"code": 503, "message": "node lost"}


def test_a_node_sees_none_of_the_credentials_the_front_door_judged() -> None:
    from worker.integrations.ray.nodeapp import _scope

    sent = [
        (b"x-api-key", b"front-token"),
        (b"x-access-token", b"t"),
        (b"e2b-traffic-access-token", b"t"),
        (b"e2b-sandbox-id", b"i1"),
        (b"e2b-sandbox-port", b"49999"),
    ]
    headers = _scope("POST", "/execute", b"/execute", b"", sent, "node-token")["headers"]
    assert headers == [
        (b"e2b-sandbox-id", b"i1"),
        (b"e2b-sandbox-port", b"49999"),
        (b"host", b"127.0.0.1"),
        (b"authorization", b"Bearer node-token"),
    ]
