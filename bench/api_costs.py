"""What one request of each kind costs the API process: its CPU (user + system) and wall time
per request, one client sending them one after another.

    python bench/api_costs.py [--n N]

One stack of real parts, as bench/abuse.py's (a redis-server of its own, PostgreSQL where one
answers, else SQLite; `setflow serve` and one `setflow worker`), the rate limits out of the way.
Kinds: /healthz, GET a job, submit + cancel, a 10k-row dataset upload (replacing one of 2 names:
a row of the table below is the replace's cost), a fork, an event stream opened and dropped, a
body past max_body_bytes (413).  What a tenant's rate buys of the API's cores is the rate times
these (docs/BENCHMARKS.md, "Abuse soak").  Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import psutil  # noqa: E402
from abuse import ABUSER, Stack, database  # noqa: E402

from app.demo import DATA  # noqa: E402


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="requests of each kind (uploads: a fifth of it)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sfcost") as d, database() as (db_url, _):
        stack = Stack(Path(d), db_url, 1, tenant_rate_per_s=1e6, tenant_burst=1_000_000,
                      tenant_max_unfinished=1_000_000)
        try:
            out = measure(stack, args.n)
        finally:
            stack.stop()
    for kind, row in out.items():
        print(f"{kind:>14}: {row['api_cpu_ms']:7.2f} ms of the API's CPU, {row['wall_ms']:7.2f} ms wall  {row['codes']}",
              file=sys.stderr)
    result = {"bench": "api_costs", "database": "postgresql" if db_url else "sqlite", "n": args.n, "kinds": out}
    print(json.dumps(result))
    return result


def measure(stack: Stack, n: int) -> dict[str, dict[str, Any]]:
    c = httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {ABUSER}"}, timeout=60)
    narrative = {"kind": "narrative", "spec": {"payload": DATA, "params": {"max_new_tokens": 8}}}
    rows = [{"metric": f"m{i % 97}", "region": f"r{i // 97}", "period": "2026-Q3", "value": i} for i in range(10_000)]
    seed = c.post("/v1/jobs", json=narrative).json()  # a session to fork and a job to read and follow
    while c.get(f"/v1/jobs/{seed['id']}").json()["status"] in ("queued", "running"):
        time.sleep(0.2)
    for name in ("d0", "d1"):  # uploads below replace these
        c.put(f"/v1/datasets/{name}", json={"rows": rows}).raise_for_status()
    uploads = [0]

    def submit_cancel() -> httpx.Response:
        job = c.post("/v1/jobs", json=narrative).json()["id"]
        return c.post(f"/v1/jobs/{job}/cancel")

    def upload() -> httpx.Response:
        uploads[0] += 1
        return c.put(f"/v1/datasets/d{uploads[0] % 2}", json={"rows": rows})

    def stream() -> httpx.Response:
        with c.stream("GET", f"/v1/jobs/{seed['id']}/events") as r:
            for _ in r.iter_bytes():
                break
        return r

    kinds: list[tuple[str, Callable[[], httpx.Response], int]] = [
        ("healthz", lambda: c.get("/healthz"), n),
        ("get job", lambda: c.get(f"/v1/jobs/{seed['id']}"), n),
        ("submit+cancel", submit_cancel, n),
        ("upload 10k", upload, max(2, n // 5)),
        ("fork", lambda: c.post(f"/v1/sessions/{seed['session']}/fork", json={"turn": 0}), n),
        ("stream", stream, n),
        ("oversized 413", lambda: c.post("/v1/jobs", content=b"x" * (stack.s.max_body_bytes + 1),
                                         headers={"Content-Type": "application/json"}), n)]
    out: dict[str, dict[str, Any]] = {}
    for kind, fn, count in kinds:
        codes: Counter[int] = Counter()
        cpu, wall = cpu_s(stack.api.pid), time.perf_counter()
        for _ in range(count):
            codes[fn().status_code] += 1
        out[kind] = {"api_cpu_ms": round((cpu_s(stack.api.pid) - cpu) / count * 1000, 2),
                     "wall_ms": round((time.perf_counter() - wall) / count * 1000, 2), "n": count,
                     "codes": dict(codes)}
    c.close()
    return out


if __name__ == "__main__":
    main()
