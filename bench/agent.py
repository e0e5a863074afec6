"""Agent sessions with client-side tools: the time from a tool output's POST to the job's next
committed set, by how the resumed job found its session (warm, restored, recomputed), against a
full prefill of the conversation so far on a new session.

    python bench/agent.py [--quick] [--sessions N] [--earlier 0,4] [--delay S] [--threads K]

Two `setflow worker` processes (w1, w2) on one Redis (REDIS_URL, else 127.0.0.1:6379 when it
answers, else the embedded server) and a SQLite file in a temporary folder.  Each session is an
agent job (`client_tools: ["metric"]`) asking how a metric changed from 2026-Q2 to 2026-Q3 (the
shipped model answers with two metric calls, then a calc it runs itself).  At each call the job
waits (requires_action); the client sleeps --delay seconds, then answers with a number from its
own dataset, through Dispatcher.answer (what POST /v1/jobs/{id}/tool_outputs calls).  Timed:
from just before the answer to the "t" of the first step event the job publishes after it (its
next committed set, stamped by the worker).  Each session's resumes are forced down one path:

- warm:      answered as is: the session's last worker is alive and free, the job goes to its
             own queue and finds the session in memory;
- restore:   the session's last worker is set to the other worker first (routing.touch): the job
             goes there, which does not hold it, and restores it from Redis;
- recompute: the session's Redis state is evicted first (SessionStore.evict) and the other worker
             touched: the job recomputes it from SQL (one prefill of its ledger).

History: a session may first hold --earlier agent conversations (the server runs their tools;
each starts its own document, [BOS]), so that the state a resume finds is long: 0 (the measured
conversation alone: about 80 tokens at its calls) and 4 (about 750 tokens; the shipped model's
context is 2048).  A row of figures per (earlier, path).

Each resumed turn's path is read back from its SQL row (meta["path"]); a turn whose path is not
the intended one is reported (`mismatched`) and not counted in the row's figures.

Baseline (full prefill): for each resume, a `turn` job on a NEW session whose one input is the
conversation so far (the token ids SQL holds for the job's committed turns, then the result's
ids), with the agent's decode setting (8 new tokens: its first set is what is timed); from just
before its submission to its first step event.  What a runtime without cached state pays.

Where the time goes, per row (medians): dispatch (the answer, or the submission, to the job's
"running" status event: SQL, the broker, the worker's claim), replay (from there to the last
progress event before the resumed turn: the job's committed turns replayed from SQL, the
answered call recorded; 0 for the baseline), and the resumed turn's load as its job reports it
(load_ms: warm, restore or recompute; of the last resume of each session only, whose attempt's
result is kept); the rest is the prefill of the result (or, for the baseline, of everything)
and the first decode step.

Exactness: each session's final result (text, answer, calls) against an uninterrupted run of the
same session in this process (LocalTurns: the earlier conversations, then the question with the
client's outputs given up front).  The measured job allows an unverified answer (flagged, not
failed), so that a wrong answer is a difference to report, not a crash.  A job that ends with no
answer fails ("no_answer", allow_unverified or not): its session is counted not identical (and
in its row's `no_answer`), its resumes timed as any; an earlier conversation without an answer is
history all the same (its turns stay in the session).

Sessions run one at a time (the paths interleaved), so that no resume queues behind another job.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ beside its helpers, as a script too

from bench.machine import find_redis, group_rss_mb, used_memory
from bench.stats import med, pct
from domain.agent_facts import AgentFacts, source_names
from domain.payload import METRIC
from domain.tools import END_CALL, END_RESULT, RESULT, SAMPLE_NAMES, Dataset, ToolError
from model import shipped
from model.profiles import Profile
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import NoAnswer
from runtime.jobs.specs import AgentSpec
from runtime.sessions.local import LocalTurns
from runtime.sessions.store import SessionStore
from runtime.tables import JobRecord
from workers.local import LocalCluster
from workflows import agent

PATHS = ("warm", "restore", "recompute")
QUICK = {"sessions": 3}  # per path
TENANT = "acme"
#: (metric, region) of each session's question, in turn
TOPICS = [(m, r) for r in ("EMEA", "APAC", "AMER", "LATAM", "Nordics", "DACH")
          for m in ("revenue", "churn", "orders", "conversion", "tickets", "latency")]
CLIENT_DATA = Dataset(777)  # the client's own warehouse, not the spec's sample dataset
#: the names the client's metric tool knows (AgentSpec.names): its data is the sample's
CLIENT_NAMES = sorted({n for field in SAMPLE_NAMES for n in field})
BASELINE_TOKENS = 8  # the baseline turn's new tokens: its first set is what is timed


def question(i: int) -> str:
    metric, region = TOPICS[i % len(TOPICS)]
    return f"By how much did {METRIC[metric][1].lower()} in {region} change from 2026-Q2 to 2026-Q3, in percent?"


def earlier_spec(i: int, k: int) -> dict[str, Any]:
    """The k-th earlier question of session i: answered with the server's own tools (a flagged
    answer is kept: it is history, not a result)."""
    return {"question": question(i + 7 * (k + 1)), "allow_unverified": True}


def client_metric(call: dict[str, Any]) -> str:
    """What the client's metric tool answers, as the tools write numbers (or an error)."""
    try:
        return CLIENT_DATA.lookup(*call["arguments"].values())
    except (ToolError, TypeError) as e:
        return f"error: {e}"


def no_answer(j: JobRecord) -> bool:
    """The job failed with no answer (workflows/agent.py NoAnswer): the model's, not the bench's."""
    return j.status == "failed" and (j.error or {}).get("code") == NoAnswer.code


class Bench:
    def __init__(self, cluster: LocalCluster, model: SetDLM, tok: Tokenizer, delay_s: float) -> None:
        self.c = cluster
        self.model = model
        self.tok = tok
        self.delay_s = delay_s
        self.store = SessionStore(cluster.client, cluster.settings)
        self.events = cluster.dispatcher.events
        self.routing = cluster.dispatcher.routing
        self.workers = list(cluster.procs)

    # ---- timing helpers -----------------------------------------------------------------------

    def last_event(self, job_id: str) -> str:
        got = self.events.read(job_id, "0")
        return got[-1][0] if got else "0"

    def first_step_t(self, job_id: str, after: str, turn: int, timeout_s: float = 60.0
                     ) -> tuple[float, float, float] | None:
        """After stream id `after`: when the job started running on a worker (its "running"
        status event), when it had replayed its committed turns (the last progress event before
        the first step: a replayed turn publishes one, and nothing else does before the step
        events; the start when there is none), both as their stream ids' milliseconds (Redis's
        clock, this machine's), and the "t" of its first step event of job step `turn` (its
        first committed set).  None: the job stopped (ended, with no answer too, or waits again)
        before it decoded that step."""
        deadline = time.monotonic() + timeout_s
        t_run = t_replayed = float("nan")
        while time.monotonic() < deadline:
            for eid, ev in self.events.read(job_id, after, block_ms=1000):
                after = eid
                if ev.get("type") == "status" and ev.get("status") == "running":
                    t_run = t_replayed = int(eid.split("-")[0]) / 1000
                if ev.get("type") == "progress" and t_run == t_run:  # not NaN: after the start
                    t_replayed = int(eid.split("-")[0]) / 1000
                if ev.get("type") == "step" and ev.get("turn") == turn:
                    return t_run, t_replayed, float(ev["t"])
                if ev.get("type") == "status" and ev.get("status") in ("failed", "cancelled"):
                    if (ev.get("error") or {}).get("code") != NoAnswer.code:
                        raise RuntimeError(f"job {job_id} {ev.get('status')}: {ev.get('error')}")
                    return None  # it ended with no answer, as a question may
                if ev.get("type") == "status" and ev.get("status") in ("succeeded", "requires_action"):
                    return None
        j = self.c.jobs.get(job_id)
        raise RuntimeError(f"job {job_id}: no step event of step {turn} within {timeout_s} s; it is {j.status} "
                           f"({j.error}, worker {j.worker}, queue {j.queue!r})\n{self.logs()}")

    def wait(self, job_id: str) -> JobRecord:
        """The job once it waits for its client or has ended: succeeded, or failed with no answer."""
        j = self.c.wait(job_id, 120)
        if j.status not in ("requires_action", "succeeded") and not no_answer(j):
            raise RuntimeError(f"job {j.id} {j.status}: {j.error}\n{self.logs()}")
        return j

    def logs(self) -> str:
        return "\n".join(f"--- {w}\n{self.c.log(w)}" for w in self.workers)

    # ---- one session ----------------------------------------------------------------------------

    def session(self, i: int, path: str, earlier: int) -> dict[str, Any]:
        """`earlier` agent conversations (tools run by the server), then one agent job whose
        client runs the metric tool, its resumes forced down `path`; each resume timed, then the
        baselines and the exactness check."""
        sid = self.c.open(TENANT)
        before_specs = [earlier_spec(i, k) for k in range(earlier)]
        for spec in before_specs:  # the session's history: earlier questions, each a document
            done = self.c.wait(self.c.dispatcher.submit("agent", TENANT, spec, sid), 120)
            if done.status != "succeeded" and not no_answer(done):
                raise RuntimeError(f"earlier job {done.id} {done.status}: {done.error}\n{self.logs()}")
        # the client declares the names its data knows: those of the question enter the model as slots
        spec = {"question": question(i), "client_tools": ["metric"], "names": CLIENT_NAMES, "allow_unverified": True}
        # the client's outputs as the model reads them (slots, taken in turn after the question's names)
        facts = (AgentFacts.of(spec["question"], source_names(spec["question"], CLIENT_NAMES))
                 if Profile.for_model(self.model.cfg, self.tok).facts == "slots" else None)
        read: dict[str, str] = {}
        job = self.c.dispatcher.submit("agent", TENANT, spec, sid)
        j = self.wait(job.id)
        outputs: dict[str, str] = {}
        resumes: list[dict[str, Any]] = []
        while j.status == "requires_action":
            resume, j = self.resume(sid, j, path, facts, outputs, read)
            resumes.append(resume)
        self.check_paths(sid, j, path, resumes, read)
        # the last resume's load time, as the job's result reports it (its earlier resumes' ended
        # at a call: those attempts' results are not kept)
        decoded = [t for t in (j.result or {}).get("turns", []) if t["path"] != "done"]
        load_ms = (decoded[0]["load_ms"] if decoded and resumes and decoded[0]["turn"] == resumes[-1]["index"]
                   else None)
        identical = self.identical(before_specs, spec, outputs, j)
        nbytes = (m.nbytes if (m := self.store.read(sid)) is not None else 0)
        return {"session": sid, "job": job.id, "path": path, "earlier": earlier, "status": j.status, "resumes": resumes,
                "identical": identical, "load_ms": load_ms, "kv_bytes": nbytes,
                "answer": (j.result or {}).get("answer"), "no_answer": no_answer(j)}

    def resume(self, sid: str, j: JobRecord, path: str, facts: AgentFacts | None, outputs: dict[str, str],
               read: dict[str, str]) -> tuple[dict[str, Any], JobRecord]:
        """The client answers the calls job `j` waits for, its resume forced down `path`, timed:
        the resume's record, and the job once it waits again or has ended.  outputs and read gain
        the answers, as the client gave them and as the model reads them."""
        assert j.action is not None and j.worker is not None
        # the job step the resume decodes: after this job's committed turns
        step = sum(r.job_id == j.id for r in self.c.records.turns(sid, TENANT))
        answer = {c["id"]: client_metric(c) for c in j.action["calls"]}
        outputs.update(answer)
        read.update({c: facts.result(x) if facts is not None else x for c, x in answer.items()})
        time.sleep(self.delay_s)  # the client's tool at work
        before = j.worker
        other = next(w for w in self.workers if w != before)
        evicted = None
        if path == "recompute":
            evicted = self.store.evict(sid, TENANT)
        if path in ("restore", "recompute"):
            self.routing.touch(sid, other)
        after = self.last_event(j.id)
        t0 = time.time()
        self.c.dispatcher.answer(j.id, TENANT, answer)
        times = self.first_step_t(j.id, after, step)
        j = self.wait(j.id)
        return {"step": step, "ms": None if times is None else 1000 * (times[2] - t0),
                "dispatch_ms": None if times is None else 1000 * (times[0] - t0),
                "replay_ms": None if times is None else 1000 * (times[1] - times[0]),
                "calls": list(answer), "from": before, "to": j.worker, "evicted": evicted}, j

    def check_paths(self, sid: str, j: JobRecord, path: str, resumes: list[dict[str, Any]], read: dict[str, str]) -> None:
        """Each resume of job `j` (ended, or waiting) as SQL holds it: the path its turn took (ok:
        `path`, and timed), its turn index, and its baseline over the inputs SQL holds."""
        rows = self.c.records.turns(sid, TENANT)
        by_step = {r.job_step: r for r in rows if r.job_id == j.id}
        for r in resumes:
            row = by_step.get(r["step"])
            r["actual"] = row.meta.get("path") if row is not None else (
                f"none (no turn decoded: the job ended, {(j.result or {}).get('reason') or (j.error or {}).get('code')})")
            r["ok"] = r["actual"] == path and r["ms"] is not None
            result_ids = self.tok.encode("".join(f"{RESULT}{read[c]}{END_RESULT}\n"
                                                 for c in r["calls"]))
            resumed = row.index if row is not None else len(rows)
            r["index"] = resumed  # the session's turn index of the resumed turn
            history = [t for x in rows if x.index < resumed for t in x.token_ids]
            if row is not None and list(row.token_ids[:len(result_ids)]) != result_ids:
                r["ok"] = False  # the resumed turn's input is not the result as encoded here
                r["actual"] = f"{r['actual']} (input differs)"
            r["history_tokens"] = len(history) + len(result_ids)
            r["baseline_ms"], r["baseline_dispatch_ms"] = self.baseline(history + result_ids) if r["ok"] else (None, None)

    def baseline(self, ids: list[int]) -> tuple[float, float]:
        """ms from submitting a turn job of `ids` on a new session to its first committed set,
        and to its start on a worker."""
        params = AgentSpec(question="x").params.model_dump()  # the agent's own decode setting
        params["max_new_tokens"] = BASELINE_TOKENS
        params["stop"] = [*params["stop"], Profile.markup(self.tok, END_CALL)]
        sid = self.c.open(TENANT)
        t0 = time.time()
        job = self.c.submit(sid, {"input_ids": ids, "params": params}, TENANT)
        times = self.first_step_t(job.id, "0", 0)
        done = self.c.wait(job, 120)
        if done.status != "succeeded" or times is None:
            raise RuntimeError(f"baseline job {done.id} {done.status}: {done.error}")
        return 1000 * (times[2] - t0), 1000 * (times[0] - t0)

    def identical(self, before: list[dict[str, Any]], spec: dict[str, Any], outputs: dict[str, str],
                  j: JobRecord) -> bool:
        """The job's final result against the same session run uninterrupted in this process
        (the earlier conversations, then the question with the client's outputs up front).  A job
        without an answer has no result to compare: not identical."""
        if j.status != "succeeded" or j.result is None:
            return False
        turns = LocalTurns(self.model, self.tok, tool_outputs=outputs)
        for b in before:
            try:
                agent.run(turns, AgentSpec.model_validate(b))
            except NoAnswer:  # history all the same: its turns stay in the session, as the job's did
                pass
        try:
            want = agent.run(turns, AgentSpec.model_validate(spec))
        except NoAnswer:
            return False
        got = j.result
        return bool((got["text"], got["answer"], got["calls"]) == (want["text"], want["answer"], want["calls"]))


def summarise(sessions: list[dict[str, Any]], earlier: list[int]) -> list[dict[str, Any]]:
    """A row per (earlier conversations, path): only the resumes whose SQL path is the intended
    one are in its figures; the others are listed (`mismatched`)."""
    rows = []
    for e in earlier:
        for path in PATHS:
            mine = [s for s in sessions if s["path"] == path and s["earlier"] == e]
            resumes = [r for s in mine for r in s["resumes"]]
            ok = [r for r in resumes if r["ok"]]
            ms = [r["ms"] for r in ok]
            base = [r["baseline_ms"] for r in ok]
            p50, b50 = med(ms), med(base)
            rows.append({
                "path": path, "earlier": e, "n": len(ok), "p50_ms": p50,
                "p90_ms": round(pct(ms, 0.9), 1) if ms else None,
                "full_prefill_p50_ms": b50,
                "ratio": round(b50 / p50, 3) if p50 and b50 else None,
                "dispatch_p50_ms": med([r["dispatch_ms"] for r in ok]),
                "full_prefill_dispatch_p50_ms": med([r["baseline_dispatch_ms"] for r in ok]),
                "replay_p50_ms": med([r["replay_ms"] for r in ok]),
                "load_p50_ms": med([s["load_ms"] for s in mine if s["load_ms"] is not None], 3),
                "history_tokens_p50": med([float(r["history_tokens"]) for r in ok], 0),
                "identical": bool(mine) and all(s["identical"] for s in mine),
                "no_answer": sum(s["no_answer"] for s in mine),  # sessions whose job failed with no answer
                "paths_verified": bool(resumes) and len(ok) == len(resumes),
                "mismatched": [{"session": s["session"], "step": r["step"], "actual": r["actual"],
                                "from": r["from"], "to": r["to"]}
                               for s in mine for r in s["resumes"] if not r["ok"]],
                "sessions": len(mine), "resumes": len(resumes),
                "workers_used": sorted({r["to"] for r in resumes if r["to"]}),
            })
    return rows


def counts(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of counts, got {text!r}") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"counts >= 0, got {text!r}")
    return out


def parse(argv: list[str] | None, prog: str | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK['sessions']} sessions per path and history (< 2 min)")
    ap.add_argument("--sessions", type=int, default=8, help="sessions per path and history (default 8)")
    ap.add_argument("--earlier", type=counts, default=[0, 4],
                    help="earlier agent conversations on each session before the measured one, one row "
                         "set per count (default 0,4: about 80 and 750 tokens of history at the calls)")
    ap.add_argument("--delay", type=float, default=0.5, help="seconds the client takes to answer a call (default 0.5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in this process (default 1, as a worker)")
    args = ap.parse_args(argv)
    if args.sessions < 1 or args.threads < 1 or args.delay < 0:
        ap.error("--sessions and --threads must be >= 1, --delay >= 0")
    if max(args.earlier) > 8:
        ap.error("--earlier: at most 8 (about 180 tokens each; the shipped model's context is 2048 tokens)")
    return args


def measure(earlier: list[int], per_path: int, delay_s: float) -> dict[str, Any]:
    """Two worker processes on one Redis: `per_path` sessions per path and count of `earlier`
    conversations, the paths interleaved; Redis's used memory before and after, the workers' RSS."""
    model, tok = shipped.load()
    with tempfile.TemporaryDirectory(prefix="sfa") as tmp:
        url, server = find_redis(Path(tmp))
        cluster = LocalCluster(Path(tmp), redis_url=url, key_prefix=f"sfa-{uuid.uuid4().hex[:8]}",
                               tenant_burst=10_000, tenant_rate_per_s=10_000.0)
        try:
            cluster.start("w1", "w2")
            cluster.ready("w1", "w2", timeout_s=120)
            mem_before = used_memory(cluster.client)
            bench = Bench(cluster, model, tok, delay_s)
            print(f"agent benchmark: Redis {url}; 2 worker processes; {per_path} sessions per path and history "
                  f"(earlier conversations: {earlier}); client delay {delay_s} s", flush=True)
            sessions = []
            for e in earlier:
                for i in range(per_path * len(PATHS)):  # the paths interleaved
                    s = bench.session(i, PATHS[i % len(PATHS)], e)
                    sessions.append(s)
                    print(f"  {s['path']:>9} +{e} session {s['session'][:8]}: "
                          + ", ".join(f"{r['ms']:.1f} ms ({r['actual']} on {r['to']}) vs full {r['baseline_ms']:.1f} ms"
                                      if r["ok"] else f"NOT {s['path']}: {r['actual']} on {r['to']}"
                                      for r in s["resumes"])
                          + f"; identical {s['identical']}" + (" (no answer)" if s["no_answer"] else ""), flush=True)
            mem_after = used_memory(cluster.client)
            rss = {w: group_rss_mb(p.pid) for w, p in cluster.procs.items()}
        finally:
            cluster.close()
            if server is not None:
                server.stop()
    return {"sessions": sessions, "redis": url, "mem_before": mem_before, "mem_after": mem_after, "rss": rss}


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'path':>9} {'earlier':>7} {'hist tok':>8} {'n':>3} {'p50 ms':>7} {'p90 ms':>7} {'full p50':>8} "
          f"{'ratio':>6} {'disp ms':>7} {'full disp':>9} {'replay':>6} {'load ms':>7} {'identical':>9} {'verified':>8}")
    for r in rows:
        print(f"{r['path']:>9} {r['earlier']:>7} {r['history_tokens_p50']!s:>8} {r['n']:>3} {r['p50_ms']!s:>7} "
              f"{r['p90_ms']!s:>7} {r['full_prefill_p50_ms']!s:>8} {r['ratio']!s:>6} {r['dispatch_p50_ms']!s:>7} "
              f"{r['full_prefill_dispatch_p50_ms']!s:>9} {r['replay_p50_ms']!s:>6} {r['load_p50_ms']!s:>7} "
              f"{r['identical']!s:>9} "
              f"{r['paths_verified']!s:>8}")
        for m in r["mismatched"]:
            print(f"    NOT {r['path']}: session {m['session']} step {m['step']} ran as {m['actual']} "
                  f"({m['from']} -> {m['to']})")


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    args = parse(argv, prog)
    per_path = QUICK["sessions"] if args.quick else args.sessions
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    run = measure(args.earlier, per_path, args.delay)
    sessions = run["sessions"]
    rows = summarise(sessions, args.earlier)
    print_rows(rows)
    print(f"Redis used_memory {run['mem_before']} -> {run['mem_after']} bytes; worker RSS MB {run['rss']}", flush=True)
    result = {"bench": "agent", "delay_s": args.delay, "sessions_per_path": per_path, "earlier": args.earlier,
              "workers": 2, "redis": run["redis"], "redis_used_memory_before": run["mem_before"],
              "redis_used_memory_after": run["mem_after"],
              "kv_bytes_per_session_p50": statistics.median([s["kv_bytes"] for s in sessions]),
              "worker_rss_mb": run["rss"], "rows": rows, "wall_s": round(time.perf_counter() - t_start, 1)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
