"""Schedules at scale: N schedules firing each minute over M simulated minutes; how late each tick
is submitted (p50/p99; target p99 <= 1 s), duplicates (target 0) and missed ticks (target 0).

    python bench/schedules.py [--quick] [--schedules N] [--minutes M] [--tickers K] [--database-url URL]

Real SQL (a SQLite file, or --database-url: PostgreSQL) and Redis (REDIS_URL, else the embedded
server); no worker: the jobs' send does nothing (they stay queued, counted in SQL).  N schedules
("* * * * *", UTC) over N/20 tenants, each a narrative with its payload in the spec; K tickers
(threads of this process running Ticker.run, as K workers would: one leads, the others stand by)
share a clock the bench drives: before each minute mark it is set LEAD_IN_S before the mark and
then runs with real time, so the leader sleeps until the mark as in production, and a tick's
lateness (its late_s: submitted, its jobs queued in SQL and the tick recorded, minus its time) is
real time.  `admitted`: the end of the pass's last admission to the broker (each tenant's jobs
up to its share; Ticker admits after it records the ticks), minus the mark.  Once every tick of
the minute is submitted and the admissions are done (or after a minute of real time) the clock
moves on to the next mark.
Duplicates: jobs beyond the first of a (schedule, tick); missed: ticks of the marks with no job.
A report's render (HTML and PDF) per section is bench/exports.py's (docs/BENCHMARKS.md).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
from sqlalchemy import Engine, func, select  # noqa: E402

from runtime.db import make_engine  # noqa: E402
from runtime.embedded import EmbeddedRedis  # noqa: E402
from runtime.jobs.dispatch import Dispatcher  # noqa: E402
from runtime.jobs.rows import Jobs  # noqa: E402
from runtime.schedules.crud import Schedules  # noqa: E402
from runtime.schedules.ticker import Ticker  # noqa: E402
from runtime.settings import Settings  # noqa: E402
from runtime.tables import JobRecord, TickRecord  # noqa: E402

BASE = 1_800_000_000.0  # the simulated start (a whole minute)
LEAD_IN_S = 1.5  # the clock is set this long before each mark
PER_TENANT = 20  # schedules a tenant
SPEC = {"payload": {"tenant": "Northwind", "period": "2026-Q3",
                    "metrics": [{"key": "revenue", "value": "1240", "prev": "1105"},
                                {"key": "churn", "value": "2.4", "prev": "2.6"}]},
        "params": {"max_new_tokens": 32}}
RENDER = "render per section (HTML, PDF): bench/exports.py, docs/BENCHMARKS.md 'Report exports'"


class Clock:
    """Real time plus an offset the bench sets."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def set(self, t: float) -> None:
        self.offset = t - time.time()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="40 schedules, 2 minutes")
    ap.add_argument("--schedules", type=int, default=1000, help="schedules (default 1000)")
    ap.add_argument("--minutes", type=int, default=10, help="simulated minutes (default 10)")
    ap.add_argument("--tickers", type=int, default=3, help="tickers racing for the lead (default 3)")
    ap.add_argument("--database-url", default=None, help="SQL (default: a SQLite file in a temporary folder)")
    args = ap.parse_args(argv)
    n, minutes = (40, 2) if args.quick else (args.schedules, args.minutes)
    if min(n, minutes, args.tickers) < 1:
        ap.error("--schedules, --minutes and --tickers are >= 1")
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sfsch") as d:
        server = None if os.environ.get("REDIS_URL") else EmbeddedRedis(Path(d) / "redis")
        url = os.environ["REDIS_URL"] if server is None else server.start()
        s = Settings(data_dir=Path(d), database_url=args.database_url, redis_url=url,
                     key_prefix=f"sfbsch-{uuid.uuid4().hex[:8]}")
        r = redis.Redis.from_url(url)
        try:
            result = _run(s, r, n, minutes, args.tickers)
        finally:
            for key in r.scan_iter(f"{s.key_prefix}:*", count=1000):
                r.delete(key)
            r.close()
            if server is not None:
                server.stop()
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(result))
    return result


def _run(s: Settings, r: redis.Redis, n: int, minutes: int, k: int) -> dict[str, Any]:
    engine, clock = make_engine(s), Clock()
    clock.set(BASE)
    store = Schedules(engine, s, clock)
    ids = [store.create(f"tenant-{i // PER_TENANT}", cron_expr="* * * * *", timezone="UTC", kind="narrative",
                        spec=SPEC).id for i in range(n)]
    jobs = Jobs(engine, s)
    tickers = [Ticker(Dispatcher(r, jobs, lambda *_: None), clock, name=f"bench-{i}") for i in range(k)]
    admitted: list[float] = []  # the clock at the end of each admission of the tickers' passes
    for t in tickers:
        admit = t.d.admit_quietly

        def timed(tenant: str, admit: Any = admit) -> None:
            admit(tenant)
            admitted.append(clock())

        t.d.admit_quietly = timed  # type: ignore[method-assign]
    stop = threading.Event()
    threads = [threading.Thread(target=t.run, args=(stop,), daemon=True) for t in tickers]
    for t in threads:
        t.start()
    print(f"{n} schedules ('* * * * *') over {-(-n // PER_TENANT)} tenants, {minutes} simulated minutes, "
          f"{k} tickers; SQL {engine.dialect.name}", file=sys.stderr)
    print(f"{'minute':>6} {'ticks':>6} {'p50 s':>7} {'p99 s':>7} {'max s':>7} {'wall s':>7} {'admitted s':>10}",
          file=sys.stderr)
    late: list[float] = []
    rows = []
    try:
        for m in range(1, minutes + 1):
            mark = BASE + 60 * m
            clock.set(mark - LEAD_IN_S)
            t0 = time.perf_counter()
            while _submitted(engine, mark) < n and time.perf_counter() - t0 < 60 + LEAD_IN_S:
                time.sleep(0.05)
            wall = time.perf_counter() - t0 - LEAD_IN_S
            seen, quiet = len(admitted), time.perf_counter()
            while time.perf_counter() - quiet < 0.3 and time.perf_counter() - t0 < 70:  # the pass's admissions,
                time.sleep(0.05)  # which follow its ticks' record: until none came for 0.3 s
                if len(admitted) != seen:
                    seen, quiet = len(admitted), time.perf_counter()
            mine = _late(engine, mark)
            late += mine
            after = max((a - mark for a in admitted if mark <= a < mark + 60), default=None)
            rows.append({"minute": m, "ticks": len(mine), "p50_s": round(pct(mine, 0.5), 3) if mine else None,
                         "p99_s": round(pct(mine, 0.99), 3) if mine else None, "wall_s": round(wall, 2),
                         "admitted_s": None if after is None else round(after, 3)})
            print(f"{m:6d} {len(mine):6d} {pct(mine, 0.5) if mine else 0:7.3f} {pct(mine, 0.99) if mine else 0:7.3f} "
                  f"{max(mine) if mine else 0:7.3f} {wall:7.2f} {after or 0:10.3f}", file=sys.stderr)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    duplicates, missed = _counts(engine, ids, [BASE + 60 * m for m in range(1, minutes + 1)])
    engine.dispose()
    out = {"bench": "schedules", "schedules": n, "minutes": minutes, "tickers": k, "sql": engine.dialect.name,
           "ticks": len(late), "late_p50_s": round(pct(late, 0.5), 3) if late else None,
           "late_p99_s": round(pct(late, 0.99), 3) if late else None, "late_max_s": round(max(late), 3) if late else None,
           "ticks_per_s": round(len(late) / sum(x["wall_s"] for x in rows), 1) if rows else None,
           "admitted_max_s": max((x["admitted_s"] for x in rows if x["admitted_s"] is not None), default=None),
           "duplicates": duplicates, "missed": missed,
           "target_met": bool(late) and pct(late, 0.99) <= 1.0 and duplicates == 0 and missed == 0,
           "per_minute": rows, "render": RENDER}
    print(f"late p50 {out['late_p50_s']} s, p99 {out['late_p99_s']} s (target <= 1 s), {out['ticks_per_s']} ticks/s; "
          f"duplicates {duplicates}, missed {missed}; median minute {statistics.median(x['wall_s'] for x in rows):.2f} s; "
          f"{RENDER}", file=sys.stderr)
    return out


def _submitted(engine: Engine, mark: float) -> int:
    with engine.connect() as c:
        return int(c.scalar(select(func.count()).select_from(TickRecord).where(
            TickRecord.tick_at == mark, TickRecord.status == "submitted")) or 0)


def _late(engine: Engine, mark: float) -> list[float]:
    with engine.connect() as c:
        return [float(x) for x in c.scalars(select(TickRecord.late_s).where(TickRecord.tick_at == mark,
                                                                             TickRecord.status == "submitted"))]


def _counts(engine: Engine, ids: list[str], marks: list[float]) -> tuple[int, int]:
    """(duplicates, missed) over the marks: jobs beyond one per (schedule, tick), and (schedule,
    tick) pairs with none."""
    with engine.connect() as c:
        per = {(sch, t): int(k) for sch, t, k in c.execute(
            select(JobRecord.schedule_id, JobRecord.tick_at, func.count()).where(JobRecord.schedule_id.is_not(None))
            .group_by(JobRecord.schedule_id, JobRecord.tick_at))}
    duplicates = sum(k - 1 for k in per.values() if k > 1)
    missed = sum(1 for sch in ids for t in marks if per.get((sch, t), 0) == 0)
    return duplicates, missed


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
