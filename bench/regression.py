"""Regression set: the shipped model on every agent question the README, the docs, the demo and
the tests have shown, in each phrasing (bench/regression.json, a fixed list: a retrain must keep
what the last model could do).  Each question runs the agent job's workflow (workflows/agent.py)
with the job's default settings on a new session in this process, over its source: the sample
dataset, a tenant's dataset of the listed rows, or a metric tool its client runs (the job stops
at each call, the client answers, the job goes on).

An answer is right when it comes back verified and states the number its data fixes (computed
here from the rows, as the question asks: answers.check); a question the tests show refused is
right when no verified answer comes back.  A wrong success is a verified answer that is not
right.  Every other outcome (unverified, no_answer) is a failure, counted by its code.  Prints
one line per question, then one JSON line {"bench": "regression", ...}.

    python bench/regression.py [--checkpoint DIR] [--threads N] [--only SUBSTRING] [--out-json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from domain import answers
from domain.agent import Task
from domain.tools import SAMPLE_NAMES, Dataset, Store, calc, call_text
from model import checkpoint, shipped
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import BadInput, NoAnswer, RequiresAction
from runtime.jobs.specs import AgentSpec
from runtime.sessions.local import LocalTurns
from workflows import agent as agent_flow
from workflows import tools as tool_flow

SET = Path(__file__).resolve().parent / "regression.json"
SAMPLE_SEED = AgentSpec(question="?").dataset_seed  # the sample dataset a job reads by default


def source(e: dict[str, Any]) -> Dataset | Store:
    """What the question's rows come from: its listed rows, else the sample dataset."""
    if "rows" in e:
        return Store({(m, r, p): v for m, r, p, v in e["rows"]})
    return Dataset(SAMPLE_SEED)


def expected(e: dict[str, Any]) -> str | None:
    """The number the question's data fixes; None for one that is to be refused."""
    data = source(e)
    values = [data.lookup(*c) if isinstance(data, Dataset) else data.values[tuple(c)] for c in e.get("calls", [])]
    op = e["op"]
    if op == "lookup":
        return values[0]
    if op == "sum":
        return calc("+".join(values))
    if op == "diff":
        return calc(f"{values[0]}-{values[1]}")
    if op == "pct":
        return calc(f"({values[1]}-{values[0]})/{values[0]}*100")
    if op == "arith":
        return calc(e["expr"])
    return None


def run(model: SetDLM, tok: Tokenizer, e: dict[str, Any]) -> dict[str, Any]:
    """One question's job: (outcome, answer, seconds, problems); outcome right, wrong (a verified
    answer that is not right), unverified or no_answer."""
    data, mode = source(e), e["mode"]
    kw: dict[str, Any] = {}
    tables: dict[str, list[list[str]]] = {}
    if mode == "dataset":
        kw["dataset"], tables["rows"] = "rows", [list(r) for r in e["rows"]]
    elif mode == "client":  # it declares the names its data holds, unless the entry says it declares none
        held = sorted({n for r in e["rows"] for n in r[:3]}) if "rows" in e else [n for f in SAMPLE_NAMES for n in f]
        kw |= {"client_tools": ["metric"], "names": held if e.get("declares", True) else []}
    spec = AgentSpec(question=e["question"], allow_unverified=True, **kw)
    outputs: dict[str, str] = {}
    t0 = time.perf_counter()
    try:
        for _ in range(spec.max_calls + 1):
            try:
                r = agent_flow.run(LocalTurns(model, tok, tool_outputs=dict(outputs), datasets=tables), spec)
                break
            except RequiresAction as stop:  # the client answers from its data; the job runs again
                call = stop.calls[0]
                outputs[call["id"]] = tool_flow.run_call(call["call"], data).result
        else:
            raise RuntimeError(f"{e['question']!r}: more client calls than max_calls")
    except (NoAnswer, BadInput) as err:  # no answer: right only where none is
        code = getattr(err, "code", "bad_input")
        return {"outcome": "right" if expected(e) is None else code, "code": code, "answer": None,
                "seconds": time.perf_counter() - t0, "problems": getattr(err, "problems", [str(err)])}
    seconds = time.perf_counter() - t0
    want = expected(e)
    if want is None:
        right = not r["verified"]
    else:
        task = Task(e["question"], [call_text("metric", *c) for c in e.get("calls", [])], want, "")
        right = bool(r["verified"]) and answers.check(task, r["text"]).answer_ok
    outcome = "right" if right else "wrong" if r["verified"] else "unverified"
    code = "verified" if r["verified"] else "unverified"
    return {"outcome": outcome, "code": code, "answer": r["answer"], "seconds": seconds, "problems": r["problems"]}


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=shipped.SHIPPED, help="checkpoint folder (default: the shipped model)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as in a worker)")
    ap.add_argument("--only", default="", help="only the questions that hold this text")
    ap.add_argument("--out-json", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    model, tok = shipped.load(args.checkpoint)
    questions = [e for e in json.loads(SET.read_text())["questions"] if args.only in e["question"]]
    rows = []
    for e in questions:
        out = run(model, tok, e)
        rows.append({"question": e["question"], "mode": e["mode"], "want": expected(e), **out})
        print(f"{out['outcome']:>10}  {out['code']:>10}  {e['mode']:<7}  {e['question']}  ->  {out['answer']!r}", flush=True)
    counts = Counter(r["outcome"] for r in rows)
    result = {"bench": "regression", "checkpoint": str(args.checkpoint), "fingerprint": checkpoint.fingerprint(model)[:16],
              "n": len(rows), "right": counts["right"], "fraction_right": round(counts["right"] / max(len(rows), 1), 4),
              "wrong_successes": counts["wrong"], "outcomes": dict(counts),
              "failures": [{k: r[k] for k in ("question", "mode", "outcome", "code", "answer", "problems")}
                           for r in rows if r["outcome"] != "right"],
              "threads": args.threads, "wall_s": round(time.perf_counter() - t_start, 1)}
    if args.out_json is not None:
        args.out_json.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(result, ensure_ascii=False))
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["wrong_successes"] == 0 else 1)
