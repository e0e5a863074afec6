"""`setflow demo` (`make demo`): the shipped model at work on its three jobs, on this CPU.

A dashboard narrative decoded three ways (AR: one token per forward; set: the sliding window of
the most confident tokens; prefix: the confident run from the leftmost mask) with the forward
passes of each side by side; an agent question
answered through tool calls; a report template filled by infill.  Every output is checked.
"""

from __future__ import annotations

import random
import time

import torch

from model import shipped
from model.corpus import agent, narrative, report
from model.decode import DecodeParams
from workflows import agent as agent_loop
from workflows.narrative import narrate
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


def run_demo() -> None:
    torch.set_num_threads(1)  # as in a worker process
    t0 = time.perf_counter()
    model, tok = shipped.load()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"setflow demo: the shipped set-diffusion model ({model.cfg.name} preset, {n_params / 1e6:.1f}M parameters, "
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
    print("More: `setflow bench quality [--quick]` (the model's accuracy and speed on held-out examples),\n"
          "`setflow bench decode [--quick]` (the decoding policies, cached vs uncached), docs/BENCHMARKS.md.")
