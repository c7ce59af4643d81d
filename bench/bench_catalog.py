"""Tool catalog benchmark: indexing rate and FAST search latency at 1,000 and 10,000 tools.

Run: ``.venv/bin/python bench/bench_catalog.py [--queries 500] [--db memory|file]``.
Prints a markdown table. Targets (issue 6): FAST p50 <= 1 ms at 1,000 tools, indexing
>= 5,000 tools/s. Latency is measured end to end through ``Catalog.search`` (async API,
SQL, confidence and match reasons), not just the SQL statement. Columns:

- FAST p50/p99: the default path (an index of at most ``Catalog.inline_max_tools`` is
  searched on the event loop when that needs no waiting, a larger one on a thread);
- p50 thread: every search handed to the catalog's thread (``inline_max_tools = 0``);
- p50 allowed: with ``allowed_ids`` (every tool), as ``tool_search`` calls it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from worker.catalog.capabilities import make_descriptor
from worker.catalog.index import ToolDescriptor
from worker.catalog.search import Catalog

VERBS = ("send read write list create delete update fetch search convert validate deploy render query upload").split()
NOUNS = (
    "file message email channel record table bucket pod image chart report issue branch commit invoice "
    "ticket user metric log event document page schema secret cluster"
).split()
DOMAINS = "slack github postgres s3 kubernetes jira stripe grafana redis docker sentry notion".split()


def generate(n: int, seed: int = 7) -> list[ToolDescriptor]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        v, o, d = rnd.choice(VERBS), rnd.choice(NOUNS), rnd.choice(DOMAINS)
        desc = f"{v.capitalize()} a {o} in {d}; supports {rnd.choice(NOUNS)} and {rnd.choice(NOUNS)} filters"
        schema = {"type": "object", "properties": {o: {"type": "string"}, "limit": {"type": "integer"}}}
        name = f"{d}_{v}_{o}_{i}"
        out.append(make_descriptor(source="custom", name=name, description=desc, input_schema=schema))
    return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def timed(c: Catalog, qs: list[str], **kw: Any) -> list[float]:
    """Milliseconds per ``c.search`` of each query."""
    lat = []
    for q in qs:
        t0 = time.perf_counter()
        await c.search(q, **kw)
        lat.append((time.perf_counter() - t0) * 1000)
    return lat


async def run(n: int, queries: int, db: str) -> dict[str, float]:
    tools = generate(n)
    with tempfile.TemporaryDirectory() as d:
        path = ":memory:" if db == "memory" else str(Path(d) / "tools.db")
        c = Catalog.open(path)
        t0 = time.perf_counter()
        await c.index_tools("custom", tools)
        index_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        await c.index_tools("custom", tools)  # unchanged re-index (hash skip)
        reindex_s = time.perf_counter() - t0
        rnd = random.Random(1)
        qs = [f"{rnd.choice(VERBS)} {rnd.choice(NOUNS)} to {rnd.choice(DOMAINS)}" for _ in range(queries)]
        for q in qs[:20]:
            await c.search(q)  # warm-up
        lat = await timed(c, qs)
        allowed = {t.id for t in tools}
        lat_allowed = await timed(c, qs, allowed_ids=allowed)
        c.inline_max_tools = 0
        lat_thread = await timed(c, qs)
        assert c.index.integrity_check()
        await c.aclose()
    return {
        "tools": n,
        "index_rate": n / index_s,
        "reindex_rate": n / reindex_s,
        "p50": statistics.median(lat),
        "p99": pct(lat, 99),
        "qps": 1000 / statistics.mean(lat),
        "p50_thread": statistics.median(lat_thread),
        "p50_allowed": statistics.median(lat_allowed),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--db", choices=("memory", "file"), default="file")
    args = ap.parse_args()
    rows = [asyncio.run(run(n, args.queries, args.db)) for n in (1_000, 10_000)]
    print(f"SQLite FTS5 catalog, db={args.db}, {args.queries} FAST queries per size\n")
    print(
        "| tools | indexing (tools/s) | unchanged re-index (tools/s) "
        "| FAST p50 (ms) | FAST p99 (ms) | searches/s | p50 thread (ms) | p50 allowed (ms) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['tools']:,} | {r['index_rate']:,.0f} | {r['reindex_rate']:,.0f} | {r['p50']:.3f} "
            f"| {r['p99']:.3f} | {r['qps']:,.0f} | {r['p50_thread']:.3f} | {r['p50_allowed']:.3f} |"
        )


if __name__ == "__main__":
    main()
