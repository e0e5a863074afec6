"""A conversation through OpenAI's Responses API with state (previous_response_id), against the
same conversation through the native API, and against a stateless client that re-sends its whole
history every turn.

    python bench/responses.py [--quick] [--turns N] [--repeats R] [--max-output-tokens T] [--eos]
    python bench/responses.py --tools [--quick] [--calls C] [--repeats R]

One stack (app/demo.py Stack: the embedded Redis unless REDIS_URL, a SQLite file, the API on a
thread of this process, one worker process of one torch thread), then R conversations of N user
messages each way, the three ways in lockstep (turn k of each, in an order that rotates), so
that drift on a noisy machine hits every way alike:

- sdk:       the official `openai` SDK, `responses.create(input=<the new message>,
             previous_response_id=<the last response>)`: the session's K/V goes on (warm on the
             worker, else restored from Redis); each turn prefills its new message only;
- native:    POST /v1/sessions (timed with the first turn), then per message a turn job
             (POST /v1/sessions/{id}/turns, its text the message + "\\n", what a text response
             reads) waited for on its event stream (app/client.py Client.wait);
- stateless: the SDK with no previous_response_id; the input is the whole history (every
             earlier user message and the model's answer to it, as user and assistant message
             items, then the new message): each request runs on a new session and prefills it
             all, what a server without state makes a client do.

Every turn's message is a short line of business text (LINES, one per turn, the same sequence on
every repeat).  Decoding is greedy AR (policy ar, W 1) to exactly --max-output-tokens (16)
tokens (setflow's ignore_eos, on the native turns too), so that the decode is small and the same
on every turn and the prefill or the restore makes the difference: the shipped model ends most of
these answers at EOS after 2 tokens and others run to the limit, 2 to 16 tokens, up to 14 decode
steps (about 60 ms here) apart, which swamps the prefill's share (--eos: let them end so).  (A
text response also keeps the model off its fact slots, NoSlots; a native turn does not, so
their answers differ.)

Timed: the wall clock around the HTTP call(s) of a turn, from this process.  Per way and turn:
the median time over the repeats, the tokens the turn prefilled (setflow's prefill_tokens; the
native turn's input, from its SQL row) and those it found cached, the tokens it wrote, each
turn's path (new, warm, restore, recompute), load_ms and decode_ms as its job reports them.

The issue's targets, reported (never asserted): with state, turn N takes <= 1.2x turn 1 (sdk and
native); the Responses route adds <= 10% to the native route (the median over every (repeat,
turn) of sdk / native).  Memory: Redis used_memory after the warm-up and at the end, the
worker's RSS now and its peak (VmHWM, summed over its process group).  Ends with one JSON line.

--tools: a chain of C client tool calls (20: OpenAI's WebSocket mode is for loops of 20 and
more) over one WebSocket (the SDK's responses.connect(), each turn a response.create frame with
previous_response_id and the new items only) against the same chain over HTTP (responses.create
per response, the SDK's pooled connection), R chains each way, the order alternating.  The
chain: TOOL_QUESTION with one lookup function, each call answered from the sample dataset, the
question asked again after each answer until C calls are made (two a question).  Timed: the
wall clock around a whole chain, the socket's opening included.  Both ways must say the same.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402

from app.client import Client  # noqa: E402
from app.demo import Stack  # noqa: E402
from domain.tools import Dataset  # noqa: E402
from runtime.db import make_engine  # noqa: E402
from runtime.embedded import from_url  # noqa: E402
from runtime.sessions.records import Records  # noqa: E402
from runtime.sessions.store import SessionStore  # noqa: E402
from runtime.settings import Settings  # noqa: E402

KEY = "bench-responses-key-01"
TENANT = "bench"
MODEL = "small"
WAYS = ("sdk", "native", "stateless")
QUICK = {"turns": 5, "repeats": 2}
GROWTH_MAX = 1.2  # with state, turn N / turn 1 at most (the target)
ROUTE_MAX = 1.10  # the Responses route over the native one, at most (the target)
#: each turn's user message, in turn (the same sequence on every repeat)
LINES = ["Revenue in EMEA rose 4% in Q3.", "Churn in APAC fell to 2.1% in Q3.",
         "Orders in AMER grew 7% over Q2.", "Conversion in LATAM held at 3.2%.",
         "Support tickets in DACH dropped 12%.", "Latency in the Nordics fell to 180 ms.",
         "Revenue in APAC missed its target by 2%.", "Churn in EMEA rose to 2.6% in Q3.",
         "Orders in LATAM fell 5% after the price change.", "Conversion in AMER rose to 4.1%.",
         "Tickets in APAC rose 9% with the new release.", "Revenue in DACH grew 6% over Q2.",
         "Latency in AMER held at 190 ms.", "Churn in the Nordics fell to 1.8%.",
         "Orders in EMEA beat the forecast by 3%.", "Conversion in APAC slipped to 2.7%.",
         "Revenue in LATAM rose 11% in Q3.", "Tickets in EMEA fell 4% after the fix.",
         "Latency in APAC rose to 240 ms.", "Revenue in AMER reached 427 in Q3."]
EXT = {"policy": "ar", "window": 1, "tau": None}  # greedy AR: one token a step
TOOL_QUESTION = "By how much did revenue in EMEA change from 2026-Q2 to 2026-Q3, in percent?"
LOOKUP: dict[str, Any] = {"type": "function", "name": "get_kpi", "description": "a KPI's value in a market and quarter",
                          "parameters": {"type": "object", "required": ["kpi", "market", "quarter"],
                                         "properties": {"kpi": {"type": "string"}, "market": {"type": "string"},
                                                        "quarter": {"type": "string"}}}}
TOOL_WAYS = ("socket", "http")
TOOLS_QUICK = {"calls": 20, "repeats": 2}


def expected(way: str, k: int) -> str:
    """The path turn k (from 0) should take: a stateless request, and every first turn, starts a
    new session; a stateful turn after it finds its session warm on the one worker."""
    return "new" if way == "stateless" or k == 0 else "warm"


class Conversation:
    """One conversation one way: its turns' figures, in order."""

    def __init__(self, way: str) -> None:
        self.way = way
        self.turns: list[dict[str, Any]] = []
        self.prev: str | None = None  # sdk: the last response's id
        self.session: str | None = None  # native: its session
        self.history: list[dict[str, str]] = []  # stateless: the items so far


class Bench:
    def __init__(self, stack: Stack, max_out: int, eos: bool) -> None:
        self.stack = stack
        self.max_out = max_out
        self.ext = {**EXT, "ignore_eos": not eos}  # not eos: every answer max_out tokens, its decode fixed
        self.sdk = openai.OpenAI(api_key=KEY, base_url=stack.api.url + "/v1", max_retries=0, timeout=120)
        self.native = Client(stack.api.url, KEY, rate_per_s=1000.0)
        self.sql = make_engine(stack.s)
        self.records = Records(self.sql)

    def close(self) -> None:
        self.sdk.close()
        self.native.close()
        self.sql.dispose()

    def turn(self, conv: Conversation, text: str) -> None:
        """The conversation's next turn, timed around its HTTP call(s)."""
        getattr(self, f"_{conv.way}")(conv, text)

    def _response(self, **kw: Any) -> tuple[Any, float]:
        t = time.perf_counter()
        r = self.sdk.responses.create(model=MODEL, max_output_tokens=self.max_out,
                                      extra_body={"setflow": self.ext}, **kw)
        return r, 1000 * (time.perf_counter() - t)

    def _record(self, conv: Conversation, r: Any, ms: float) -> None:
        sf = r.model_extra["setflow"]
        if r.status not in ("completed", "incomplete"):
            raise RuntimeError(f"response {r.id} ({conv.way}) is {r.status}: {r.error}")
        [t] = sf["turns"]  # a text response: one turn
        usage = r.usage
        conv.turns.append({"ms": ms, "status": r.status, "text": r.output_text, "path": t["path"],
                           "load_ms": t["load_ms"], "decode_ms": t["decode_ms"], "output_tokens": t["tokens"],
                           "prefill": sf.get("prefill_tokens"),
                           "cached": usage.input_tokens_details.cached_tokens if usage else None,
                           "input": usage.input_tokens if usage else None, "session": sf["session"]})

    def _sdk(self, conv: Conversation, text: str) -> None:
        r, ms = self._response(input=text, **({"previous_response_id": conv.prev} if conv.prev else {}))
        conv.prev = r.id
        self._record(conv, r, ms)

    def _stateless(self, conv: Conversation, text: str) -> None:
        items = [*conv.history, {"role": "user", "content": text}]
        r, ms = self._response(input=items)
        conv.history = [*items, {"role": "assistant", "content": r.output_text}]
        self._record(conv, r, ms)

    def _native(self, conv: Conversation, text: str) -> None:
        t = time.perf_counter()
        if conv.session is None:  # its first turn: the session is made with it, as a response's is
            conv.session = self.native.create_session()["id"]
        job = self.native.turn(conv.session, text=text + "\n", params={**self.ext, "max_new_tokens": self.max_out})
        done = self.native.wait(job["id"], 120)
        ms = 1000 * (time.perf_counter() - t)
        if done["status"] != "succeeded":
            raise RuntimeError(f"native turn job {job['id']} is {done['status']}: {done.get('error')}")
        res = done.get("result") or {}
        costs = res.get("costs", {})
        conv.turns.append({"ms": ms, "status": done["status"], "text": res.get("text", ""), "path": res.get("path"),
                           "load_ms": round(1000 * costs.get("load_s", 0.0), 3),
                           "decode_ms": round(1000 * costs.get("decode_s", 0.0), 3),
                           "output_tokens": len(res.get("tokens", [])), "session": conv.session,
                           "turn_index": res.get("turn")})

    def native_tokens(self, conv: Conversation) -> None:
        """The native turns' prefill (each row's input) and cached (the session's length before
        it), as SQL holds them (read after the run: not timed)."""
        assert conv.session is not None
        rows = {r.index: r for r in self.records.turns(conv.session, TENANT)}
        held = 0
        for t in conv.turns:
            row = rows.get(t["turn_index"])
            n_in = int((row.meta or {}).get("n_input", 0)) if row is not None else 0
            t.update(prefill=n_in, cached=held, input=held + n_in)
            held += len(row.token_ids) if row is not None else 0


def med(xs: list[float], nd: int = 1) -> float | None:
    return round(statistics.median(xs), nd) if xs else None


def imed(xs: list[int]) -> int:
    return round(statistics.median(xs))


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def summarise(convs: list[Conversation], n_turns: int) -> dict[str, Any]:
    """Per way and turn index: medians over the repeats; the paths seen."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for way in WAYS:
        mine = [c for c in convs if c.way == way]
        rows[way] = []
        for k in range(n_turns):
            ts = [c.turns[k] for c in mine]
            rows[way].append({
                "turn": k + 1, "ms_p50": med([t["ms"] for t in ts]),
                "prefill": imed([t["prefill"] for t in ts]), "cached": imed([t["cached"] for t in ts]),
                "load_ms_p50": med([t["load_ms"] for t in ts], 3),
                "decode_ms_p50": med([t["decode_ms"] for t in ts], 1),
                "worker_ms_p50": med([t["load_ms"] + t["decode_ms"] for t in ts], 1),
                "output_tokens": imed([t["output_tokens"] for t in ts]),
                "paths": sorted({str(t["path"]) for t in ts})})
    return rows


def tool_chain(sdk: openai.OpenAI, socket: bool, calls: int) -> dict[str, Any]:
    """One chain of `calls` tool calls (--tools), over a socket or HTTP: its wall time and what it said."""
    data, said, prev = Dataset(2026), [], None  # the worker's sample dataset's values
    inp: str | list[dict[str, Any]] = TOOL_QUESTION
    made = 0
    t = time.perf_counter()
    conn = sdk.responses.connect().enter() if socket else None
    try:
        while True:
            kw: dict[str, Any] = {"model": MODEL, "input": inp, "tools": [LOOKUP],
                                  **({"previous_response_id": prev} if prev else {})}
            if conn is None:
                r = sdk.responses.create(**kw)
            else:
                conn.response.create(**kw)
                r = next(ev for ev in conn if ev.type in ("response.completed", "response.incomplete",
                                                           "response.failed", "error"))
                if r.type == "error":
                    raise RuntimeError(f"socket: {r.error}")
                r = r.response
            if r.status != "completed":
                raise RuntimeError(f"response {r.id} ({'socket' if socket else 'http'}) is {r.status}: {r.error}")
            prev, item = r.id, r.output[0]
            if item.type == "function_call":
                a, made = json.loads(item.arguments), made + 1
                said.append(item.arguments)
                inp = [{"type": "function_call_output", "call_id": item.call_id,
                        "output": data.lookup(a["kpi"], a["market"], a["quarter"])}]
            else:
                said.append(r.output_text)
                if made >= calls:
                    break
                inp = TOOL_QUESTION
    finally:
        if conn is not None:
            conn.close()
    return {"ms": 1000 * (time.perf_counter() - t), "responses": len(said), "calls": made, "said": said}


def tools(stack: Stack, calls: int, repeats: int) -> dict[str, Any]:
    """--tools: R chains each way, the order alternating, after one short chain each way (warm-up)."""
    sdk = openai.OpenAI(api_key=KEY, base_url=stack.api.url + "/v1", max_retries=0, timeout=120)
    try:
        for way in TOOL_WAYS:
            tool_chain(sdk, way == "socket", 2)
        print(f"responses benchmark, tools: 1 worker; {repeats} chains of {calls} tool calls per way", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {w: [] for w in TOOL_WAYS}
        for rep in range(repeats):
            for way in TOOL_WAYS[::1 if rep % 2 == 0 else -1]:
                runs[way].append(tool_chain(sdk, way == "socket", calls))
            print(f"  repeat {rep + 1}: " + "; ".join(f"{w} {runs[w][-1]['ms']:.0f} ms" for w in TOOL_WAYS), flush=True)
    finally:
        sdk.close()
    ms = {w: med([x["ms"] for x in runs[w]]) for w in TOOL_WAYS}
    n = runs["http"][0]["responses"]
    same = all(x["said"] == runs["http"][0]["said"] for w in TOOL_WAYS for x in runs[w])
    out = {"bench": "responses", "mode": "tools", "calls": calls, "repeats": repeats, "workers": 1,
           "responses_per_chain": n, "chain_ms_p50": ms, "ms_per_response_p50": {w: round(ms[w] / n, 1) for w in ms},
           "socket_over_http_p50": ratio(ms["socket"], ms["http"]), "same_output": same}
    print(f"chain of {calls} tool calls ({n} responses), median: socket {ms['socket']} ms, http {ms['http']} ms; "
          f"socket / http {out['socket_over_http_p50']}; both ways said the same: {same}", flush=True)
    return out


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK['turns']} turns, {QUICK['repeats']} repeats (the test runs this)")
    ap.add_argument("--turns", type=int, default=20, help=f"user messages per conversation (default 20, at most {len(LINES)})")
    ap.add_argument("--repeats", type=int, default=5, help="conversations per way (default 5)")
    ap.add_argument("--max-output-tokens", type=int, default=16, help="tokens each answer has (default 16)")
    ap.add_argument("--eos", action="store_true", help="answers end at EOS (at most --max-output-tokens): their "
                                                        "decode then differs from turn to turn")
    ap.add_argument("--tools", action="store_true", help="a chain of tool calls over a WebSocket against over HTTP")
    ap.add_argument("--calls", type=int, default=20, help="--tools: tool calls per chain (default 20, even)")
    args = ap.parse_args(argv)
    if args.tools and (args.calls < 2 or args.calls % 2 or args.repeats < 1):
        ap.error("--calls: an even number >= 2 (two lookups a question); --repeats >= 1")
    if min(args.turns, args.repeats, args.max_output_tokens) < 1 or args.turns > len(LINES):
        ap.error(f"--turns in [1, {len(LINES)}], --repeats and --max-output-tokens >= 1")
    n_turns, repeats = (QUICK["turns"], QUICK["repeats"]) if args.quick else (args.turns, args.repeats)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sfresp") as d:
        prefix = f"sfbresp-{uuid.uuid4().hex[:8]}"
        s = Settings(data_dir=Path(d), key_prefix=prefix, api_keys={KEY: TENANT}, api_port=0,
                     tenant_burst=10_000, tenant_rate_per_s=10_000.0, max_streams_per_tenant=1000)
        stack = Stack(s, workers=1).start()
        try:
            if args.tools:
                result = tools(stack, TOOLS_QUICK["calls"] if args.quick else args.calls,
                               TOOLS_QUICK["repeats"] if args.quick else args.repeats)
            else:
                result = _run(stack, n_turns, repeats, args.max_output_tokens, args.eos)
        finally:
            external = stack.redis_server is None
            stack.stop()
            if external:  # a shared server: this run's keys go
                _delete_keys(str(stack.s.redis_url), prefix)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(result))
    return result


def _run(stack: Stack, n_turns: int, repeats: int, max_out: int, eos: bool) -> dict[str, Any]:
    r = from_url(str(stack.s.redis_url))
    bench = Bench(stack, max_out, eos)
    try:
        for way in WAYS:  # warm the worker (its first turns, the API's first requests)
            warm = Conversation(way)
            for text in LINES[:2]:
                bench.turn(warm, text)
        mem_before = int(r.info("memory")["used_memory"])
        print(f"responses benchmark: Redis {stack.s.redis_url}; 1 worker; {repeats} conversations of {n_turns} "
              f"turns per way; greedy AR, {max_out} output tokens" + (" at most (EOS ends them)" if eos else ""), flush=True)
        convs: list[Conversation] = []
        for rep in range(repeats):
            mine = [Conversation(w) for w in WAYS]
            convs += mine
            for k in range(n_turns):
                for j in range(len(WAYS)):  # the order rotates with the turn and the repeat
                    bench.turn(mine[(j + k + rep) % len(WAYS)], LINES[k])
            bench.native_tokens(mine[1])
            print(f"  repeat {rep + 1}: " + "; ".join(
                f"{c.way} turn 1 {c.turns[0]['ms']:.0f} ms, turn {n_turns} {c.turns[-1]['ms']:.0f} ms "
                f"({c.turns[-1]['path']}, prefill {c.turns[-1]['prefill']})" for c in mine), flush=True)
        mem_after = int(r.info("memory")["used_memory"])
        kv = kv_bytes(SessionStore(r, stack.s), convs)
        pid = stack.procs[0].pid
        rss, peak = group_rss_mb(pid, "VmRSS"), group_rss_mb(pid, "VmHWM")
    finally:
        bench.close()
        r.close()
    return report(convs, n_turns, repeats, max_out, eos, {"redis_used_memory_before": mem_before,
                                                     "redis_used_memory_after": mem_after, "kv_bytes_per_conversation": kv,
                                                     "worker_rss_mb": rss, "worker_peak_rss_mb": peak})


def kv_bytes(store: SessionStore, convs: list[Conversation]) -> dict[str, int]:
    """The K/V bytes in Redis a conversation left, median per way: its session's (stateless: the
    sessions of all its requests, each kept: store is left true, as for the other ways)."""
    out = {}
    for way in WAYS:
        per = []
        for c in convs:
            if c.way == way:
                sessions = {t["session"] for t in c.turns}
                per.append(sum(m.nbytes for sid in sessions if (m := store.read(sid)) is not None))
        out[way] = imed(per)
    return out


def report(convs: list[Conversation], n_turns: int, repeats: int, max_out: int, eos: bool,
           memory: dict[str, Any]) -> dict[str, Any]:
    rows = summarise(convs, n_turns)
    print(f"{'turn':>4} | " + " | ".join(f"{w + ' ms':>13} {'wk ms':>6} {'prefill':>7} {'cached':>6} {'out':>3} {'path':>9}"
                                         for w in WAYS))
    for k in range(n_turns):
        print(f"{k + 1:>4} | " + " | ".join(
            f"{r['ms_p50']!s:>13} {r['worker_ms_p50']!s:>6} {r['prefill']!s:>7} {r['cached']!s:>6} "
            f"{r['output_tokens']!s:>3} {'/'.join(r['paths']):>9}" for w in WAYS for r in [rows[w][k]]))
    first, last = 0, n_turns - 1
    growth = {w: ratio(rows[w][last]["ms_p50"], rows[w][first]["ms_p50"]) for w in WAYS}
    # the worker's own time (load + prefill + decode): the same ratio without the API, SQL and the broker
    worker_growth = {w: ratio(rows[w][last]["worker_ms_p50"], rows[w][first]["worker_ms_p50"]) for w in WAYS}
    prefill_growth = {w: ratio(rows[w][last]["prefill"], rows[w][first]["prefill"]) for w in WAYS}
    # turn 1 opens its session (and may write more): against turn 2, both turns go on from state
    growth_2 = {w: ratio(rows[w][last]["ms_p50"], rows[w][1]["ms_p50"]) if n_turns > 2 else None for w in WAYS}
    by = {w: [c for c in convs if c.way == w] for w in WAYS}
    pairs = [(a["ms"], b["ms"]) for ca, cb in zip(by["sdk"], by["native"]) for a, b in zip(ca.turns, cb.turns)]
    sdk_native = round(statistics.median(a / b for a, b in pairs), 3)
    added = round(statistics.median(a - b for a, b in pairs), 1)
    turns = [t for c in convs for t in c.turns]
    statuses = {w: sorted({str(t["status"]) for c in by[w] for t in c.turns}) for w in WAYS}
    unexpected = [{"way": c.way, "turn": k + 1, "path": t["path"]} for c in convs for k, t in enumerate(c.turns)
                  if t["path"] != expected(c.way, k)]
    targets = {"sdk_growth": growth["sdk"] is not None and growth["sdk"] <= GROWTH_MAX,
               "native_growth": growth["native"] is not None and growth["native"] <= GROWTH_MAX,
               "route_overhead": sdk_native <= ROUTE_MAX}
    print(f"turn {n_turns} / turn 1 time: " + ", ".join(f"{w} {growth[w]}" for w in WAYS)
          + f" (target with state <= {GROWTH_MAX}); against turn 2: "
          + ", ".join(f"{w} {growth_2[w]}" for w in WAYS) + "; the worker's own time: "
          + ", ".join(f"{w} {worker_growth[w]}" for w in WAYS) + f"; prefill turn {n_turns} / turn 1: "
          + ", ".join(f"{w} {prefill_growth[w]}" for w in WAYS))
    print(f"sdk / native per turn, median of the pairs: {sdk_native} (target <= {ROUTE_MAX}); "
          f"added {added} ms per turn; targets met: {targets}")
    print(f"paths not as expected: {unexpected or 'none'}; Redis used_memory {memory['redis_used_memory_before']} -> "
          f"{memory['redis_used_memory_after']} bytes; K/V bytes per conversation {memory['kv_bytes_per_conversation']}; "
          f"worker RSS {memory['worker_rss_mb']} MB (peak {memory['worker_peak_rss_mb']} MB)", flush=True)
    return {"bench": "responses", "turns": n_turns, "repeats": repeats, "max_output_tokens": max_out, "eos": eos,
            "workers": 1, "responses": len(turns), "statuses": statuses,
            "ms_p50": {w: {str(r["turn"]): r["ms_p50"] for r in rows[w]} for w in WAYS},
            "prefill": {w: {str(r["turn"]): r["prefill"] for r in rows[w]} for w in WAYS},
            "cached": {w: {str(r["turn"]): r["cached"] for r in rows[w]} for w in WAYS},
            "rows": rows, "growth": growth, "growth_vs_turn2": growth_2, "worker_growth": worker_growth,
            "prefill_growth": prefill_growth,
            "sdk_over_native_p50": sdk_native, "sdk_added_ms_p50": added, "unexpected_paths": unexpected,
            "targets": {"growth_max": GROWTH_MAX, "route_max": ROUTE_MAX, **targets},
            "targets_met": all(targets.values()), **memory}


def group_rss_mb(pgid: int, field: str) -> float:
    """A /proc status field (VmRSS: now, VmHWM: the peak) summed over a process group (a worker:
    its main process and its pool process), in MB."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if int((d / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for line in (d / "status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return round(total / 1024, 1)


def _delete_keys(url: str, prefix: str) -> None:
    r = from_url(url)
    try:
        for key in r.scan_iter(f"{prefix}*", count=1000):
            r.delete(key)
    finally:
        r.close()


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
