"""Bounded state benchmark: Redis memory under session churn, and the hot paths' cost as sessions grow.

On a Redis server of its own (a fresh embedded one, so that `used_memory` is this run's alone):

1. churn: T tenants, each with a KV budget, run random operations on their sessions through
   runtime/sessions/store.py, the way the engine drives it: a new session's first turn, a next
   turn (the manifest grows: its old segments kept, new ones added), a turn written behind and
   then committed, a fork (copy on write), an eviction, a delete, and a writer that dies between
   its segments and its manifest.  Redis `used_memory` is sampled against the sum of the
   budgets; at the end, after the writers' deadline and one sweep, the bytes of segments no
   manifest names (`orphan_bytes`) and whether each tenant's account equals what its manifests
   name.  (a) the same churn on the store as it was before this issue (runtime/sessions/store.py
   at 1544736, read from git), with no gc pass during the run (its gc scanned the keyspace every
   gc_interval_s; none ran when the issue was filed): the baseline.
2. latency: N sessions (1k, then 20k) of one small segment each; the median time of a commit
   (a session's next turn) and of a delete, and the ratio between the two N; the same on the
   store before this issue (fewer samples: its delete reads every manifest).

Prints a table, then one JSON line:
{"bench": "state", "max_used_memory_over_budget": .., "orphan_bytes": .., "delete_ms_ratio": ..,
 "commit_ms_ratio": .., "cluster": {.., "passed": ..}, ...}
3. the churn and the latency rows again on a local Redis Cluster of 3 masters (the bundled
   redis-server; runtime/embedded.py EmbeddedCluster): `cluster` holds its figures and whether
   they pass the targets (no orphan, exact accounts, memory <= budgets + 10%, ratios <= 1.5).

    python bench/state.py [--quick] [--ops N] [--sessions 1000,20000] [--samples N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (bench/ too), as a script

import redis

from runtime.embedded import EmbeddedCluster, EmbeddedRedis, from_url
from runtime.errors import SetflowError
from runtime.keys import Keys
from runtime.sessions.store import Manifest, SessionStore
from runtime.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
BASELINE_COMMIT = "1544736"  # the store before this issue
FP = "0123456789abcdef"
SEGMENT = 64 * 1024  # bytes of one segment in the churn (a few slots of a small model)
TENANTS, BUDGET = 4, 8 * 2**20  # each tenant's KV budget
OPS, QUICK_OPS = 6000, 2000
SESSIONS, QUICK_SESSIONS = (1000, 20000), (1000, 5000)
SAMPLES = 200  # timed commits and deletes per N
BASELINE_SAMPLES = 10  # the store before: its delete reads every manifest (seconds at 20k sessions)


def used_memory(r: redis.Redis) -> int:
    """used_memory of the server, or the sum over a cluster's masters."""
    if isinstance(r, redis.RedisCluster):
        per_node = r.info("memory", target_nodes=redis.RedisCluster.PRIMARIES)
        return sum(int(info["used_memory"]) for info in per_node.values())
    return int(r.info("memory")["used_memory"])


# ---- the churn --------------------------------------------------------------------------------


@dataclass
class Churn:
    """One run of random operations over one store; what it measured."""

    store: Any
    new_api: bool  # put_segments(session, tenant, blobs) (this issue) or put_segments(blobs) (before)
    rng: random.Random
    live: dict[str, list[str]] = field(default_factory=dict)  # tenant -> its sessions
    ops: dict[str, int] = field(default_factory=dict)
    peak_over_budget: float = 0.0

    def put(self, session: str, tenant: str, n: int) -> list[str]:
        blobs = [secrets.token_bytes(SEGMENT) for _ in range(n)]
        return self.store.put_segments(session, tenant, blobs) if self.new_api else self.store.put_segments(blobs)

    def commit(self, m: Manifest) -> None:
        lease = self.store.acquire(m.session)
        try:
            self.store.commit(m, lease)
        finally:
            self.store.release(lease)

    def step(self) -> None:
        tenant = f"t{self.rng.randrange(TENANTS)}"
        mine = self.live.setdefault(tenant, [])
        op = self.rng.choices(["new", "turn", "behind", "fork", "evict", "delete", "crash"],
                              [3, 6, 2, 1, 1, 2, 1])[0] if mine else "new"
        self.ops[op] = self.ops.get(op, 0) + 1
        try:
            if op == "new":
                sid = secrets.token_hex(6)
                self.commit(Manifest(sid, tenant, FP, segments=self.put(sid, tenant, self.rng.randint(1, 4))))
                mine.append(sid)
                return
            sid = self.rng.choice(mine)
            m = self.store.read(sid)
            if m is None:  # evicted (over the budget) or deleted: the engine would recompute it
                if op == "delete":
                    mine.remove(sid)
                    return
                self.commit(Manifest(sid, tenant, FP, segments=self.put(sid, tenant, self.rng.randint(1, 4))))
                return
            if op == "turn":  # the manifest grows, sometimes a recompute rewrites it all
                keep = m.segments if self.rng.random() < 0.8 else []
                self.commit(replace(m, segments=keep + self.put(sid, tenant, self.rng.randint(1, 2)), behind=[]))
            elif op == "behind":  # written behind, then the turn's commit names them as segments
                lease = self.store.acquire(sid)
                try:
                    ids = self.put(sid, tenant, 1)
                    m = self.store.commit(replace(m, behind=ids), lease)
                    self.store.commit(replace(m, segments=m.segments + ids, behind=[]), lease)
                finally:
                    self.store.release(lease)
            elif op == "fork":  # at a segment boundary: the child names the parent's segments (copy on write;
                child = secrets.token_hex(6)  # on a cluster, copies in the child's slot, as store.fork writes them)
                segs = (self.store.put_segments(child, tenant, self.store.get_segments(m.segments))
                        if getattr(self.store, "cluster", False) else list(m.segments))
                lease = self.store.acquire(child)
                try:
                    self.store.commit(Manifest(child, tenant, FP, segments=segs), lease, keep=frozenset({sid}))
                finally:
                    self.store.release(lease)
                mine.append(child)
            elif op == "evict":
                self.store.evict(sid, tenant)
            elif op == "delete":
                self.store.drop(sid, tenant)
                mine.remove(sid)
            elif op == "crash":  # a writer dies between its segments and its manifest
                self.put(sid, tenant, 1)
        except SetflowError:
            pass  # over a budget with nothing to evict, say: refused, as the engine would be

    def run(self, ops: int, samples: int) -> dict[str, Any]:
        r = self.store.r
        base = used_memory(r)
        every = max(1, ops // samples)
        t0 = time.perf_counter()
        for i in range(ops):
            self.step()
            if i % every == 0:
                self.peak_over_budget = max(self.peak_over_budget, (used_memory(r) - base) / (TENANTS * BUDGET))
        return {"ops": ops, "seconds": round(time.perf_counter() - t0, 1), "by_op": dict(sorted(self.ops.items())),
                "max_used_memory_over_budget": round(self.peak_over_budget, 3),
                "used_memory_over_budget_at_end": round((used_memory(r) - base) / (TENANTS * BUDGET), 3)}


def orphans(r: redis.Redis, k: Keys) -> tuple[int, int]:
    """(segments, bytes) that no manifest names (a scan: the benchmark's, never the runtime's)."""
    named: set[str] = set()
    for key in r.scan_iter(k.manifest("*"), count=1000):
        body = r.hget(key, "body")
        if body is not None:
            m = json.loads(body)
            named.update(m["segments"], m.get("behind", []))
    n = size = 0
    for key in r.scan_iter(k.segments, count=1000):
        if k.segment_id(key) not in named:
            n += 1
            size += int(r.strlen(key))
    return n, size


def accounts_exact(store: SessionStore) -> bool:
    """Each tenant's account is the bytes its manifests name (each manifest counting its own)."""
    r, k = store.r, store.k
    named: dict[str, int] = {}
    for key in r.scan_iter(k.manifest("*"), count=1000):
        tenant, body = r.hget(key, "tenant"), r.hget(key, "body")
        if tenant is None or body is None:
            continue
        m = json.loads(body)
        size = sum(int(r.strlen(k.segment(i))) for i in m["segments"] + m.get("behind", []))
        named[tenant.decode()] = named.get(tenant.decode(), 0) + size
    got = store.tenant_bytes()
    return all(got.get(t, 0) == named.get(t, 0) for t in set(got) | set(named))


def baseline_store() -> types.ModuleType:
    """runtime/sessions/store.py as it was before this issue (from git), importable beside today's."""
    source = subprocess.run(["git", "show", f"{BASELINE_COMMIT}:runtime/sessions/store.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    spec = importlib.util.spec_from_loader("baseline_store", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    exec(compile(source, "baseline_store.py", "exec"), module.__dict__)  # noqa: S102 - our own file, from git
    return module


class _OldKeys(Keys):
    """The keys the old store asked for that today's Keys no longer names."""

    @property
    def segment_pattern(self) -> str:
        return f"{self.prefix}:seg:*"


def churn(r: redis.Redis, settings: Settings, ops: int, samples: int, baseline: bool) -> dict[str, Any]:
    s = settings.model_copy(update={"key_prefix": f"sfstate-{secrets.token_hex(4)}"})
    if baseline:
        old = baseline_store()
        store = old.SessionStore(r, s)
        store.k = _OldKeys(s.key_prefix)
    else:
        store = SessionStore(r, s)
    out = Churn(store, not baseline, random.Random(7)).run(ops, samples)
    if not baseline:
        time.sleep(2 * s.lease_ms / 1000 + 0.05)  # the dead writers' deadline
        while sum(store.sweep().values()):
            pass
        out["accounts_exact"] = accounts_exact(store)
    n, size = orphans(r, store.k)
    out.update(orphan_segments=n, orphan_bytes=size)
    for key in list(r.scan_iter(f"{s.key_prefix}:*", count=1000)):
        r.delete(key)
    return out


# ---- latency at scale -----------------------------------------------------------------------


def latency(r: redis.Redis, settings: Settings, n: int, samples: int, baseline: bool = False) -> dict[str, Any]:
    """n sessions of one small segment, under one tenant; the median ms of a commit (a next turn
    of one of them) and of a delete.  baseline: on the store as it was before this issue."""
    s = settings.model_copy(update={"key_prefix": f"sflat-{secrets.token_hex(4)}", "tenant_budget_bytes": 2**40})
    store: Any = SessionStore(r, s)
    if baseline:
        store = baseline_store().SessionStore(r, s)
        store.k = _OldKeys(s.key_prefix)

    def put(sid: str) -> list[str]:
        blob = [b"\x00" * 256]
        return store.put_segments(blob) if baseline else store.put_segments(sid, "acme", blob)

    sessions = [f"s{i}" for i in range(n)]
    for sid in sessions:
        lease = store.acquire(sid)
        store.commit(Manifest(sid, "acme", FP, segments=put(sid)), lease)
        store.release(lease)
    rng = random.Random(1)
    commit_ms, delete_ms = [], []
    for sid in rng.sample(sessions, samples):
        m = store.read(sid)
        assert m is not None
        lease = store.acquire(sid)
        ids = put(sid)
        t = time.perf_counter()
        store.commit(replace(m, segments=m.segments + ids), lease)
        commit_ms.append(1000 * (time.perf_counter() - t))
        t = time.perf_counter()
        store.drop(sid, "acme", lease)
        delete_ms.append(1000 * (time.perf_counter() - t))
        store.release(lease)
    for key in list(r.scan_iter(f"{s.key_prefix}:*", count=10000)):
        r.delete(key)
    return {"store": "before" if baseline else "now", "sessions": n, "samples": samples,
            "commit_ms": round(statistics.median(commit_ms), 3), "delete_ms": round(statistics.median(delete_ms), 3)}


def on_cluster(folder: Path, ops: int, counts: list[int], samples: int) -> dict[str, Any]:
    """The churn and the latency rows again, on a local Redis Cluster of 3 masters; passed: no
    orphan, exact accounts, used memory within the budgets + 10%, ratios <= 1.5."""
    with EmbeddedCluster(folder) as c:
        r = from_url(c.url)
        try:
            s = Settings(data_dir=folder, lease_ms=100, tenant_budget_bytes=BUDGET, session_budget_bytes=BUDGET)
            print(f"the same on a local Redis Cluster of {c.masters} masters:", flush=True)
            run = churn(r, s, ops, SAMPLES, baseline=False)
            print(f"  now     max used_memory / budgets {run['max_used_memory_over_budget']:6.3f}   at end "
                  f"{run['used_memory_over_budget_at_end']:6.3f}   orphan segments {run['orphan_segments']:5d} "
                  f"({run['orphan_bytes']} bytes)   {run['seconds']} s", flush=True)
            rows = []
            for n in counts:
                rows.append(latency(r, s, n, samples))
                print(f"  now     {n:6d} sessions: commit {rows[-1]['commit_ms']} ms, delete {rows[-1]['delete_ms']} ms "
                      f"(medians of {samples})", flush=True)
        finally:
            r.close()
    out = {"masters": c.masters, "max_used_memory_over_budget": run["max_used_memory_over_budget"],
           "orphan_bytes": run["orphan_bytes"], "accounts_exact": run["accounts_exact"],
           "delete_ms_ratio": round(rows[-1]["delete_ms"] / rows[0]["delete_ms"], 2),
           "commit_ms_ratio": round(rows[-1]["commit_ms"] / rows[0]["commit_ms"], 2), "churn": run, "latency": rows}
    out["passed"] = (out["orphan_bytes"] == 0 and out["accounts_exact"] and out["max_used_memory_over_budget"] <= 1.1
                     and out["delete_ms_ratio"] <= 1.5 and out["commit_ms_ratio"] <= 1.5)
    return out


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_OPS} churn ops, sessions 1k and 5k")
    ap.add_argument("--ops", type=int, default=None, help=f"churn operations (default {OPS})")
    ap.add_argument("--sessions", default=None, help="comma-separated session counts for the latency rows")
    ap.add_argument("--samples", type=int, default=SAMPLES, help="timed commits and deletes per session count")
    ap.add_argument("--out-json", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    ops = args.ops if args.ops is not None else (QUICK_OPS if args.quick else OPS)
    try:
        counts = [int(x) for x in (args.sessions or ",".join(map(str, QUICK_SESSIONS if args.quick else SESSIONS))
                                   ).split(",") if x]
    except ValueError:
        ap.error(f"--sessions takes comma-separated integers, got {args.sessions!r}")
    if ops < 1 or args.samples < 1 or len(counts) < 2 or min(counts) < args.samples:
        ap.error("--ops and --samples >= 1; --sessions: two or more counts, each >= --samples")
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="setflow-state-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis")
        r = redis.Redis.from_url(server.start())
        try:
            s = Settings(data_dir=Path(tmp), lease_ms=100, tenant_budget_bytes=BUDGET, session_budget_bytes=BUDGET)
            print(f"churn: {ops} operations over {TENANTS} tenants of {BUDGET // 2**20} MiB budget each, "
                  f"segments of {SEGMENT // 1024} KiB; a fresh Redis server", flush=True)
            runs = {"before": churn(r, s, ops, args.samples, baseline=True),
                    "now": churn(r, s, ops, args.samples, baseline=False)}
            for name, out in runs.items():
                print(f"  {name:6}  max used_memory / budgets {out['max_used_memory_over_budget']:6.3f}   at end "
                      f"{out['used_memory_over_budget_at_end']:6.3f}   orphan segments {out['orphan_segments']:5d} "
                      f"({out['orphan_bytes']} bytes)   {out['seconds']} s", flush=True)
            rows, before = [], []
            for n in counts:
                rows.append(latency(r, s, n, args.samples))
                before.append(latency(r, s, n, BASELINE_SAMPLES, baseline=True))
                for row in (before[-1], rows[-1]):
                    print(f"  {row['store']:6}  {row['sessions']:6d} sessions: commit {row['commit_ms']} ms, delete "
                          f"{row['delete_ms']} ms (medians of {row['samples']})", flush=True)
        finally:
            r.close()
            server.stop()
        cluster = on_cluster(Path(tmp) / "cluster", ops, counts, args.samples)
    lo, hi = rows[0], rows[-1]
    now = runs["now"]
    result = {"bench": "state", "max_used_memory_over_budget": now["max_used_memory_over_budget"],
              "orphan_bytes": now["orphan_bytes"], "accounts_exact": now["accounts_exact"],
              "delete_ms_ratio": round(hi["delete_ms"] / lo["delete_ms"], 2),
              "commit_ms_ratio": round(hi["commit_ms"] / lo["commit_ms"], 2),
              "cluster": cluster, "churn": runs, "latency": rows, "latency_before": before,
              "before": {"delete_ms_ratio": round(before[-1]["delete_ms"] / before[0]["delete_ms"], 2),
                         "commit_ms_ratio": round(before[-1]["commit_ms"] / before[0]["commit_ms"], 2)},
              "budgets": {"tenants": TENANTS, "bytes_each": BUDGET}, "wall_s": round(time.perf_counter() - t_start, 1)}
    if args.out_json is not None:
        args.out_json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
