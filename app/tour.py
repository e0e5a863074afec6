"""`setflow tour`: the shipped model at work on its three jobs, in this process, on this CPU.

A dashboard narrative decoded three ways (AR: one token per forward; set: the sliding window of
the most confident tokens; prefix: the confident run from the leftmost mask) with the forward
passes of each side by side; an agent question answered through tool calls; a report template
filled by infill (these three: the jobs' own workflows, each on a session in this process,
runtime/sessions/local.py); a session whose second turn a fresh engine restores from Redis (the
embedded server and a SQLite file unless REDIS_URL / DATABASE_URL say otherwise).  Every output
is checked.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from domain import agent, answers, report
from domain.draws import make_payload
from domain.payload import Breakdown, Metric, Payload
from domain.tools import Dataset, calc
from model import shipped
from model.params import DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.db import database_url, make_engine
from runtime.embedded import connect
from runtime.jobs.params import ParamsSpec
from runtime.jobs.payload import PayloadSpec
from runtime.jobs.specs import AgentSpec, NarrativeSpec
from runtime.sessions.engine import Engine
from runtime.sessions.local import LocalTurns
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings, redact
from workflows import agent as agent_flow
from workflows import narrative as narrative_flow
from workflows import report as report_flow
from workflows.narrative import prompt_ids as narrate_prompt
from workflows.turn import decode_params

PAYLOAD = Payload(
    "Northwind", "2026-Q3", "formal",
    [Metric("revenue", "1240", "1105", "1300"), Metric("churn", "2.4", "2.6", "2.5"),
     Metric("latency", "182", "182")],
    Breakdown("region", "revenue", [("EMEA", "512", "468"), ("APAC", "301", "318"), ("AMER", "427", "319")]))
QUESTION = "By how much did revenue in EMEA change from 2026-Q2 to 2026-Q3, in percent?"
AR = ParamsSpec(policy="ar", window=1, tau=None, max_new_tokens=200)
SET = ParamsSpec(policy="set", window=4, tau=0.9, max_new_tokens=200)
PREFIX = ParamsSpec(policy="prefix", window=8, tau=0.99, max_new_tokens=200)
SIDES = (("AR     (W=1)", AR), (f"set    (W={SET.window}, tau={SET.tau})", SET),
         (f"prefix (W={PREFIX.window}, tau={PREFIX.tau})", PREFIX))


def _verdict(ok: bool) -> str:
    return "correct" if ok else "NOT correct"


def _local(job: Callable[[LocalTurns], dict[str, Any]], model: SetDLM, tok: Tokenizer) -> tuple[dict[str, Any], float]:
    """job's result on a new session in this process, and its seconds."""
    t0 = time.perf_counter()
    r = job(LocalTurns(model, tok))
    return r, time.perf_counter() - t0


def run_tour() -> None:
    torch.set_num_threads(1)  # as in a worker process
    t0 = time.perf_counter()
    model, tok = shipped.load()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"setflow tour: the shipped set-diffusion model ({model.cfg.name} preset, {n_params / 1e6:.1f}M parameters, "
          f"set size d={model.cfg.set_size}), loaded from {shipped.SHIPPED} in {time.perf_counter() - t0:.1f} s.\n")
    print("1) A dashboard narrative.  Payload:\n")
    _narratives(model, tok)
    print(f"2) An agent with tools.  Q: {QUESTION}\n")
    _agent(model, tok)
    print("3) A report template filled by infill (holes marked _):\n")
    _infill(model, tok)
    print("4) A session that resumes from Redis, as on another worker (embedded Redis + SQLite by default):\n")
    _session_demo(model, tok)
    print("More: `setflow bench quality [--quick]` (the model's accuracy and speed on held-out examples),\n"
          "`setflow bench decode [--quick]` (the decoding policies, cached vs uncached),\n"
          "`setflow bench resume [--quick]` (warm vs Redis vs SQL), docs/BENCHMARKS.md.")


def _narratives(model: SetDLM, tok: Tokenizer) -> None:
    """The narrative workflow with each decoding side by side: forwards, time, facts."""
    print("   " + PAYLOAD.to_text().rstrip().replace("\n", "\n   ") + "\n")
    payload = PayloadSpec.of(PAYLOAD)
    runs = {}
    for name, params in SIDES:
        spec = NarrativeSpec(payload=payload, params=params, allow_unverified=True)  # every verdict shown
        r, seconds = _local(partial(narrative_flow.run, spec=spec), model, tok)
        runs[name], fwd = r, r["nfe"] - 1  # every forward but the prompt's prefill
        print(f"   {name}: {fwd} forward passes for {r['tokens']} tokens ({fwd / r['tokens']:.2f} per token), "
              f"{seconds * 1000:.0f} ms; facts {r['facts_ok']}/{r['facts_total']}: {_verdict(r['verified'])}"
              + _retried(r))
    ar = runs[SIDES[0][0]]
    print(f"\n   {ar['text']}\n")
    for name, r in list(runs.items())[1:]:
        same = "the same text" if r["text"] == ar["text"] else "a different text"
        ratio = (r["nfe"] - 1) / max(ar["nfe"] - 1, 1)
        print(f"   {name.split()[0]} wrote {same} with {ratio:.0%} of AR's forward passes.")
    print()


def _agent(model: SetDLM, tok: Tokenizer) -> None:
    """The agent workflow on QUESTION; its answer checked against the tools' own numbers."""
    data = Dataset(2026)
    spec = AgentSpec(question=QUESTION, dataset_seed=data.seed, allow_unverified=True,
                     params=ParamsSpec(policy="set", window=4, tau=0.9, max_new_tokens=96))
    r, _ = _local(partial(agent_flow.run, spec=spec), model, tok)
    v1, v2 = data.lookup("revenue", "EMEA", "2026-Q2"), data.lookup("revenue", "EMEA", "2026-Q3")
    expected = calc(f"({v2}-{v1})/{v1}*100")
    ok = answers.check(agent.Task(QUESTION, [], expected, ""), r["text"]).answer_ok
    print("   " + r["text"].strip().replace("\n", "\n   "))
    fwd, written = sum(t["nfe"] for t in r["turns"]) - 1, sum(t["tokens"] for t in r["turns"])
    print(f"\n   {len(r['calls'])} tool calls run by the runtime; {fwd} forward passes for {written} tokens; "
          f"the answer is {_verdict(ok)} (expected {expected}){_retried(r)}.\n")


def _infill(model: SetDLM, tok: Tokenizer) -> None:
    """A key-figures template filled as a report fills it (workflows/report.figures)."""
    data = make_payload(random.Random("demo"))
    data.breakdown = None
    t = report.template(data)
    print("   " + t.rendered.slots.lexicalise(t.text(hole="_")))
    r, _ = _local(partial(report_flow.figures, data=data, params=decode_params(SET), allow_unverified=True),
                  model, tok)
    print(f"   {r['markdown']}\n   {r['tokens']} hole tokens in {r['nfe'] - 1} forward passes: "
          f"{_verdict(r['exact'])}{_retried(r)}\n")


def _retried(r: dict[str, Any]) -> str:
    """Said of an output its first decode got wrong (workflows/checked.py decoded it again)."""
    return " (the first decode failed its check: this is the greedy AR retry's)" if "retried" in r else ""


def _session_demo(model: SetDLM, tok: Tokenizer) -> None:
    """Two turns of one session: the second restored from Redis by a fresh engine; the same
    two turns uninterrupted in another session; the tokens compared."""
    settings = Settings()
    client, server = connect(settings)
    try:
        records = Records(make_engine(settings), settings)
        params = DecodeParams(policy="prefix", window=8, tau=0.99, max_new_tokens=200)
        first, second = narrate_prompt(tok, PAYLOAD), tok.encode("\nnarrative: ")
        a = Engine(model, SessionStore(client, settings), records, settings)
        sid = a.open("demo")
        r1 = a.run_turn(sid, "demo", first, params)
        b = Engine(model, SessionStore(client, settings), records, settings)  # another worker: nothing warm
        r2 = b.run_turn(sid, "demo", second, params)
        ref = a.open("demo")
        a.run_turn(ref, "demo", first, params)
        r2_ref = a.run_turn(ref, "demo", second, params)
        m = b.store.read(sid)
        where = settings.redis_url or (server.url if server else "?")
        print(f"   Redis {redact(str(where))}; database {redact(database_url(settings))}")
        print(f"   turn 1: {r1.path}, {len(r1.tokens)} tokens; turn 2 on a fresh engine: {r2.path} "
              f"({m.nbytes if m else 0} bytes of K/V in {len(m.segments) if m else 0} segments), "
              f"{len(r2.tokens)} tokens in {r2.costs['load_s'] * 1000:.0f} ms load + "
              f"{r2.costs['decode_s'] * 1000:.0f} ms decode")
        print(f"   turn 2 matches an uninterrupted session token for token: {_verdict(r2.tokens == r2_ref.tokens)}\n")
        records.engine.dispose()
    finally:
        if server is not None:
            server.stop()
