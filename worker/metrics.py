"""Prometheus metrics of one worker process (``GET /metrics``).

Each :class:`Metrics` owns its own ``CollectorRegistry`` (not the global default one), so
several apps in one process (tests, an embedded server) never collide.

::

    loom_tool_calls_total{tool, outcome}          outcome: ok | error | timeout | infra | internal
    loom_tool_call_duration_seconds{tool}         histogram
    loom_sandboxes_live                           sandboxes this process has open
    loom_sandbox_restarts_total                   sandboxes restarted after being lost
    loom_warm_sandboxes{state}                    warm sandboxes: ready | starting (absent: no pool)
    loom_warm_pool_claims_total{result}           new workspaces that found a warm sandbox (hit), found none
                                                  (miss), or could not take one (declined: gVisor, not empty)
    loom_http_rejected_total{reason}              429 busy, 401 auth, 413 too large
    loom_egress_connections_total{kind, verdict}  egress attempts: allowed | denied | limited | error
    loom_egress_bytes_total{direction}            bytes through the egress gateway: up | down
    loom_egress_secret_uses_total{secret, verdict}  secrets put in requests (allowed), placeholders not
                                                  substituted (denied: sent elsewhere), values unreadable
                                                  (error); secret: its name ("-" for a placeholder of none)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .result import ToolResult

#: Latency buckets from the sub-millisecond file calls to long shell commands.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

# Errors that mean the infrastructure failed, not the model's request (see the registry's
# error messages; the registry keeps them distinct from tool errors).
_INFRA_MARKERS = ("sandbox unavailable", "sandbox lost", "docker", "daemon", "infrastructure")


def outcome_of(result: ToolResult) -> str:
    """``ok``, ``timeout``, ``infra`` or ``error`` for one result."""
    if result.success:
        return "ok"
    data = result.data or {}
    kind = data.get("error_kind") or data.get("error_type")
    if isinstance(kind, str) and kind:
        low = kind.lower()
        if "timeout" in low:
            return "timeout"
        if "infra" in low or "unavailable" in low or "lost" in low:
            return "infra"
        if low == "internal":
            return "internal"
        return "error"
    err = (result.error or "").lower()
    if "timed out" in err or data.get("timed_out") is True:
        return "timeout"
    if any(m in err for m in _INFRA_MARKERS):
        return "infra"
    return "error"


class _SandboxCollector(Collector):
    def __init__(
        self, live: Callable[[], int], restarts: Callable[[], int], pool: Callable[[], dict[str, Any] | None]
    ) -> None:
        self._live = live
        self._restarts = restarts
        self._pool = pool

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("loom_sandboxes_live", "Sandboxes this worker has open.", value=self._live())
        yield CounterMetricFamily(
            "loom_sandbox_restarts", "Sandboxes restarted after being lost.", value=self._restarts()
        )
        pool = self._pool()
        if pool is not None:
            warm = GaugeMetricFamily("loom_warm_sandboxes", "Warm sandboxes of the pool.", labels=["state"])
            warm.add_metric(["ready"], pool.get("ready", 0))
            warm.add_metric(["starting"], pool.get("starting", 0))
            warm.add_metric(["frozen"], pool.get("frozen", 0))  # (of the ready ones: gVisor's)
            yield warm
            claims = CounterMetricFamily(
                "loom_warm_pool_claims", "New workspaces that found a warm sandbox or not.", labels=["result"]
            )
            claims.add_metric(["hit"], pool.get("claims", 0))
            claims.add_metric(["miss"], pool.get("misses", 0))
            claims.add_metric(["declined"], pool.get("declined", 0))  # gVisor: not an empty workspace
            yield claims


class Metrics:
    """The worker's metrics; ``render()`` gives the Prometheus text format."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        *,
        live: Callable[[], int] = lambda: 0,
        restarts: Callable[[], int] = lambda: 0,
        pool: Callable[[], dict[str, Any] | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.calls = Counter(
            "loom_tool_calls", "Tool calls by tool and outcome.", ["tool", "outcome"], registry=self.registry
        )
        self.latency = Histogram(
            "loom_tool_call_duration_seconds",
            "Tool call latency as seen by the service.",
            ["tool"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.rejected = Counter(
            "loom_http_rejected",
            "HTTP requests refused before reaching a tool.",
            ["reason"],
            registry=self.registry,
        )
        self.egress = Counter(
            "loom_egress_connections",
            "Egress attempts (connections, plain-HTTP requests, name lookups) by kind and verdict.",
            ["kind", "verdict"],
            registry=self.registry,
        )
        self.egress_bytes = Counter(
            "loom_egress_bytes", "Bytes through the egress gateway.", ["direction"], registry=self.registry
        )
        self.secret_uses = Counter(
            "loom_egress_secret_uses",
            "Secrets put in requests by the egress gateway, and placeholders it did not substitute, by verdict.",
            ["secret", "verdict"],
            registry=self.registry,
        )
        self.registry.register(_SandboxCollector(lambda: live(), lambda: restarts(), lambda: pool()))
        # Label children by value: ``labels()`` validates and locks on every lookup, and
        # the label values are a small bounded set (tool names x outcomes).
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def observe(self, tool: str, result: ToolResult, seconds: float) -> str:
        """Count one call; returns its outcome label."""
        outcome = outcome_of(result)
        # Callers map unknown tool names (they come from clients) to one label value, so
        # a client cannot grow the metric's cardinality without bound.
        children = self._children.get((tool, outcome))
        if children is None:
            children = self._children[(tool, outcome)] = (
                self.calls.labels(tool=tool, outcome=outcome),
                self.latency.labels(tool=tool),
            )
        children[0].inc()
        children[1].observe(seconds)
        return outcome

    def observe_egress(self, record: Any) -> None:
        """Count one egress attempt (a :class:`worker.egress.log.EgressRecord`). A secret's
        name is a label (the operator's names, at most 64 per scope); a placeholder of no
        secret counts under "-", so a sandbox cannot grow the metric's labels."""
        if record.kind == "secret":
            self.secret_uses.labels(secret=record.secret or "-", verdict=record.verdict).inc()
            return
        self.egress.labels(kind=record.kind, verdict=record.verdict).inc()
        if record.bytes_up:
            self.egress_bytes.labels(direction="up").inc(record.bytes_up)
        if record.bytes_down:
            self.egress_bytes.labels(direction="down").inc(record.bytes_down)

    def render(self) -> bytes:
        return generate_latest(self.registry)
