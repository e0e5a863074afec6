"""Batched decoding benchmark: N concurrent sessions' turns decoded one at a time vs in one batch.

For N in 1, 2, 4, 8, 16 sessions, each with one turn of the shipped model, in one process, same
threads and dtype on both sides, side by side (a, b, a, b, ... per row; medians):
  (a) sequential  each turn alone: KVCache, begin_turn (prefill), decode, commit_pending; then the next
  (b) batched     what a batching worker does (runtime/sessions/batcher.py): each turn on a thread
                  of its own and a cache of one paged KVPool; its input's prefill, its steps and the
                  commit of its last set all go through the batch loop: one forward for every
                  turn ready at that moment (model/batch.py step_batch)
Tasks: narrative (dashboard payload -> 128-token narrative, prefix W = 8, tau = 0.99, ignore_eos:
every turn writes all 128 tokens), narrative_eos (the same turns stopped at EOS, as the runtime
decodes them: not in --quick) and agent (question -> its first tool call, prefix
W = 4, tau = 0.9, up to 96 tokens, stops at `</call>` or EOS).  Per row: aggregate tokens/s of
each path, their ratio (the median of the paired ratios), per-turn latency p50/p99 (each turn's
end, from the start of the pass: all N sessions arrive at once), forwards per generated token
(every forward the process ran, the prompts' prefills included; a batched step counts once), the
batched turns' own nfe per token, whether (a) and (b) wrote the same tokens, and the ceiling: one
batched forward of N sessions' typical step (the task's mean query tokens against its mean cache
length) vs N batch-1 forwards of it, the speedup if batching cost nothing but that forward; and
the bound: that speedup at this pass's own mean batch (a wave drains: its last steps run few
turns), the most the row could reach if a turn cost nothing but its steps' forwards.
Prints a table, then one JSON line {"bench": "batch", "rows": [...], ...}.

    python bench/batch.py [--quick] [--sessions 1,2,4,8,16] [--dtypes fp32,bf16] [--repeats N] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (bench/ too), as a script

import torch

from bench.resume import REALISTIC
from domain import agent, narrative
from domain.draws import make_payload
from domain.tools import END_CALL
from model import checkpoint, shipped
from model.batch import batched_forward
from model.decode import begin_turn, commit_pending, decode, fused_forward, prefill
from model.kv_cache import KVCache
from model.params import DecodeParams, DecodeState
from model.pool import BLOCK, KVPool, PooledCache
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.sessions.batcher import Batcher

SESSIONS, QUICK_SESSIONS = (1, 2, 4, 8, 16), (1, 8, 16)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# narrative: every turn writes all its tokens (ignore_eos), past the narrative's EOS when it ends
# earlier (most of them do: then the turn decodes filler, nearly a token per step); narrative_eos:
# the same turns stopped at EOS, as the runtime decodes them (shorter, uneven turns)
TASKS, QUICK_TASKS = ("narrative", "agent", "narrative_eos"), ("narrative", "agent")
TURNS = (1, 3)  # turns per session: one wave (all arrive at once, the batch drains), a stream of 3
TARGETS = {8: 2.5, 16: 3.5}  # the issue's: batched over sequential tokens/s at N sessions, on CPU
NARRATIVE_TOKENS, AGENT_SEGMENT = 128, 96
CEILING_REPEATS = 20  # timed forwards per ceiling point (median)


@dataclass(frozen=True)
class Turn:
    ids: list[int]
    params: DecodeParams


def make_turns(task: str, n: int, tok: Tokenizer, bos: int, tokens: int, per_session: int = 1) -> list[list[Turn]]:
    """n sessions' turns of a task, per_session each (a new document in the session: a new
    payload, or a new question), the same for every N (a row of N sessions takes the first N)."""
    def seed(i: int, j: int) -> str:
        return f"{i}" if j == 0 else f"{i}/{j}"

    if task in ("narrative", "narrative_eos"):
        p = DecodeParams(policy="prefix", window=8, tau=0.99, max_new_tokens=tokens, ignore_eos=task == "narrative")
        return [[Turn([bos, *tok.encode(narrative.prompt_text(make_payload(random.Random(f"batch/{seed(i, j)}"))))], p)
                 for j in range(per_session)] for i in range(n)]
    p = DecodeParams(policy="prefix", window=4, tau=0.9, max_new_tokens=AGENT_SEGMENT,
                     stop=[[tok.token_id(END_CALL)]])
    return [[Turn([bos, *tok.encode(agent.prompt_text(agent.example(random.Random(f"batch/agent/{seed(i, j)}"))[0].question))],
                  p) for j in range(per_session)] for i in range(n)]


@dataclass
class Pass:
    """One path over N sessions' turns: its wall time, each turn's latency (from its arrival:
    the pass's start for a session's first turn, its previous turn's end for the others) and
    written tokens (session-major), and the forwards the process ran."""

    seconds: float = 0.0
    latency: list[float] = field(default_factory=list)
    written: list[list[int]] = field(default_factory=list)
    forwards: int = 0
    nfe: int = 0  # the turns' own forward counts summed (a batched step counts once per turn in it)
    steps: int = 0  # decode steps: forwards of one turn (a), batched forwards (b)
    stepped: int = 0  # turn-steps: steps x the turns in each

    @property
    def tokens(self) -> int:
        return sum(len(w) for w in self.written)


@torch.no_grad()
def sequential(model: SetDLM, sessions: list[list[Turn]], dtype: torch.dtype) -> Pass:
    """(a): each turn alone, one after another, in the order they arrive (the sessions' first
    turns, then their second ones, ...); a session's turns continue its cache and state."""
    n, per = len(sessions), len(sessions[0])
    out = Pass(latency=[0.0] * (n * per), written=[[] for _ in range(n * per)])
    caches = [KVCache.for_model(model.cfg, dtype=dtype, device=_device(model)) for _ in sessions]
    states: list[DecodeState | None] = [None] * n
    arrived = [0.0] * n
    t0 = time.perf_counter()
    for j in range(per):
        for i, turns in enumerate(sessions):
            t, cache = turns[j], caches[i]
            state = begin_turn(model, cache, states[i], t.ids, t.params)
            p0 = state.start
            for _ in decode(model, cache, state, t.params):
                pass
            commit_pending(model, cache, state)
            end = time.perf_counter() - t0
            out.latency[i * per + j], arrived[i] = end - arrived[i], end
            out.written[i * per + j] = state.tokens[p0:]
            states[i] = state
    out.seconds = time.perf_counter() - t0
    out.forwards = out.nfe = sum(s.nfe for s in states if s is not None)
    return out


def batched(model: SetDLM, pool: KVPool, sessions: list[list[Turn]]) -> Pass:
    """(b): what a batching worker does (runtime/sessions/batcher.py): each session on a thread
    of its own and a pool cache, its turns one after another, each turn's input, steps and last
    set in the shared batch (a session's next turn joins the batch as its last one leaves).
    The threads are started before the clock, as a worker's pool threads stand ready before
    its jobs arrive: all N turns arrive at once, at the start of the pass."""
    n, per = len(sessions), len(sessions[0])
    out = Pass(latency=[0.0] * (n * per), written=[[] for _ in range(n * per)])
    batcher = Batcher(model, max_batch=n)
    caches = [pool.take() for _ in sessions]
    states: list[DecodeState | None] = [None] * n
    errors: list[BaseException] = []

    go = threading.Event()  # the turns arrive at once: at go, to threads that stand ready

    @torch.no_grad()
    def run(i: int) -> None:
        go.wait()
        try:
            cache, state, arrived = caches[i], None, 0.0
            for j, t in enumerate(sessions[i]):
                state = begin_turn(model, cache, state, t.ids, t.params, batcher.commit)
                p0 = state.start
                for _ in batcher.steps(cache, state, t.params):
                    pass
                commit_pending(model, cache, state, batcher.commit)
                end = time.perf_counter() - t0
                out.latency[i * per + j], arrived = end - arrived, end
                out.written[i * per + j] = state.tokens[p0:]
            states[i] = state
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    try:
        for th in threads:  # a worker's pool threads stand ready before its jobs come
            th.start()
    finally:  # even if a start failed: no thread waits for ever
        t0 = time.perf_counter()
        go.set()
    for th in threads:
        th.join()
    out.seconds = time.perf_counter() - t0
    batcher.close()
    if errors:
        raise errors[0]
    for c in caches:
        pool.give_back(c)
    out.nfe = sum(s.nfe for s in states if s is not None)
    out.steps, out.stepped = batcher.forwards, batcher.stepped
    out.forwards = out.nfe - out.stepped + out.steps  # batch-1 forwards (long inputs, rollbacks) + batched ones
    return out


# ---- the ceiling ------------------------------------------------------------------------------


@torch.no_grad()
def _device(model: SetDLM) -> torch.device:
    return next(model.parameters()).device


def _sync(model: SetDLM) -> None:
    """A GPU's queued kernels done (a timing reads the clock after them)."""
    if _device(model).type == "cuda":
        torch.cuda.synchronize()


def step_shape(model: SetDLM, turns: list[Turn], dtype: torch.dtype) -> tuple[int, int, int]:
    """A typical step of these turns decoded alone: (mean pending tokens, mean masks scored,
    mean cached slots), rounded."""
    pending, masks, cached = [], [], []
    for t in turns:
        cache = KVCache.for_model(model.cfg, dtype=dtype, device=_device(model))
        state = begin_turn(model, cache, None, t.ids, t.params)
        for ev in decode(model, cache, state, t.params):
            assert ev.logits is not None
            pending.append(len(ev.committed))
            masks.append(ev.logits.shape[0])
            cached.append(cache.length - len(ev.committed))  # before this step's commit (a cut's rollback aside)
    return (round(statistics.mean(pending)), round(statistics.mean(masks)), round(statistics.mean(cached)))


@torch.no_grad()
def ceiling(model: SetDLM, pool: KVPool, shape: tuple[int, int, int], B: int, dtype: torch.dtype,
            repeats: int) -> float:
    """B x (one batch-1 forward of the typical step) / (one batched forward of B of them): what
    step batching could reach if the forward were all it cost."""
    m, a, L = shape
    g = torch.Generator().manual_seed(0)
    ctx = [model.cfg.bos_id] + torch.randint(4, model.cfg.vocab_size, (L - 1,), generator=g).tolist()
    ids = torch.randint(4, model.cfg.vocab_size, (m,), generator=g).tolist() + [model.cfg.mask_id] * a
    pos = list(range(L, L + m + a))
    one = KVCache.for_model(model.cfg, capacity=L + m + a, dtype=dtype, device=_device(model))
    prefill(model, one, ctx, list(range(L)))
    rows: list[PooledCache] = []
    for _ in range(B):
        c = pool.take()
        prefill(model, c, ctx, list(range(L)))
        rows.append(c)

    def timed(fn: Callable[[], object], caches: Sequence[KVCache]) -> float:
        _sync(model)
        t0 = time.perf_counter()
        fn()
        _sync(model)
        dt = time.perf_counter() - t0
        for c in caches:
            c.rollback(L)  # the forward committed the pending tokens: back to L slots
        return dt

    single, batch = [], []
    for _ in range(repeats + 2):  # interleaved; the first two of each are warm-up
        single.append(timed(lambda: fused_forward(model, one, ids, pos, a), [one]))
        batch.append(timed(lambda: batched_forward(model, rows, [ids] * B, [pos] * B, [a] * B), rows))
    for r in rows:
        pool.give_back(r)
    return B * statistics.median(single[2:]) / statistics.median(batch[2:])


# ---- rows -------------------------------------------------------------------------------------


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    return float(s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (k - lo))


def bound(N: int, ceil: float, mean_batch: float) -> float:
    """The ceiling at this pass's mean batch: a forward of b steps costing alpha + b * beta (one
    step alone costs 1; the ceiling gives N / (alpha + N * beta)), sequential turn-steps cost 1
    each and the batched ones alpha / mean_batch + beta each.  N = 1: the ceiling itself."""
    if N == 1:
        return ceil
    beta = min(1.0, max(0.0, (N / ceil - 1) / (N - 1)))  # a noisy ceiling under 1 or over N: clamped
    return 1 / ((1 - beta) / mean_batch + beta)


def row(dtype: str, task: str, N: int, per: int, pairs: list[tuple[Pass, Pass]], ceil: float) -> dict[str, Any]:
    """One (dtype, task, N, turns per session) row from its (sequential, batched) pairs: medians
    over the pairs."""
    def med(xs: list[float]) -> float:
        return float(statistics.median(xs))

    a0, b0 = pairs[0]  # greedy: every repeat runs the same forwards (its tokens are checked below)
    same = [all(a.written[i] == b.written[i] for a, b in pairs) for i in range(N * per)]
    agree = sum(u == v for x, y in zip(a0.written, b0.written) for u, v in zip(x, y))
    out: dict[str, Any] = {
        "dtype": dtype, "task": task, "sessions": N, "turns_per_session": per, "tokens": a0.tokens,
        "sequential_tokens_per_s": round(med([a.tokens / a.seconds for a, _ in pairs]), 1),
        "batched_tokens_per_s": round(med([b.tokens / b.seconds for _, b in pairs]), 1),
        "ratio": round(med([(b.tokens / b.seconds) / (a.tokens / a.seconds) for a, b in pairs]), 2),
        "ceiling": round(ceil, 2),
        "identical": all(same), "identical_fraction": round(sum(same) / len(same), 4),
        "token_agreement": round(agree / max(1, a0.tokens, b0.tokens), 4),  # same token at the same place
        "sequential_forwards_per_token": round(a0.forwards / a0.tokens, 4),
        "batched_forwards_per_token": round(b0.forwards / b0.tokens, 4),
        "batched_turn_nfe_per_token": round(b0.nfe / b0.tokens, 4),
        "mean_batch": round(b0.stepped / b0.steps, 2),
        "bound": round(bound(N, ceil, b0.stepped / b0.steps), 2)}
    for i, path in enumerate(("sequential", "batched")):
        for name, q in (("p50", 50), ("p99", 99)):
            out[f"{path}_{name}_ms"] = round(1000 * med([percentile(p[i].latency, q) for p in pairs]), 1)
    return out


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (dtype, task, turns per session): the ratio at each target's session count, and
    whether it is met."""
    out: dict[str, Any] = {}
    for r in rows:
        if r["sessions"] in TARGETS:
            out.setdefault(f"{r['dtype']}/{r['task']}/{r['turns_per_session']}", {})[str(r["sessions"])] = {
                "ratio": r["ratio"], "target": TARGETS[r["sessions"]], "met": r["ratio"] >= TARGETS[r["sessions"]],
                "ceiling": r["ceiling"], "bound": r["bound"], "identical": r["identical"]}
    return out


COLUMNS = (("dtype", "dtype", 5), ("task", "task", 13), ("sessions", "N", 2), ("turns_per_session", "turns", 5),
           ("tokens", "tokens", 6),
           ("sequential_tokens_per_s", "seq tok/s", 9), ("batched_tokens_per_s", "bat tok/s", 9),
           ("ratio", "ratio", 5), ("ceiling", "ceil", 5), ("bound", "bound", 5), ("identical_fraction", "same", 5),
           ("mean_batch", "batch", 5),
           ("sequential_forwards_per_token", "fwd/tok a", 9), ("batched_forwards_per_token", "fwd/tok b", 9),
           ("batched_turn_nfe_per_token", "nfe/tok b", 9),
           ("sequential_p50_ms", "p50 a ms", 8), ("batched_p50_ms", "p50 b ms", 8),
           ("sequential_p99_ms", "p99 a ms", 8), ("batched_p99_ms", "p99 b ms", 8))


def table_line(r: dict[str, Any] | None) -> str:
    if r is None:
        return "  ".join(f"{head:>{w}}" for _, head, w in COLUMNS)
    return "  ".join(f"{r[k]!s:>{w}}" for k, _, w in COLUMNS)


@torch.no_grad()
def warm_up(model: SetDLM, pool: KVPool, sessions: list[list[Turn]], dtype: torch.dtype) -> None:
    """Untimed: both paths once at every batch size the rows will see, on short turns."""
    short = [[Turn(t.ids, replace(t.params, max_new_tokens=16)) for t in turns[:1]] for turns in sessions]
    sequential(model, short[:2], dtype)
    batched(model, pool, short)


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sessions 1, 8, 16, one repeat: about a minute")
    ap.add_argument("--sessions", default=None, help="comma-separated session counts (default 1,2,4,8,16; quick 1,8,16)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated subset of fp32,bf16")
    ap.add_argument("--tasks", default=None, help=f"comma-separated subset of {','.join(TASKS)} "
                    f"(default all; quick {','.join(QUICK_TASKS)})")
    ap.add_argument("--tokens", type=int, default=NARRATIVE_TOKENS, help="tokens per narrative turn (default 128)")
    ap.add_argument("--turns", default=None, help="comma-separated turns per session, each its own rows "
                    f"(default {','.join(map(str, TURNS))}: one wave of turns, and a stream of them)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved (a, b) pairs per row (default 5, quick 1)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as in a worker)")
    ap.add_argument("--out-json", type=Path, help="also write the JSON result to this file")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--preset", default="shipped", help="shipped, or a realistic shape with random weights "
                    "(bench/resume.py REALISTIC: qwen3-0.6b, qwen3-1.7b): its turns read the shipped tokenizer's ids")
    args = ap.parse_args(argv)
    try:
        sessions = sorted({int(s) for s in (args.sessions or ",".join(map(str, QUICK_SESSIONS if args.quick
                                                                               else SESSIONS))).split(",") if s})
    except ValueError:
        ap.error(f"--sessions takes comma-separated integers, got {args.sessions!r}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    tasks = [t for t in (args.tasks or ",".join(QUICK_TASKS if args.quick else TASKS)).split(",") if t]
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    try:
        per_session = sorted({int(t) for t in (args.turns or ",".join(map(str, TURNS))).split(",") if t})
    except ValueError:
        ap.error(f"--turns takes comma-separated integers, got {args.turns!r}")
    if not per_session or per_session[0] < 1:
        ap.error("--turns: each >= 1")
    if not sessions or sessions[0] < 1 or not dtypes or set(dtypes) - set(DTYPES) or not tasks or set(tasks) - set(TASKS):
        ap.error(f"--sessions >= 1, --dtypes from fp32,bf16, --tasks from {','.join(TASKS)}")
    if repeats < 1 or args.threads < 1 or args.tokens < 1:
        ap.error("--repeats, --threads and --tokens must be >= 1")
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    print(f"{args.preset} model; threads {args.threads}; {repeats} interleaved (a, b) pair(s) per row, medians; "
          f"narrative: {args.tokens} tokens per turn (ignore_eos); narrative_eos: the same, stopped at EOS; "
          f"agent: the first call (<= {AGENT_SEGMENT} tokens, stops at </call>); turns: per session, one after "
          f"another, each a new document; p50/p99: each turn's latency from its arrival (the pass's start, or its "
          f"session's previous turn's end); fwd/tok: every forward, prefills included, a batched step once; nfe/tok b: the "
          f"batched turns' own counts; batch: mean turns per batched step; ceil: N batch-1 forwards of a "
          f"typical step / one batched forward of N; bound: the ceiling at the pass's mean batch", flush=True)
    print(table_line(None), flush=True)
    rows, shapes, fingerprint = [], {}, ""
    for dname in dtypes:
        dtype = DTYPES[dname]
        model, tok = shipped.load(dtype=dtype)
        if args.preset != "shipped":  # the realistic shape, random weights (the costs are the shape's)
            torch.manual_seed(0)
            with torch.device(args.device):
                model = SetDLM(replace(REALISTIC[args.preset], max_seq_len=1024)).eval().to(dtype)
        model = model.to(args.device)
        fingerprint = fingerprint or checkpoint.fingerprint(model)[:16]
        pool = KVPool(model.cfg, max(sessions) * -(-model.cfg.max_seq_len // BLOCK), dtype=dtype, device=args.device)
        for task in tasks:
            turns = make_turns(task, max(sessions), tok, model.cfg.bos_id, args.tokens, max(per_session))
            warm_up(model, pool, turns, dtype)
            shape = shapes[f"{dname}/{task}"] = step_shape(model, [t[0] for t in turns[:4]], dtype)
            ceil = {N: ceiling(model, pool, shape, N, dtype, CEILING_REPEATS) for N in sessions}
            for per in per_session:
                for N in sessions:
                    mine = [t[:per] for t in turns[:N]]
                    pairs = [(sequential(model, mine, dtype), batched(model, pool, mine)) for _ in range(repeats)]
                    rows.append(row(dname, task, N, per, pairs, ceil[N]))
                    print(table_line(rows[-1]), flush=True)
    result = {"bench": "batch", "rows": rows, "targets": targets(rows), "preset": args.preset, "device": args.device,
              "step_shapes": {k: dict(zip(("pending", "masks", "cached"), v)) for k, v in shapes.items()},
              "fingerprint": fingerprint, "threads": args.threads, "repeats": repeats,
              "wall_s": round(time.perf_counter() - t_start, 1)}
    if args.out_json is not None:
        args.out_json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
