"""Load through Celery: N concurrent sessions x M turns on two worker processes, against the same
turns run by the engine in this process.

    python bench/load.py [--quick] [--sessions N] [--turns M] [--tokens T] [--workers W]
                         [--batch B] [--torch-threads K]

--batch B: each worker process takes B jobs at once and decodes their turns in one batch
(Settings.batch_sessions; 1, the default, is one job at a time per process); --torch-threads K:
torch threads per worker process (default 1).  Two cores serve 2 processes x 1 thread, or 1
process x 2 threads: the same cores, in two layouts.

Two phases, on one Redis (REDIS_URL, else the embedded server) and a SQLite file:

1. overhead: one session at a time, each turn timed end to end by the client (submit -> the job's
   final status event -> its SQL row read back) through Celery, and the same turn by an engine in
   this process (1 torch thread, as a worker), interleaved turn by turn so that both see the same
   machine; overhead_ratio = median Celery turn / median in-process turn (128-token turns).
2. load: N client threads, each runs one session's M turns back to back; turns/s over the wall
   time, p50 and p99 turn latency, affinity hit rate (turns after a session's first that ran on
   its last worker), how each turn found its session (warm, restore, recompute), and the SQL
   transcripts checked: lost (a submitted turn missing or not succeeded), duplicated (a turn
   written twice), mismatched (tokens differ from the same turns replayed in this process).

Every turn generates exactly `--tokens` tokens (EOS ignored) with the product's narrative setting
(prefix policy, W = 8, tau = 0.99).  Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (bench/ too), as a script

import torch

from domain.payload import Metric, Payload
from model import shipped
from model.params import DecodeParams
from runtime.embedded import connect
from runtime.sessions.engine import Engine
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from workers.local import LocalCluster
from workflows.narrative import prompt_ids

QUICK = {"sessions": 4, "turns": 3, "overhead_sessions": 2}
PAYLOADS = [Payload(c, "2026-Q3", "brief", [Metric("revenue", "1240", "1105", "1300")])
            for c in ("Globex", "Initech", "Umbrella", "Hooli", "Acme", "Vandelay", "Stark", "Wayne")]


def specs(i: int, turns: int, tokens: int, tok: Any) -> list[dict[str, Any]]:
    params = {"policy": "prefix", "window": 8, "tau": 0.99, "max_new_tokens": tokens, "ignore_eos": True}
    first = {"input_ids": prompt_ids(tok, PAYLOADS[i % len(PAYLOADS)]), "params": params}
    return [first] + [{"text": "\nnarrative: ", "params": params} for _ in range(turns - 1)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


class Bench:
    def __init__(self, cluster: LocalCluster, model: Any, tok: Any) -> None:
        self.c = cluster
        self.model = model
        self.tok = tok
        self.engine = Engine(model, SessionStore(cluster.client, cluster.settings), cluster.records, cluster.settings)

    def ids(self, spec: dict[str, Any]) -> list[int]:
        return list(spec["input_ids"]) if "input_ids" in spec else self.tok.encode(spec["text"])

    def celery_turn(self, sid: str, spec: dict[str, Any]) -> tuple[float, Any]:
        t = time.perf_counter()
        job = self.c.wait(self.c.submit(sid, spec), 300)
        return time.perf_counter() - t, job

    def local_turn(self, sid: str, spec: dict[str, Any]) -> tuple[float, list[int]]:
        t = time.perf_counter()
        r = self.engine.run_turn(sid, "local", self.ids(spec), DecodeParams(**spec["params"]))
        return time.perf_counter() - t, r.tokens

    def overhead(self, n_sessions: int, turns: int, tokens: int) -> dict[str, Any]:
        cel, loc = [], []
        for i in range(n_sessions):
            a, b = self.c.open("acme"), self.engine.open("local")
            for spec in specs(i, turns, tokens, self.tok):
                dc, job = self.celery_turn(a, spec)
                dl, toks = self.local_turn(b, spec)
                if job.status != "succeeded" or job.result["tokens"] != toks:
                    raise SystemExit(f"overhead phase: job {job.id} {job.status} {job.error} or tokens differ")
                cel.append(dc)
                loc.append(dl)
        # a session's first turn prefills its prompt on both sides; the ratio is of all turns
        return {"celery_p50_ms": round(1000 * statistics.median(cel), 1),
                "inproc_p50_ms": round(1000 * statistics.median(loc), 1),
                "overhead_ratio": round(statistics.median(cel) / statistics.median(loc), 3), "turns": len(cel)}

    def load(self, n_sessions: int, turns: int, tokens: int) -> dict[str, Any]:
        sessions = [self.c.open("acme") for _ in range(n_sessions)]
        lat: list[float] = []
        jobs: dict[str, list[Any]] = {s: [] for s in sessions}
        lock = threading.Lock()

        def client(i: int, sid: str) -> None:
            for spec in specs(i, turns, tokens, self.tok):
                dt, job = self.celery_turn(sid, spec)
                with lock:
                    lat.append(dt)
                    jobs[sid].append(job)

        threads = [threading.Thread(target=client, args=(i, s)) for i, s in enumerate(sessions)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        done = [j for js in jobs.values() for j in js]
        ok = [j for j in done if j.status == "succeeded"]
        later = [j for j in ok if j.result["affinity"] != "none"]  # a session's turns after its first
        hits = sum(j.result["affinity"] == "hit" for j in later)
        paths = Counter(j.result["path"] for j in ok)
        lost = n_sessions * turns - len(ok)
        slow = max(ok, key=lambda j: (j.finished_at - j.created_at).total_seconds()) if ok else None
        if slow is not None:  # where the slowest turn spent its time
            print(f"slowest turn: job {slow.id} queued {(slow.started_at - slow.created_at).total_seconds():.2f} s, "
                  f"ran {(slow.finished_at - slow.started_at).total_seconds():.2f} s on {slow.worker} "
                  f"(attempts {slow.attempts}, path {slow.result['path']}, events {slow.result['events']})", flush=True)
        retries = sum(self.c.log(w, tail=10**8).count("transient") for w in self.c.procs)
        duplicated, mismatched = 0, 0
        for i, sid in enumerate(sessions):
            rows = self.c.records.turns(sid, "acme")
            ids = Counter(r.job_id for r in rows)
            duplicated += sum(n - 1 for n in ids.values()) + sum(r.job_id not in {j.id for j in jobs[sid]} for r in rows)
            ref = self.engine.open("local")
            for spec, job in zip(specs(i, turns, tokens, self.tok), jobs[sid]):
                _, toks = self.local_turn(ref, spec)
                mismatched += job.status != "succeeded" or job.result["tokens"] != toks
        return {"turns_per_s": round(len(ok) / wall, 2), "p50_ms": round(1000 * pct(lat, 0.5), 1),
                "p99_ms": round(1000 * pct(lat, 0.99), 1),
                "affinity_hit_rate": round(hits / len(later), 3) if later else None,
                "paths": dict(paths), "workers": dict(Counter(j.result["worker"] for j in ok)),
                "lost": lost, "duplicated": duplicated, "mismatched": mismatched, "transient_retries": retries,
                "wall_s": round(wall, 2)}


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 sessions x 3 turns, 2 sessions in the overhead phase")
    ap.add_argument("--sessions", type=int, default=12, help="concurrent sessions in the load phase (default 12)")
    ap.add_argument("--turns", type=int, default=6, help="turns per session (default 6)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per turn (default 128)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--overhead-sessions", type=int, default=4, help="sessions in the overhead phase (default 4)")
    ap.add_argument("--batch", type=int, default=1, help="jobs each worker process decodes together (default 1)")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch threads per worker process (default 1)")
    args = ap.parse_args(argv)
    if min(args.sessions, args.turns, args.tokens, args.workers, args.overhead_sessions, args.batch,
           args.torch_threads) < 1:
        ap.error("every count must be >= 1")
    sessions, turns = (QUICK["sessions"], QUICK["turns"]) if args.quick else (args.sessions, args.turns)
    over_sessions = QUICK["overhead_sessions"] if args.quick else args.overhead_sessions
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    model, tok = shipped.load()
    with tempfile.TemporaryDirectory(prefix="sfl") as tmp:
        env = Settings(data_dir=Path(tmp))
        client, server = connect(env)  # REDIS_URL, else the embedded server under tmp
        url = env.redis_url or (server.url if server else "")
        client.close()
        cluster = LocalCluster(Path(tmp), redis_url=url, key_prefix=f"sfl-{uuid.uuid4().hex[:8]}",
                               tenant_burst=10_000, tenant_rate_per_s=10_000.0, batch_sessions=args.batch,
                               torch_threads=args.torch_threads)
        try:
            names = [f"w{i + 1}" for i in range(args.workers)]
            cluster.start(*names)
            cluster.ready(*names, timeout_s=120)
            bench = Bench(cluster, model, tok)
            print(f"load benchmark: Redis {url}; {args.workers} worker processes ({args.torch_threads} torch "
                  f"threads, batch {args.batch} each); {args.tokens}-token turns", flush=True)
            over = bench.overhead(over_sessions, turns, args.tokens)
            print(f"overhead: {over['turns']} turns one at a time: Celery p50 {over['celery_p50_ms']} ms vs in-process "
                  f"{over['inproc_p50_ms']} ms: ratio {over['overhead_ratio']}", flush=True)
            load = bench.load(sessions, turns, args.tokens)
            print(f"load: {sessions} sessions x {turns} turns in {load['wall_s']} s: {load['turns_per_s']} turns/s, "
                  f"p50 {load['p50_ms']} ms, p99 {load['p99_ms']} ms, affinity hits {load['affinity_hit_rate']}, "
                  f"paths {load['paths']}, workers {load['workers']}; lost {load['lost']}, duplicated "
                  f"{load['duplicated']}, mismatched {load['mismatched']}; transient retries {load['transient_retries']}",
                  flush=True)
        finally:
            cluster.close()
            if server is not None:
                server.stop()
    result = {"bench": "load", "turns_per_s": load["turns_per_s"], "p50_ms": load["p50_ms"], "p99_ms": load["p99_ms"],
              "affinity_hit_rate": load["affinity_hit_rate"], "overhead_ratio": over["overhead_ratio"],
              "lost": load["lost"], "duplicated": load["duplicated"], "mismatched": load["mismatched"],
              "paths": load["paths"], "sessions": sessions, "turns": turns, "tokens": args.tokens,
              "workers": args.workers, "batch": args.batch, "torch_threads": args.torch_threads,
              "celery_p50_ms": over["celery_p50_ms"], "inproc_p50_ms": over["inproc_p50_ms"],
              "wall_s": round(time.perf_counter() - t_start, 1)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
