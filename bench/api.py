"""Narratives through the HTTP API, against the same jobs submitted to the same workers without
it (runtime/jobs/dispatch.py, what the API calls).

    python bench/api.py [--quick] [--jobs N] [--concurrency C]

One stack (app/demo.py Stack: the embedded Redis unless REDIS_URL, a SQLite file, the API on
a thread, two worker processes of one torch thread each), then two phases:

1. overhead: narrative jobs one at a time, each payload twice: through HTTP (the sync client:
   POST /v1/jobs, then its server-sent events to the result) and direct (Dispatcher.submit,
   then wait on the job's events and row), which goes first alternating; api_ratio = median
   HTTP job / median direct job, end to end; added_ms_p50 = the median of the per-payload
   differences (robust to the payloads' different lengths).
2. volume: N narrative jobs from C concurrent clients (asyncio, the async client with its own
   rate limit off); jobs/s over the wall time, p50 and p99 latency, and every result checked
   (facts read back equal the payload's).

Each narrative is a different dashboard payload (held-out seeds), greedy, the narrative setting.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from app.client import AsyncClient, Client  # noqa: E402
from app.demo import Stack  # noqa: E402
from domain.draws import make_payload
from runtime.db import make_engine  # noqa: E402
from runtime.jobs.dispatch import Dispatcher  # noqa: E402
from runtime.jobs.rows import Jobs  # noqa: E402
from runtime.settings import Settings  # noqa: E402
from workers.celery_app import make_app, sender  # noqa: E402

KEY = "bench-api-key-0001"
SEED = 70_000  # held out


def payloads(n: int) -> list[dict[str, Any]]:
    rng, out = random.Random(SEED), []
    while len(out) < n:
        p = make_payload(rng)
        if p.breakdown is None:  # short dashboards: the high-volume case
            out.append({"tenant": "Northwind", "period": p.period, "style": p.style,
                        "metrics": [{"key": m.key, "value": m.value, "prev": m.prev,
                                     **({"target": m.target} if m.target else {})} for m in p.metrics]})
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 payloads one at a time, 12 jobs at volume")
    ap.add_argument("--overhead-jobs", type=int, default=20, help="payloads in the overhead phase, each both ways")
    ap.add_argument("--jobs", type=int, default=60, help="jobs in the volume phase (default 60)")
    ap.add_argument("--concurrency", type=int, default=12, help="concurrent clients in the volume phase")
    args = ap.parse_args(argv)
    if min(args.overhead_jobs, args.jobs, args.concurrency) < 1:
        ap.error("every count must be >= 1")
    n_over, n_vol = (4, 12) if args.quick else (args.overhead_jobs, args.jobs)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sfapi") as d:
        s = Settings(data_dir=Path(d), key_prefix=f"sfbapi-{uuid.uuid4().hex[:8]}", api_keys={KEY: "bench"},
                     api_port=0, tenant_burst=10_000, tenant_rate_per_s=10_000.0, max_streams_per_tenant=1000)
        stack = Stack(s, workers=2).start()
        try:
            result = _run(stack, n_over, n_vol, args.concurrency)
        finally:
            stack.stop()
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(result))
    return result


def _run(stack: Stack, n_over: int, n_vol: int, concurrency: int) -> dict[str, Any]:
    s = stack.s
    sql = make_engine(s)
    r = redis.Redis.from_url(str(s.redis_url))
    celery = make_app(s)
    direct = Dispatcher(r, Jobs(sql, s), sender(celery))
    specs = [{"payload": p} for p in payloads(n_over + n_vol + 2)]
    http_ms: list[float] = []
    direct_ms: list[float] = []
    with Client(stack.api.url, KEY) as c:
        for spec in specs[:2]:  # warm both workers' engines
            c.wait(c.create_job("narrative", spec)["id"], 120)
        for i, spec in enumerate(specs[2:2 + n_over]):  # each payload both ways, which goes first alternating
            for way in (("http", "direct") if i % 2 == 0 else ("direct", "http")):
                t = time.perf_counter()
                if way == "http":
                    ok = c.wait(c.create_job("narrative", spec)["id"], 120)["status"] == "succeeded"
                    http_ms.append(1000 * (time.perf_counter() - t))
                else:
                    job = direct.submit("narrative", "bench", spec, open_session=True)
                    ok = direct.wait(job.id, 120).status == "succeeded"
                    direct_ms.append(1000 * (time.perf_counter() - t))
                assert ok, f"job {i} ({way}) did not succeed"
    vol = asyncio.run(_volume(stack.api.url, specs[2 + n_over:], concurrency))
    celery.close()
    r.close()
    sql.dispose()
    http_p50, direct_p50 = statistics.median(http_ms), statistics.median(direct_ms)
    added = statistics.median(h - d for h, d in zip(http_ms, direct_ms))  # paired: the same payload both ways
    print(f"overhead: HTTP p50 {http_p50:.1f} ms, direct p50 {direct_p50:.1f} ms, ratio {http_p50 / direct_p50:.3f}, "
          f"added per job (paired median) {added:.1f} ms; "
          f"volume: {vol['jobs_per_s']} jobs/s, p50 {vol['p50_ms']} ms, p99 {vol['p99_ms']} ms, "
          f"facts correct {vol['correct']}/{vol['jobs']}", file=sys.stderr)
    return {"bench": "api", "http_p50_ms": round(http_p50, 1), "direct_p50_ms": round(direct_p50, 1),
            "api_ratio": round(http_p50 / direct_p50, 3), "added_ms_p50": round(added, 1),
            "overhead_jobs": len(http_ms) + len(direct_ms), **vol}


async def _volume(url: str, specs: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for spec in specs:
        queue.put_nowait(spec)
    latencies: list[float] = []
    correct = failed = 0

    async def client() -> None:
        nonlocal correct, failed
        async with AsyncClient(url, KEY, rate_per_s=1000.0) as c:
            while not queue.empty():
                spec = queue.get_nowait()
                t = time.perf_counter()
                done = await c.wait((await c.create_job("narrative", spec, priority="batch"))["id"], 300)
                latencies.append(1000 * (time.perf_counter() - t))
                if done["status"] != "succeeded":
                    failed += 1
                elif done["result"]["facts_ok"] == done["result"]["facts_total"]:
                    correct += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"jobs": len(specs), "concurrency": concurrency, "jobs_per_s": round(len(specs) / wall, 2),
            "p50_ms": round(pct(latencies, 0.5), 1), "p99_ms": round(pct(latencies, 0.99), 1),
            "correct": correct, "failed": failed}


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
