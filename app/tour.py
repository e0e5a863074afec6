"""`setflow tour`: the shipped model at work on its three jobs, in this process, on this CPU.

A dashboard narrative decoded three ways (AR: one token per forward; set: the sliding window of
the most confident tokens; prefix: the confident run from the leftmost mask) with the forward
passes of each side by side; an agent question
answered through tool calls; a report template filled by infill; a session whose second turn a
fresh engine restores from Redis (the embedded server and a SQLite file unless REDIS_URL /
DATABASE_URL say otherwise).  Every output is checked.
"""

from __future__ import annotations

import random
import time

import torch

from model import shipped
from model.corpus import agent, narrative, report
from model.params import DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.sessions.records import Records
from runtime.db import database_url, make_engine
from runtime.embedded import connect
from runtime.sessions.engine import Engine
from runtime.settings import Settings
from runtime.sessions.store import SessionStore
from workflows import agent as agent_loop
from workflows.narrative import narrate
from workflows.narrative import prompt_ids as narrate_prompt
from workflows.report import fill

PAYLOAD = narrative.Payload(
    "Northwind", "2026-Q3", "formal",
    [narrative.Metric("revenue", "1240", "1105", "1300"), narrative.Metric("churn", "2.4", "2.6", "2.5"),
     narrative.Metric("latency", "182", "182")],
    narrative.Breakdown("region", "revenue", [("EMEA", "512", "468"), ("APAC", "301", "318"), ("AMER", "427", "319")]))
QUESTION = "By how much did revenue in EMEA change from 2026-Q2 to 2026-Q3, in percent?"
AR = DecodeParams(policy="ar", max_new_tokens=200)
SET = DecodeParams(policy="set", window=4, tau=0.9, max_new_tokens=200)
PREFIX = DecodeParams(policy="prefix", window=8, tau=0.99, max_new_tokens=200)
SIDES = (("AR     (W=1)", AR), (f"set    (W={SET.window}, tau={SET.tau})", SET),
         (f"prefix (W={PREFIX.window}, tau={PREFIX.tau})", PREFIX))


def _verdict(ok: bool) -> str:
    return "correct" if ok else "NOT correct"


def run_tour() -> None:
    torch.set_num_threads(1)  # as in a worker process
    t0 = time.perf_counter()
    model, tok = shipped.load()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"setflow tour: the shipped set-diffusion model ({model.cfg.name} preset, {n_params / 1e6:.1f}M parameters, "
          f"set size d={model.cfg.set_size}), loaded from {shipped.SHIPPED} in {time.perf_counter() - t0:.1f} s.\n")

    print("1) A dashboard narrative.  Payload:\n")
    print("   " + PAYLOAD.to_text().rstrip().replace("\n", "\n   ") + "\n")
    runs = {}
    for name, params in SIDES:
        r = narrate(model, tok, PAYLOAD, params)
        runs[name] = r
        c = narrative.check(PAYLOAD, r.text)
        print(f"   {name}: {r.nfe - 1} forward passes for {r.generated} tokens "
              f"({(r.nfe - 1) / r.generated:.2f} per token), {r.seconds * 1000:.0f} ms; "
              f"facts {c.facts_ok}/{c.facts_total}: {_verdict(c.fully_correct)}")
    ar = runs[SIDES[0][0]]
    print(f"\n   {ar.text}\n")
    for name, r in list(runs.items())[1:]:
        same = "the same text" if r.text == ar.text else "a different text"
        print(f"   {name.split()[0]} wrote {same} with {(r.nfe - 1) / max(ar.nfe - 1, 1):.0%} of AR's forward passes.")
    print()

    print(f"2) An agent with tools.  Q: {QUESTION}\n")
    data = agent.Dataset(2026)
    r2 = agent_loop.run(model, tok, QUESTION, data, DecodeParams(policy="set", window=4, tau=0.9, max_new_tokens=96))
    v1, v2 = data.lookup("revenue", "EMEA", "2026-Q2"), data.lookup("revenue", "EMEA", "2026-Q3")
    expected = agent.calc(f"({v2}-{v1})/{v1}*100")
    ok = agent.check(agent.Task(QUESTION, [], expected, ""), r2.text).answer_ok
    print("   " + r2.text.strip().replace("\n", "\n   "))
    print(f"\n   {len(r2.calls)} tool calls run by the runtime; {r2.nfe - 1} forward passes for {r2.generated} "
          f"tokens; the answer is {_verdict(ok)} (expected {expected}).\n")

    print("3) A report template filled by infill (holes marked _):\n")
    t = report.make_template(random.Random("demo"))
    print("   " + t.text(hole="_"))
    r3 = fill(model, tok, t, SET)
    filled = tok.decode(r3.tokens, skip_special=True).split("fill: ", 1)[1]
    print(f"   {filled}\n   {sum(r3.hole)} hole tokens in {r3.nfe - 1} forward passes: "
          f"{_verdict(r3.exact)}\n")
    print("4) A session that resumes from Redis, as on another worker (embedded Redis + SQLite by default):\n")
    _session_demo(model, tok)
    print("More: `setflow bench quality [--quick]` (the model's accuracy and speed on held-out examples),\n"
          "`setflow bench decode [--quick]` (the decoding policies, cached vs uncached),\n"
          "`setflow bench resume [--quick]` (warm vs Redis vs SQL), docs/BENCHMARKS.md.")


def _session_demo(model: SetDLM, tok: Tokenizer) -> None:
    """Two turns of one session: the second restored from Redis by a fresh engine; the same
    two turns uninterrupted in another session; the tokens compared."""
    settings = Settings()
    client, server = connect(settings)
    try:
        records = Records(make_engine(settings))
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
        print(f"   Redis {where}; database {database_url(settings)}")
        print(f"   turn 1: {r1.path}, {len(r1.tokens)} tokens; turn 2 on a fresh engine: {r2.path} "
              f"({m.nbytes if m else 0} bytes of K/V in {len(m.segments) if m else 0} segments), "
              f"{len(r2.tokens)} tokens in {r2.costs['load_s'] * 1000:.0f} ms load + "
              f"{r2.costs['decode_s'] * 1000:.0f} ms decode")
        print(f"   turn 2 matches an uninterrupted session token for token: {_verdict(r2.tokens == r2_ref.tokens)}\n")
        records.engine.dispose()
    finally:
        if server is not None:
            server.stop()
