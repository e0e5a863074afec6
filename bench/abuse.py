"""An abuse soak: one tenant hammers the service while another works as usual.

    python bench/abuse.py [--quick] [--seconds S] [--workers W] [--normal-clients C] [--think-s T]
                          [--rate R] [--abuser-nice N] [--loops submit,fork,...] [--pin]
                          [--fair-window S] [--neighbour]

One stack of real parts: a redis-server of its own with a maxmemory ceiling, PostgreSQL (a
schema of its own at 127.0.0.1:5432/test; a SQLite file where none answers), `setflow serve`
and W `setflow worker` processes.  The tenants' ceilings are scaled down so that a run of
minutes reaches them (the Settings below; the same code enforces the defaults); --rate sets
both tenants' tenant_rate_per_s (burst 4x), else the product's; --fair-window sets
tenant_fair_window_s (0: no fair shares of the workers, the baseline of runtime/jobs/fairness.py);
--pin puts the workers on cores of their own and the rest (API, Redis, PostgreSQL, both clients)
on the others, the layout of a deployment whose workers have machines of their own.

1. baseline: the normal tenant alone for S seconds: C clients, each a loop of narrative, agent
   and report jobs (each followed to its end), pausing T seconds between two (0: a closed loop,
   which alone fills the machine).
2. abuse: the same, while the abuser runs at its full rate in a process of its own (at nice N:
   10 models a client on a machine of its own, whose CPU the service does not pay), each in a
   loop: submit + cancel; forks of one session; 10k-row dataset uploads; event streams opened
   and dropped; bodies past max_body_bytes; per-region schedules over a dataset of 5000
   regions, each refused; webhooks to receivers that answer `102 Processing` every 0.2 s for a
   minute (issue #48: one such receiver held every tenant's deliveries), as many endpoints as it
   may have, fed by its submit + cancel; responses whose tool schema points at a trap on loopback
   ($ref) or holds a backtracking pattern (the trap's connections: target 0); twelve copies of a
   waited-for response under one Idempotency-Key (--loops: some of them only, to tell what each
   costs).
3. drain: every job either tenant got accepted must end (none lost).

--neighbour puts a well-behaved second tenant in the abuser's place (the normal tenant's mix,
clients and pauses, under the abuser's key): what any neighbour as busy costs the normal tenant
on these cores, against which the abuser's cost reads.

Reported: the normal tenant's success rate, p50/p99 latency, the p50 of a cheap GET of its (its
jobs' listing, one row, every 0.25 s; issue #48's target: within 1.5x beside each attack), its
jobs' queue wait and run on a
worker, and its webhooks' delay (a receiver of its own in the bench: job finished -> the
job.succeeded delivery received; target: no worse beside the abuser), in both phases (p99
ratio: target <= 1.5); each part's CPU in both phases (API, workers, Redis, PostgreSQL, the
bench, the abuser's client: where the cores went); each tenant's jobs started and
worker-seconds held; the abuser's answers by status, every 5xx (target 0), Redis used memory's
peak against its maxmemory, the database's size and the abuser's SQL usage against its quotas,
and lost jobs (target 0). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402
import redis  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from app.client import ApiError, Client  # noqa: E402
from app.demo import DATA, QUESTIONS, REPORT  # noqa: E402
from app.serve import free_port  # noqa: E402
from runtime.embedded import EmbeddedRedis  # noqa: E402
from runtime.settings import Settings  # noqa: E402
from workers.local import spawn_worker, worker_env  # noqa: E402

NORMAL, ABUSER = "bench-normal-key-01", "bench-abuser-key-01"
PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MiB = 2**20
#: the ceilings under test, scaled to a run of minutes (each is a Settings field, the same for both
#: tenants: the normal one's sessions, one a job, must fit its run; the abuser's forks are
#: bounded by the same count, tests/runtime/api/test_quotas.py shows the refusal itself)
CEILINGS: dict[str, Any] = {"tenant_budget_bytes": 48 * MiB, "tenant_max_event_bytes": 8 * MiB,
                            "tenant_max_sessions": 5000, "tenant_max_turn_bytes": 64 * MiB,
                            "tenant_max_datasets": 4, "tenant_max_unfinished": 200}  # datasets: 3 + the regions one
MAXMEMORY = 256 * MiB
GET_EVERY_S = 0.25  #: the normal tenant's cheap GET (its jobs' listing), this often in each phase
#: the abuser's kinds of loop (--loops)
LOOPS = ("submit", "fork", "dataset", "stream", "oversized", "schedule", "webhook", "schema", "duplicate")
SUBMITTERS = 6  # the abuser's submit + cancel loops at once: past its rate (50/s) when the API answers fast
PROCESSING = b"HTTP/1.1 102 Processing\r\n\r\n"  # the abuser's webhook receivers write it every 0.2 s for HOLD_S
HOLD_S = 60.0
NORMAL_JOBS: list[tuple[str, dict[str, Any]]] = [
    ("narrative", {"payload": DATA}),
    ("agent", {"question": QUESTIONS[0], "max_calls": 3}),
    ("report", {**REPORT, "outline": list(REPORT["outline"])[:2]})]


def ceilings(seconds: float) -> dict[str, Any]:
    """CEILINGS for phases of `seconds`: the event-stream bytes (and the budget that counts them)
    grow with the run, 24 KiB a second, so that the normal tenant's own streams (a compacted
    one is about 4.6 KB; it keeps them 24 h) fit two phases: at 8 MiB its submissions were
    refused (`tenant_max_event_bytes`) about 10 minutes into a 600 s run, and waited out their
    Retry-After."""
    more = int(seconds) * 24 * 1024
    return {**CEILINGS, "tenant_max_event_bytes": CEILINGS["tenant_max_event_bytes"] + more,
            "tenant_budget_bytes": CEILINGS["tenant_budget_bytes"] + more}


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def epoch(at: Any) -> float:
    """A row's timestamp (a datetime from PostgreSQL, an ISO string from SQLite; naive: UTC) in epoch seconds."""
    t = at if isinstance(at, datetime) else datetime.fromisoformat(str(at))
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def seconds_between(a: str | None, b: str | None) -> float | None:
    """b - a in seconds, for two ISO timestamps of a job view (None where either is missing)."""
    if not a or not b:
        return None
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


class CpuMeter:
    """CPU seconds (user + system) each part of the stack spent between start() and stop():
    where the 2 cores went in a phase."""

    def __init__(self, parts: dict[str, list[int]]) -> None:
        self.parts = parts  # name -> pids (a worker's children are counted with it; not the bench's own)
        self.at: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        def cpu(pid: int) -> float:
            try:
                proc = psutil.Process(pid)
                procs = [proc, *(proc.children(recursive=True) if pid != os.getpid() else [])]
            except psutil.Error:
                return 0.0
            total = 0.0
            for q in procs:
                try:
                    t = q.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
            return total
        out = {name: sum(cpu(p) for p in pids) for name, pids in self.parts.items()}
        out["postgres"] = sum(sum(q.cpu_times()[:2]) for q in psutil.process_iter(["name"])
                              if q.info["name"] == "postgres")
        return out

    def start(self) -> None:
        self.at, self.wall = self._now(), time.monotonic()

    def stop(self) -> dict[str, float]:
        """Each part's CPU seconds per wall second (2.0: both cores) since start()."""
        now, wall = self._now(), time.monotonic() - self.wall
        return {k: round((now[k] - self.at.get(k, 0.0)) / wall, 3) for k in now}


@contextmanager
def database() -> Iterator[tuple[str, sa.Engine | None]]:
    """(URL, an admin engine to measure it) on a fresh PostgreSQL schema; a SQLite file if none."""
    try:
        admin = sa.create_engine(PG, connect_args={"connect_timeout": 2})
        with admin.connect():
            pass
    except Exception:  # noqa: BLE001 - no PostgreSQL here: the SQLite default
        yield "", None
        return
    schema = f"sfabuse_{uuid.uuid4().hex[:8]}"
    with admin.begin() as c:
        c.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{PG}?options=-csearch_path%3D{schema}", admin
    finally:
        with admin.begin() as c:
            c.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def pinned_postgres(cores: set[int]) -> list[int]:
    """Every running PostgreSQL process moved onto `cores` (its backends to come inherit the
    postmaster's); the pids moved, to give back.  Needs the right to (root, or its owner)."""
    moved = []
    for p in psutil.process_iter(["name"]):
        if (p.info["name"] or "").startswith("postgres"):
            with contextlib.suppress(OSError, psutil.Error):
                os.sched_setaffinity(p.pid, cores)
                moved.append(p.pid)
    return moved


def db_bytes(admin: sa.Engine | None, url: str, data_dir: Path) -> int:
    if admin is None:
        return (data_dir / "setflow.db").stat().st_size
    schema = url.rsplit("%3D", 1)[1]
    with admin.connect() as c:
        return int(c.scalar(sa.text("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s"),
                            {"s": schema}) or 0)


def worker_time(admin: sa.Engine | None, url: str, data_dir: Path, since: float, until: float
                ) -> dict[str, dict[str, Any]]:
    """Per tenant, of the jobs created in one phase (epoch seconds since -> until): the jobs a
    worker started, and the seconds they held it (started -> finished): how much of the workers
    each tenant took in that phase; and its jobs by how they ended, with the error's code (a job
    cancelled while queued never started)."""
    engine = admin or sa.create_engine(f"sqlite:///{data_dir / 'setflow.db'}")
    table = f"{url.rsplit('%3D', 1)[1]}.jobs" if admin else "jobs"
    with engine.connect() as c:
        rows = c.execute(sa.text(f"SELECT tenant, status, error, created_at, started_at, finished_at FROM {table}")).all()
    out: dict[str, dict[str, Any]] = {}
    for tenant, status, error, created, started, finished in rows:
        if not since <= epoch(created) < until:
            continue
        t = out.setdefault(tenant, {"started": 0, "held_s": 0.0, "ended": Counter()})
        code = (json.loads(error) if isinstance(error, str) else error or {}).get("code")  # JSON: text on SQLite
        how = status if code in (None, status) else f"{status} {code}"
        t["ended"][how if started else f"{how} unstarted"] += 1
        if started is None:
            continue
        t["started"] += 1
        if finished is not None:
            t["held_s"] = round(t["held_s"] + epoch(finished) - epoch(started), 2)
    return {tenant: {**t, "ended": dict(t["ended"])} for tenant, t in out.items()}


def sent_after(admin: sa.Engine | None, url: str, data_dir: Path, jobs: list[dict[str, Any]]) -> None:
    """Each of `jobs` (the slowest) gets its sent_s: how long after its row was written its
    message went to the broker (the rest of its wait: in the broker, until a worker claimed it)."""
    engine = admin or sa.create_engine(f"sqlite:///{data_dir / 'setflow.db'}")
    table = f"{url.rsplit('%3D', 1)[1]}.jobs" if admin else "jobs"
    with engine.connect() as c:
        for j in jobs:
            row = c.execute(sa.text(f"SELECT created_at, dispatched_at FROM {table} WHERE id = :id"), {"id": j["id"]}).first()
            if row is not None and row[1]:
                created = row[0] if isinstance(row[0], datetime) else datetime.fromisoformat(str(row[0]))
                j["sent_s"] = round(float(row[1]) - created.timestamp(), 3)


def beside_abuser(admin: sa.Engine | None, url: str, data_dir: Path, slowest: list[dict[str, Any]],
                  runs: list[tuple[str, float]]) -> dict[str, Any]:
    """Where the normal jobs ran against the abuser's: each of the slowest gets its worker and the
    seconds of its run that an abuser's job ran on the same worker (batched beside it) and on
    another; the normal jobs' run p50/p99 split by whether an abuser's job shared their worker
    at all (what the batch costs a job, against what the shared cores do)."""
    engine = admin or sa.create_engine(f"sqlite:///{data_dir / 'setflow.db'}")
    table = f"{url.rsplit('%3D', 1)[1]}.jobs" if admin else "jobs"
    with engine.connect() as c:
        rows = c.execute(sa.text(f"SELECT id, tenant, worker, started_at, finished_at FROM {table} "
                                 "WHERE started_at IS NOT NULL AND finished_at IS NOT NULL")).all()

    def ts(x: Any) -> float:
        return (x if isinstance(x, datetime) else datetime.fromisoformat(str(x))).timestamp()

    spans = {i: (tenant, worker, ts(a), ts(b)) for i, tenant, worker, a, b in rows}
    theirs = [v for v in spans.values() if v[0] == "abuser"]

    def overlap(job: str) -> tuple[str | None, float, float]:
        _, worker, a, b = spans[job]
        same = other = 0.0
        for _, w, x, y in theirs:
            o = max(0.0, min(b, y) - max(a, x))
            if w == worker:
                same += o
            else:
                other += o
        return worker, round(same, 2), round(other, 2)

    for j in slowest:
        if j["id"] in spans:
            j["worker"], j["abuser_same_worker_s"], j["abuser_other_worker_s"] = overlap(j["id"])
    same = {job: overlap(job)[1] for job, _ in runs if job in spans}  # each job's once
    shared = [run for job, run in runs if job in same and same[job] > 0]
    apart = [run for job, run in runs if job in same and same[job] == 0]
    return {"n": len(shared), "run_p50_s": round(pct(shared, 0.5), 2), "run_p99_s": round(pct(shared, 0.99), 2),
            "apart_n": len(apart), "apart_run_p50_s": round(pct(apart, 0.5), 2),
            "apart_run_p99_s": round(pct(apart, 0.99), 2)}


def abuser_usage(admin: sa.Engine | None, url: str, data_dir: Path) -> dict[str, int]:
    """The abuser's row of tenant_usage: the sessions and turn bytes its quotas bound."""
    engine = admin or sa.create_engine(f"sqlite:///{data_dir / 'setflow.db'}")
    table = f"{url.rsplit('%3D', 1)[1]}.tenant_usage" if admin else "tenant_usage"
    with engine.connect() as c:
        row = c.execute(sa.text(f"SELECT sessions, turn_bytes FROM {table} WHERE tenant = 'abuser'")).first()
    return {"sessions": int(row[0]), "turn_bytes": int(row[1])} if row else {}


class Stack:
    """redis-server (maxmemory), `setflow serve` and W workers as processes of their own."""

    def __init__(self, data_dir: Path, db_url: str, workers: int, pin: bool = False, **settings: Any) -> None:
        # --pin: the workers on cores of their own (the last `workers`), everything else on the
        # rest; each process inherits the bench's affinity as it is at its start
        cores = sorted(os.sched_getaffinity(0))
        self.worker_cores, self.other_cores = (set(cores[-workers:]), set(cores[:-workers])) if pin else (set(), set())
        if pin:
            os.sched_setaffinity(0, self.other_cores)
        self.redis = EmbeddedRedis(data_dir / "redis")
        url = self.redis.start()
        redis.Redis.from_url(url).config_set("maxmemory", MAXMEMORY)
        fields: dict[str, Any] = {**CEILINGS, **settings, **({"database_url": db_url} if db_url else {})}
        self.s = Settings(redis_url=url, data_dir=data_dir, key_prefix=f"sfabuse-{uuid.uuid4().hex[:6]}",
                          api_keys={NORMAL: "normal", ABUSER: "abuser"}, **fields)
        env = worker_env(self.s)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.logs = data_dir / "logs"
        self.logs.mkdir()
        with open(self.logs / "api.log", "ab") as log:
            self.api = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", self.url.rsplit(":", 1)[1]],
                                        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._up(lambda: httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200, "the API")
        if pin:
            os.sched_setaffinity(0, self.worker_cores)
        self.workers = [spawn_worker(f"ab-{i}", env, self.logs) for i in range(workers)]
        if pin:
            os.sched_setaffinity(0, self.other_cores)
        self._up(lambda: len(httpx.get(f"{self.url}/healthz", timeout=2).json()["workers"]) == workers
                 and httpx.get(f"{self.url}/v1/models", headers={"Authorization": f"Bearer {NORMAL}"},
                               timeout=2).json()["data"], "the workers and their model card")

    def _up(self, ready: Any, what: str, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"{what} did not come up: see {self.logs}")

    def stop(self) -> None:
        for p in [*self.workers, self.api]:
            if p.poll() is None:
                os.killpg(p.pid, 15)
        for p in [*self.workers, self.api]:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
        self.redis.stop()


class Tally:
    """Answers by (who, what, status), every 5xx, and the abuser's accepted job ids (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.codes: Counter[str] = Counter()
        self.errors: list[str] = []
        self.server_errors = 0  # 5xx answers, to either tenant
        self.jobs: list[str] = []

    def add(self, who: str, what: str, r: httpx.Response) -> None:
        with self.lock:
            self.codes[f"{who} {what} {r.status_code}"] += 1
            if r.status_code >= 500:
                self.server_errors += 1
                self.errors.append(f"{who} {what} {r.status_code} {r.text[:200]}")


def normal_phase(url: str, seconds: float, clients: int, tally: Tally, think_s: float = 0.0,
                 key: str = NORMAL) -> dict[str, Any]:
    """C closed-loop clients of the normal tenant (or the tenant of `key`) for `seconds`, each
    pausing think_s after a job ends: each job's latency and status."""
    lat: dict[str, list[float]] = {kind: [] for kind, _ in NORMAL_JOBS}
    waits: list[float] = []  # created -> started: in the queue and the broker
    runs: list[float] = []  # started -> finished: on a worker
    ran: list[tuple[str, float]] = []  # (id, run) of each job
    slowest: list[tuple[float, str, float | None, float | None, str]] = []  # (latency, kind, wait, run, id) of each job
    ok = failed = 0
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def client(i: int) -> None:
        nonlocal ok, failed
        with Client(url, key, rate_per_s=50.0) as c:
            n = i
            while time.monotonic() < stop:
                kind, spec = NORMAL_JOBS[n % len(NORMAL_JOBS)]
                n += 1
                time.sleep(think_s if n > i + 1 else 0.0)  # a pause after each job (not timed)
                t = time.perf_counter()
                try:
                    job = c.create_job(kind, spec)["id"]
                    done = c.wait(job, 600)
                except Exception as e:  # noqa: BLE001 - counted: a refusal or an error is a failure
                    with lock:
                        failed += 1
                        tally.server_errors += int(isinstance(e, ApiError) and e.status >= 500)
                        tally.errors.append(f"normal {kind}: {e}"[:300])
                    continue
                with lock:
                    if done["status"] == "succeeded":
                        ok += 1
                        lat[kind].append(time.perf_counter() - t)
                        wait = seconds_between(done.get("created_at"), done.get("started_at"))
                        run = seconds_between(done.get("started_at"), done.get("finished_at"))
                        if wait is not None and run is not None:
                            waits.append(wait)
                            runs.append(run)
                            ran.append((job, run))
                        slowest.append((time.perf_counter() - t, kind, wait, run, job))
                    else:
                        failed += 1
                        tally.errors.append(f"normal {kind} {done['status']}: {done.get('error')}"[:300])

    gets: list[float] = []  # a cheap GET of the tenant's (its jobs' listing, one row), every GET_EVERY_S

    def probe() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as h:
            while time.monotonic() < stop:
                t = time.perf_counter()
                r = h.get("/v1/jobs", params={"limit": 1})
                if r.status_code == 200:
                    gets.append(time.perf_counter() - t)
                else:
                    tally.errors.append(f"normal GET {r.status_code}"[:300])
                    tally.server_errors += int(r.status_code >= 500)
                time.sleep(GET_EVERY_S)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)] + [threading.Thread(target=probe)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [x for xs in lat.values() for x in xs]
    return {"jobs": ok + failed, "succeeded": ok, "success_rate": round(ok / max(1, ok + failed), 4),
            "get_p50_ms": round(1000 * pct(gets, 0.5), 1), "get_p99_ms": round(1000 * pct(gets, 0.99), 1),
            "p50_s": round(pct(every, 0.5), 2), "p99_s": round(pct(every, 0.99), 2),
            "wait_p50_s": round(pct(waits, 0.5), 2), "wait_p99_s": round(pct(waits, 0.99), 2),
            "run_p50_s": round(pct(runs, 0.5), 2), "run_p99_s": round(pct(runs, 0.99), 2),
            "by_kind": {k: {"n": len(v), "p50_s": round(pct(v, 0.5), 2), "p99_s": round(pct(v, 0.99), 2)}
                        for k, v in lat.items()},
            # the three slowest jobs: where their time went (the p99 of ~100 jobs is the second slowest)
            "slowest": [{"kind": k, "s": round(x, 2), "wait_s": w if w is None else round(w, 2),
                         "run_s": r if r is None else round(r, 2), "id": j} for x, k, w, r, j in sorted(slowest, reverse=True)[:3]],
            "_ran": ran}  # run() takes it out


async def abuser(url: str, seconds: float, max_body: int, tally: Tally, loops: set[str] | None = None,
                 max_webhooks: int = 10) -> None:
    """The abuser's loops (those named in `loops`; None: all), at its full rate, until `seconds` have passed."""
    stop = time.monotonic() + seconds
    h = {"Authorization": f"Bearer {ABUSER}"}
    narrative = {"kind": "narrative", "spec": {"payload": DATA, "params": {"max_new_tokens": 8}}}
    rows = [{"metric": f"m{i % 97}", "region": f"r{i // 97}", "period": "2026-Q3", "value": i} for i in range(10_000)]

    async def loop(what: str, act: Any) -> None:
        while time.monotonic() < stop:
            try:
                await act()
            except httpx.TransportError as e:
                with tally.lock:
                    tally.codes[f"abuser {what} {type(e).__name__}"] += 1
                await asyncio.sleep(0.05)

    async with httpx.AsyncClient(base_url=url, headers=h, timeout=30) as c:
        async def submit_cancel() -> None:
            r = await c.post("/v1/jobs", json=narrative)
            tally.add("abuser", "submit", r)
            if r.status_code == 202:
                tally.jobs.append(r.json()["id"])
                tally.add("abuser", "cancel", await c.post(f"/v1/jobs/{r.json()['id']}/cancel"))

        session: dict[str, str] = {}

        async def fork() -> None:
            if "id" not in session:  # one turn to fork at, decoded once
                r = await c.post("/v1/jobs", json=narrative)
                tally.add("abuser", "fork-seed", r)
                if r.status_code != 202:
                    await asyncio.sleep(0.5)
                    return
                tally.jobs.append(r.json()["id"])
                while (await c.get(f"/v1/jobs/{r.json()['id']}")).json()["status"] in ("queued", "running"):
                    await asyncio.sleep(0.5)
                session["id"] = r.json()["session"]
            tally.add("abuser", "fork", await c.post(f"/v1/sessions/{session['id']}/fork", json={"turn": 0}))

        n = 0

        async def upload() -> None:
            nonlocal n
            n += 1
            tally.add("abuser", "dataset", await c.put(f"/v1/datasets/d{n % 5}", json={"rows": rows}))

        async def streams() -> None:
            if not tally.jobs:
                await asyncio.sleep(0.2)
                return
            async with c.stream("GET", f"/v1/jobs/{tally.jobs[-1]}/events") as r:
                tally.add("abuser", "stream", r)
                async for _ in r.aiter_bytes():
                    break  # the first bytes, then dropped

        async def oversized() -> None:
            tally.add("abuser", "oversized", await c.post("/v1/jobs", content=b"x" * (max_body + 1),
                                                          headers={"Content-Type": "application/json"}))

        # issue #48: `per: region` over 5000 regions built each region's job before the 50-job
        # cap (17.6 s a POST, no token taken); refused now before any is built, at the tenant's rate
        per_region = {"cron": "@hourly", "template": {"kind": "narrative", "spec": {"params": {"max_new_tokens": 8}}},
                      "data": {"dataset": "regions", "per": "region"}}
        if loops is None or "schedule" in loops:  # its dataset first, before the upload loop fills the datasets
            tally.add("abuser", "schedule-seed", await c.put("/v1/datasets/regions", json={"rows": [
                {"metric": "revenue", "region": f"r{i:04d}", "period": p, "value": 1}
                for i in range(5000) for p in ("2026-Q2", "2026-Q3")]}))

        async def schedule() -> None:
            tally.add("abuser", "schedule", await c.post("/v1/schedules", json=per_region))

        slow = None
        if loops is None or "webhook" in loops:  # its endpoints, all at a receiver that never answers
            slow = await asyncio.start_server(processing, "127.0.0.1", 0)
            port = slow.sockets[0].getsockname()[1]
            for i in range(max_webhooks):
                tally.add("abuser", "webhook-seed", await c.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{port}/{i}"}))

        # issue #48: a tool's schema made a worker fetch any URL ($ref) and froze it (a pattern
        # that backtracks); refused at the door now: a trap on loopback counts what reaches it
        # (target 0 connections)
        async def trapped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with tally.lock:
                tally.codes["abuser schema fetched"] += 1
            writer.close()

        trap = await asyncio.start_server(trapped, "127.0.0.1", 0) if loops is None or "schema" in loops else None
        evil = {"type": "object", "properties": {
            "a": {"$ref": f"http://127.0.0.1:{trap.sockets[0].getsockname()[1] if trap else 9}/x.json"},
            "b": {"type": "string", "pattern": "^(.?){24}(.?){24}Z$"}}}

        async def schema() -> None:
            tally.add("abuser", "schema", await c.post("/v1/responses", json={
                "model": "small", "input": "What was churn in APAC in 2026-Q3?", "background": True,
                "tools": [{"type": "function", "name": "get", "parameters": evil}]}))
            tally.add("abuser", "schema", await c.post("/v1/responses", json={
                "model": "small", "input": "What was churn in APAC in 2026-Q3?", "background": True,
                "tools": [{"type": "function", "name": "get", "parameters": evil["properties"]["b"] | {"type": "object"}}]}))

        # issue #48: Idempotency-Key duplicates polled SQL every 50 ms for 60 s outside every limit
        dup = {"model": "small", "input": "Revenue rose in EMEA.", "max_output_tokens": 8}

        async def duplicate() -> None:
            key = f"dup-{uuid.uuid4().hex[:8]}"
            answers = await asyncio.gather(*(c.post("/v1/responses", json=dup, headers={"Idempotency-Key": key})
                                             for _ in range(12)))
            for r in answers:
                tally.add("abuser", "duplicate", r)

        every = [*[("submit", submit_cancel)] * SUBMITTERS, ("schema", schema), ("duplicate", duplicate),
                 ("fork", fork), ("dataset", upload),
                 ("stream", streams), ("stream", streams), ("oversized", oversized), ("schedule", schedule),
                 ("webhook", submit_cancel)]  # each cancel ends a job: a message to each of its endpoints
        await asyncio.gather(*(loop(w, a) for w, a in every if loops is None or w in loops))
        if slow is not None:
            slow.close()
        if trap is not None:
            trap.close()


async def processing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The abuser's webhook receiver: reads the request's head, then `102 Processing` every 0.2 s
    for HOLD_S, never a final answer."""
    try:
        await reader.readuntil(b"\r\n\r\n")
        for _ in range(int(HOLD_S / 0.2)):
            writer.write(PROCESSING)
            await writer.drain()
            await asyncio.sleep(0.2)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.CancelledError):
        pass  # the sender gave up, or the abuser's run ended
    finally:
        writer.close()


class Hooks:
    """The normal tenant's webhook receiver, in the bench: when each job's job.succeeded came."""

    def __init__(self) -> None:
        self.got: dict[str, float] = {}  # job id -> when its delivery came (epoch seconds)
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                hooks.got.setdefault(body["data"]["id"], time.time())
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def delays(self, url: str, jobs: list[str]) -> dict[str, Any]:
        """Each job's finished -> its delivery received, in seconds; `missing`: none came (yet)."""
        took, missing = [], 0
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {NORMAL}"}, timeout=30) as c:
            for job in jobs:
                finished = c.get(f"/v1/jobs/{job}").json().get("finished_at")
                if job not in self.got or not finished:
                    missing += 1
                    continue
                took.append(self.got[job] - datetime.fromisoformat(finished).timestamp())
        return {"n": len(took), "missing": missing, "p50_s": round(pct(took, 0.5), 2), "p99_s": round(pct(took, 0.99), 2),
                "max_s": round(max(took), 2) if took else float("nan")}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def drain(url: str, jobs: list[str], timeout_s: float) -> int:
    """Jobs that have not ended `timeout_s` after the phases: lost."""
    left, deadline = set(jobs), time.monotonic() + timeout_s
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ABUSER}"}, timeout=30) as c:
        while left and time.monotonic() < deadline:
            for job in list(left):
                if c.get(f"/v1/jobs/{job}").json().get("status") in ("succeeded", "failed", "cancelled"):
                    left.discard(job)
            time.sleep(1)
    return len(left)


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 s a phase, 1 worker, 1 normal client")
    ap.add_argument("--seconds", type=float, default=600.0, help="each phase's length (default 600: 10 minutes)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--normal-clients", type=int, default=2, help="the normal tenant's concurrent clients")
    ap.add_argument("--think-s", type=float, default=0.0, help="each normal client's pause after a job (0: closed loop)")
    ap.add_argument("--rate", type=float, default=None,
                    help="tenant_rate_per_s for both tenants (burst 4x); default: the product's (50/s, burst 100)")
    ap.add_argument("--abuser-nice", type=int, default=0,
                    help="the abuser's client process's niceness (10: its CPU goes to the service first, as a "
                         "client on a machine of its own; 0: it competes for the service's cores)")
    ap.add_argument("--loops", default=None, help="the abuser's loops to run, comma-separated, of "
                    f"{','.join(LOOPS)} (default: all; one alone tells what each costs the normal tenant)")
    ap.add_argument("--pin", action="store_true",
                    help="the workers on cores of their own, the API, Redis, PostgreSQL and both clients on the rest "
                         "(the layout of a deployment whose workers have their machines; needs more cores than workers)")
    ap.add_argument("--neighbour", action="store_true",
                    help="in the abuser's place, a well-behaved second tenant: the normal tenant's mix, clients "
                         "and pauses under the abuser's key (what any neighbour at that rate costs on these cores)")
    ap.add_argument("--fair-window", type=float, default=None,
                    help="tenant_fair_window_s (0: no fair shares of the workers); default: the product's")
    ap.add_argument("--abuser", metavar="URL", help=argparse.SUPPRESS)  # the abuser's own process (run())
    ap.add_argument("--max-body", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--max-webhooks", type=int, default=10, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.loops is not None and not set(args.loops.split(",")) <= set(LOOPS):
        ap.error(f"--loops: each of {', '.join(LOOPS)}")
    if args.abuser:
        tally, mine = Tally(), {}
        if args.neighbour:
            mine = normal_phase(args.abuser, args.seconds, args.normal_clients, tally, args.think_s, key=ABUSER)
            mine.pop("_ran")
        else:
            asyncio.run(abuser(args.abuser, args.seconds, args.max_body, tally,
                               None if args.loops is None else set(args.loops.split(",")), args.max_webhooks))
        print(json.dumps({"codes": tally.codes, "errors": tally.errors, "server_errors": tally.server_errors,
                          "jobs": tally.jobs, "neighbour": mine}))
        return {}
    seconds, workers, clients = (20.0, 1, 1) if args.quick else (args.seconds, args.workers, args.normal_clients)
    with tempfile.TemporaryDirectory(prefix="sfab") as d, database() as (db_url, admin):
        rate = {} if args.rate is None else {"tenant_rate_per_s": args.rate, "tenant_burst": max(1, int(4 * args.rate))}
        everywhere = os.sched_getaffinity(0)
        if args.pin and len(everywhere) <= workers:
            ap.error(f"--pin: {workers} worker(s) need more than {len(everywhere)} cores (one left for the rest)")
        fair = {} if args.fair_window is None else {"tenant_fair_window_s": args.fair_window}
        # the webhook receivers, the normal tenant's and the abuser's, listen on 127.0.0.1
        stack = Stack(Path(d), db_url, workers, pin=args.pin, webhook_allow_private=True, **ceilings(seconds), **rate,
                      **fair)
        postgres = pinned_postgres(stack.other_cores) if args.pin and admin is not None else []
        try:
            result = run(stack, seconds, clients, admin, db_url, args)
        finally:
            stack.stop()
            for pid in postgres:  # given back every core
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(pid, everywhere)
            os.sched_setaffinity(0, everywhere)
    result.update(seconds=seconds, workers=workers, normal_clients=clients, think_s=args.think_s, rate=args.rate,
                  abuser_nice=args.abuser_nice, loops="" if args.neighbour else args.loops or ",".join(LOOPS),
                  neighbour=args.neighbour, pin=args.pin,
                  fair_window_s=args.fair_window)
    print(json.dumps(result))
    return result


def run(stack: Stack, seconds: float, clients: int, admin: sa.Engine | None, db_url: str,
        args: argparse.Namespace) -> dict[str, Any]:
    r = redis.Redis.from_url(str(stack.s.redis_url))
    peak = [0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.5):
            peak[0] = max(peak[0], int(r.info("memory")["used_memory"]))

    threading.Thread(target=sample, daemon=True).start()
    tally = Tally()
    hooks = Hooks()
    httpx.post(f"{stack.url}/v1/webhooks", json={"url": hooks.url, "events": ["job.succeeded"]},
               headers={"Authorization": f"Bearer {NORMAL}"}, timeout=30).raise_for_status()
    with Client(stack.url, NORMAL) as c:  # warm every worker's engine once
        for kind, spec in NORMAL_JOBS:
            c.wait(c.create_job(kind, spec)["id"], 300)
    db_before = db_bytes(admin, db_url, stack.s.data_dir)
    assert stack.redis.proc is not None
    parts = {"api": [stack.api.pid], "workers": [w.pid for w in stack.workers], "redis": [stack.redis.proc.pid],
             "bench": [os.getpid()]}
    meter = CpuMeter(parts)
    meter.start()
    phases = [time.time()]  # the alone phase's start, then the abuser's, then its end
    alone = normal_phase(stack.url, seconds, clients, tally, args.think_s)
    alone["cpu"] = meter.stop()
    phases.append(time.time())
    # the abuser: a process of its own (its client's CPU apart from the normal tenant's, and
    # niced where asked), its answers back as JSON
    nice = args.abuser_nice
    abuse = subprocess.Popen([sys.executable, __file__, "--abuser", stack.url, "--seconds", str(seconds),
                              "--max-body", str(stack.s.max_body_bytes),
                              "--max-webhooks", str(stack.s.tenant_max_webhooks),
                              *(["--loops", args.loops] if args.loops else []),
                              *(["--neighbour", "--normal-clients", str(clients), "--think-s", str(args.think_s)]
                                if args.neighbour else [])], stdout=subprocess.PIPE,
                             preexec_fn=(lambda: os.nice(nice)) if nice else None)
    parts["abuser client"] = [abuse.pid]
    meter.start()
    beside = normal_phase(stack.url, seconds, clients, tally, args.think_s)
    beside["cpu"] = meter.stop()
    phases.append(time.time())
    told = json.loads(abuse.communicate(timeout=seconds + 120)[0])
    tally.codes.update(told["codes"])
    tally.errors += told["errors"]
    tally.server_errors += told["server_errors"]
    tally.jobs += told["jobs"]
    lost = drain(stack.url, tally.jobs, 300)
    time.sleep(2 * stack.s.webhook_timeout_s)  # the last endings' webhooks: a pass at most
    webhooks = {phase: hooks.delays(stack.url, [job for job, _ in p["_ran"]]) for phase, p in
                (("alone", alone), ("with_abuser", beside))}
    hooks.stop()
    sampling.set()
    usage = abuser_usage(admin, db_url, stack.s.data_dir)
    for phase in (alone, beside):
        sent_after(admin, db_url, stack.s.data_dir, phase["slowest"])
        phase["beside_abuser"] = beside_abuser(admin, db_url, stack.s.data_dir, phase["slowest"], phase.pop("_ran"))
    used = int(r.info("memory")["used_memory"])
    r.close()
    ratio = beside["p99_s"] / alone["p99_s"] if alone["p99_s"] else float("nan")
    get_ratio = beside["get_p50_ms"] / alone["get_p50_ms"] if alone["get_p50_ms"] else float("nan")
    out = {"bench": "abuse", "database": "postgresql" if admin else "sqlite", "alone": alone, "with_abuser": beside,
           "p99_ratio": round(ratio, 3), "get_p50_ratio": round(get_ratio, 3), "webhooks": webhooks,
           "abuser": dict(sorted(tally.codes.items())),
           "abuser_jobs": len(tally.jobs), "lost_jobs": lost, "errors_5xx": tally.server_errors,
           "errors": tally.errors[:20], "redis_peak_bytes": peak[0], "redis_used_end_bytes": used,
           "redis_maxmemory": MAXMEMORY, "db_bytes_before": db_before,
           "db_bytes_after": db_bytes(admin, db_url, stack.s.data_dir), "abuser_sql_usage": usage,
           "ceilings": {k: getattr(stack.s, k) for k in CEILINGS}, "worker_time": {
               phase: worker_time(admin, db_url, stack.s.data_dir, a, b)
               for phase, a, b in (("alone", phases[0], phases[1]), ("beside", phases[1], phases[2]))},
           **({"neighbour_tenant": told["neighbour"]} if args.neighbour else {})}
    beside_whom = "the neighbour" if args.neighbour else "the abuser"
    print(f"normal alone: {alone['success_rate']:.1%} of {alone['jobs']}, p99 {alone['p99_s']} s; with {beside_whom}: "
          f"{beside['success_rate']:.1%} of {beside['jobs']}, p99 {beside['p99_s']} s (x{ratio:.2f}); a cheap GET's "
          f"p50 {alone['get_p50_ms']} -> {beside['get_p50_ms']} ms (x{get_ratio:.2f}); "
          f"webhooks p99 {webhooks['alone']['p99_s']} s -> {webhooks['with_abuser']['p99_s']} s "
          f"({webhooks['with_abuser']['missing']} missing); 5xx {out['errors_5xx']}, lost {lost}; "
          f"Redis peak {peak[0] / MiB:.0f} MiB of {MAXMEMORY / MiB:.0f}",
          file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
