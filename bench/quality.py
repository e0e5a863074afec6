"""Quality benchmark: the shipped model on held-out examples of its three use-cases, for AR (W = 1)
and set decoding at several (policy, W, tau).

Tasks (examples drawn with another seed than training's, at most the training length):
  narrative  payload -> narrative; fully correct = every slot, direction and comparison right, the
             whole text one the narrative's forms write (domain/narrative.py read_back)
  agent      question -> tool calls (run for real) -> answer; fully correct = the right final number
  section    outline line + data -> report section (the heading given, as a job's), checked likewise
  infill     report template: the holes (slots, trend and target words) filled in place; exact match
  narrative_ood, section_ood   the same on payloads drawn from the API's own grammar
             (domain/draws.py wild_payload: any names, periods, custom metrics, 1-8 metrics,
             up to 12 rows, negative numbers), not the corpus's vocabulary lists
  agent_ood  questions over a metric store of any names and periods (domain/agent.py
             wild_task), read as a tenant's own dataset is
  *_realistic  the same three on bench/realistic.py: hand-made lists of ordinary business
             vocabulary in several languages and scripts that training never draws from
  agent_phrased  agent_realistic's questions asked in phrasings training never writes
             (bench/realistic.py PHRASED): out of the trained phrasings, a question may fail
             (no_answer, unverified); a wrong success is what must never come
  agent_client  agent and agent_ood questions where the client runs the metric tool and declares
             no names (its calls' names stay text, unguided, as over an OpenAI client's function):
             the job stops at each call, the client answers from the question's data, the job
             goes on; timed and counted on its last run (the replays of the earlier ones left out)
  drivers_ood, drivers_realistic   narrative_ood's and narrative_realistic's payloads with a
             breakdown whose metric changed, at detail `full`: the text also says the breakdown's
             drivers (the row that added most to the change, its share, the rows against it)
  report_realistic  a report job of 6 sections and its key figures over such a payload (6-8
             metrics): fully correct = every part verified on its first decode; succeeded = the job
             succeeds (parts decoded again included)
A payload goes through the API's spec first, as a job's does, an agent's question and dataset
likewise.  Each example runs the job's own workflow (workflows/) on a new session in this process
(runtime/sessions/local.py), which decodes a turn as the engine does, its output checked as a
job's is (workflows/checked.py: a part that fails is decoded again with greedy AR).  Per row:
fully_correct (verified on the first decode: a retried part counts as not correct, with the
first decode's tokens and forwards; its time includes the retry); wrong_successes (results that
come back verified and that an independent reading refutes: a narrative's or section's
written-out text read back into slots by Slots.delexicalise, not the model's own slots; an
agent's answer against the number its data fixes, and its words against those the answer forms
write (stray_words); the key figures against the data's);
facts_correct (narrative, section: in what the job returns), tool_call_ok (agent), forward
passes per generated token (every forward but the prompt's prefill: a tool result's prefill
counts, and so does each turn's commit of its last set, which the runtime does so that a session
can be saved) and tokens/s.  Prints a table, then one JSON line {"bench": "quality", "rows": [...], ...}.

    python bench/quality.py [--quick] [--n N] [--checkpoint DIR] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from domain import agent, answers, narrative, report
from domain.draws import make_payload
from domain.drivers import rendered
from domain.facts import Slots
from domain.payload import Payload, Rendered
from domain.tools import Dataset, Store
from model import checkpoint, shipped
from model.corpus import mixture
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import BadInput, NoAnswer, RequiresAction
from runtime.jobs.params import ParamsSpec
from runtime.jobs.payload import PayloadSpec
from runtime.jobs.specs import AgentSpec, NarrativeSpec, ReportSpec
from runtime.sessions.local import LocalTurns
from workflows import agent as agent_flow
from workflows import narrative as narrative_flow
from workflows import report as report_flow
from workflows import tools as tool_flow
from workflows.report import section_payload
from workflows.turn import decode_params

sys.path.insert(0, str(Path(__file__).resolve().parent))  # realistic.py beside it, as a script or `setflow bench`
import realistic  # noqa: E402

EVAL_SEED = 1  # training draws from "mixture/<seed>/<step>"; these from "quality/<seed>/<task>/<i>"
MAX_LEN = int(mixture.RECIPE["seq_len"])  # the longest example the model was trained on
MAX_LEN_OOD = int(mixture.FINETUNE["seq_len"])  # ... and of the payloads drawn from the API's grammar
TASKS = ("narrative", "agent", "section", "infill", "narrative_ood", "section_ood", "agent_ood",
         "narrative_realistic", "section_realistic", "agent_realistic", "agent_phrased", "report_realistic",
         "drivers_ood", "drivers_realistic", "agent_client")
REPORT_SECTIONS = 6  # report_realistic: a report of this many sections, one metric each, and its key figures
# set: the reference's order policy; prefix: only the confident run from the leftmost mask
# (model/policy.py choose)
SETTINGS: tuple[tuple[str, int, float | None], ...] = (
    ("ar", 1, None), ("set", 4, 0.9), ("set", 8, 0.9), ("set", 8, 0.7), ("set", 16, 0.9), ("set", 16, 0.7),
    ("prefix", 4, 0.9), ("prefix", 8, 0.9), ("prefix", 8, 0.99), ("prefix", 16, 0.99))
QUICK_SETTINGS = (("ar", 1, None), ("set", 4, 0.9), ("prefix", 8, 0.99))
N_FULL = {"narrative": 200, "agent": 200, "section": 100, "infill": 100, "narrative_ood": 200, "section_ood": 100,
          "agent_ood": 200, "narrative_realistic": 200, "section_realistic": 100, "agent_realistic": 200,
          "agent_phrased": 200, "report_realistic": 60, "drivers_ood": 200, "drivers_realistic": 200, "agent_client": 200}
N_QUICK = {"narrative": 8, "agent": 8, "section": 4, "infill": 4, "narrative_ood": 8, "section_ood": 4,
           "agent_ood": 8, "narrative_realistic": 8, "section_realistic": 4, "agent_realistic": 8,
           "agent_phrased": 8, "report_realistic": 2, "drivers_ood": 8, "drivers_realistic": 8, "agent_client": 8}
# masks opened per generation (no cost: only W are fed); a payload of the API's grammar may be long
MAX_NEW = {"narrative": 200, "section": 200, "narrative_ood": 512, "section_ood": 400, "narrative_realistic": 512,
           "section_realistic": 400, "report_realistic": 200, "drivers_ood": 512, "drivers_realistic": 512}
AGENT_SEGMENT = AgentSpec(question="?").params.max_new_tokens  # per segment (a call, the answer), as a job's


class Outcome(dict[str, Any]):
    """One example's result: ok (fully correct), generated tokens, decode forwards, seconds, and
    task-specific fields."""


def held_out(task: str, i: int, seed: int, tok: Tokenizer) -> Any:
    """Example i of a task, redrawn until it fits the training length."""
    limit = MAX_LEN if task in ("narrative", "agent", "section", "infill") else MAX_LEN_OOD
    kind, _, source = task.partition("_")
    for attempt in range(100):
        rng = random.Random(f"quality/{seed}/{task}/{i}/{attempt}")
        if kind in ("narrative", "drivers"):
            p, ref = {"": narrative.example, "ood": narrative.wild_example, "realistic": realistic.narrative_example}[
                source](rng)
            said = kind == "drivers"  # at detail full: redrawn until the payload has drivers to say
            r = rendered(p, said=said)
            n = 1 + len(tok.encode(narrative.prompt_of(r) + narrative.write(rng, narrative.narrative_form(r)))) + 1
            ex: Any = as_sent(p) if not said or r.drivers is not None else None
        elif kind == "agent":
            task_, data, pieces = {"": agent.example, "ood": agent.wild_example, "realistic": realistic.agent_example,
                                   "phrased": realistic.phrased_example,
                                   "client": agent.example if i % 2 == 0 else agent.wild_example}[source](rng)
            n = 1 + len(tok.encode(agent.prompt_text(task_.question) + "".join(t for t, _ in pieces))) + 1
            ex = (task_, data)
        elif kind == "report":
            p = realistic.payload(rng)
            n = 0  # its plan is checked against the context as a job's is
            ex = as_sent(p) if len(p.metrics) >= REPORT_SECTIONS else None
        elif kind == "section":
            s, ref = realistic.section_example(rng) if source == "realistic" else report.section_example(
                rng, wild=source == "ood")
            n = 1 + len(tok.encode(s.prompt_text() + ref)) + 1
            sent = as_sent(s.payload)
            ex = report.Section(s.title, sent) if sent is not None else None
        else:
            ex = make_payload(rng)
            ex.breakdown = None
            n = len(report.infill_tokens(tok, report.template(ex))[0])
        if n <= limit and ex is not None:
            return ex
    raise RuntimeError(f"no {task} example of at most {limit} tokens in 100 draws")


def as_sent(p: Payload) -> Payload | None:
    """The payload as a job gets it through the API (runtime/jobs/specs.py PayloadSpec: names
    canonical), or None where the API refuses it (two names one once canonical): redrawn."""
    try:
        return PayloadSpec.of(p).to_payload()
    except ValidationError:
        return None


def reads_right(r: Rendered, text: str) -> bool:
    """An independent reading of what a job returned: its written-out text (not the model's
    slots) read back into a table of one slot per distinct fact (r rendered with Slots(dedup=True);
    Slots.delexicalise, as a text model's is) and checked against the payload.  A verified result
    this refutes is a wrong success."""
    return narrative.read_back(r, r.slots.delexicalise(text)).fully_correct


def _checked(r: dict[str, Any], seconds: float, right: bool) -> Outcome:
    """A checked part's outcome: fully correct on its first decode; a wrong success when it comes
    back verified and the independent reading refutes it; the first decode's tokens and forwards;
    the facts right in what the job returns."""
    first = r.get("retried", r)
    return Outcome(ok=r["attempt"] == "first" and r["verified"], wrong=bool(r["verified"] and not right),
                   facts_ok=r["facts_ok"], facts=r["facts_total"], generated=first["tokens"], nfe=first["nfe"] - 1,
                   seconds=seconds)


def run_narrative(model: SetDLM, tok: Tokenizer, p: Payload, params: ParamsSpec, guided: bool = True,
                  drivers: bool = False) -> Outcome:
    """The narrative job (workflows/narrative.py): its first decode, checked; a failed one
    decoded again with greedy AR, as a job's is; held to the narrative's forms as a job's is by
    default (NarrativeSpec.guided); drivers: at detail `full` (the text says them)."""
    spec = NarrativeSpec(payload=PayloadSpec.of(p), params=params, allow_unverified=True, guided=guided,
                         detail="full" if drivers else "standard")
    r, seconds = _timed(lambda turns: narrative_flow.run(turns, spec), model, tok)
    return _checked(r, seconds, reads_right(rendered(p, Slots(dedup=True), drivers), r["text"]))


def run_section(model: SetDLM, tok: Tokenizer, s: report.Section, params: ParamsSpec, guided: bool = True) -> Outcome:
    """A report's section as a job writes it (workflows/report.py section: the heading given)."""
    r, seconds = _timed(lambda turns: report_flow.section(turns, s.title, s.payload, decode_params(params),
                                                          allow_unverified=True, guided=guided)[0], model, tok)
    return _checked(r, seconds, reads_right(s.render(Slots(dedup=True))[2], r["markdown"].partition("\n")[2]))


def run_report(model: SetDLM, tok: Tokenizer, p: Payload, params: ParamsSpec, guided: bool = True) -> Outcome:
    """A report job of REPORT_SECTIONS sections (one metric each) and its key figures: fully
    correct when every part is verified on its first decode; `succeeded` when the job succeeds
    (a part may have been decoded again); a wrong success when it succeeds and a section's or the
    key figures' text is refuted by the independent reading."""
    spec = ReportSpec(title="Quarterly review", data=PayloadSpec.of(p), params=params, allow_unverified=True, guided=guided,
                      outline=[{"title": m.display, "metrics": [m.key]} for m in p.metrics[:REPORT_SECTIONS]])
    data = spec.data.to_payload()
    try:
        r, seconds = _timed(lambda turns: report_flow.run(turns, spec), model, tok)
    except BadInput:  # its plan does not fit the context: refused at submission, as a job would be
        return Outcome(ok=False, succeeded=False, wrong=False, facts_ok=0, facts=0, generated=0, nfe=0, seconds=0.0)
    parts = [*r["sections"], *([r["figures"]] if r["figures"] else [])]
    right = all(reads_right(report.Section(x["title"], section_payload(data, [m.key])).render(Slots(dedup=True))[2],
                            x["markdown"].partition("\n")[2])
                for x, m in zip(r["sections"], data.metrics)) and (r["figures"] is None or r["figures"]["exact"])
    firsts = [x.get("retried", x) for x in parts]
    return Outcome(ok=all(x["attempt"] == "first" and x["verified"] for x in parts), succeeded=r["verified"],
                   wrong=bool(r["verified"] and not right), facts_ok=sum(x.get("facts_ok", 0) for x in r["sections"]),
                   facts=sum(x["facts_total"] for x in r["sections"]), generated=sum(x["tokens"] for x in firsts),
                   nfe=sum(x["nfe"] - 1 for x in firsts), seconds=seconds)


def run_agent(model: SetDLM, tok: Tokenizer, ex: tuple[agent.Task, Dataset | Store],
              params: ParamsSpec, guided: bool = True) -> Outcome:
    """An agent question: over the sample dataset, or (agent_ood) a store of any names, read as
    a tenant's dataset is; its metric calls guided as a job's are by default (AgentSpec.guided)."""
    task, data = ex
    if isinstance(data, Dataset):
        source: dict[str, Any] = {"dataset_seed": data.seed}
        tables: dict[str, list[list[str]]] = {}
    else:
        source = {"dataset": "ood"}
        tables = {"ood": [[*k, v] for k, v in data.values.items()]}
    spec = AgentSpec(question=task.question, params=params, allow_unverified=True, guided=guided, **source)
    try:
        r, seconds = _timed(lambda turns: agent_flow.run(turns, spec), model, tok, tables)
    except NoAnswer:  # a job without an answer fails (no_answer): not correct, and no success
        return Outcome(ok=False, tool_ok=False, wrong=False, generated=0, nfe=0, seconds=0.0)
    return _answered(task, r, seconds)


_WORD = re.compile(r"[^\W\d_]+")  # a run of letters
#: the words the answer forms write outside their fields, and the units': with the names of a
#: task's own final answer, every word a right answer holds
FORM_WORDS = frozenset(w.lower() for text in (*agent.ANSWERS.values(), *answers.UNITS)
                       for w in _WORD.findall(re.sub(r"\{\w+\}", " ", text)))


def stray_words(task: agent.Task, answer: str) -> list[str]:
    """The words of an answer (runs of letters, any case) that neither the answer forms nor the
    task's final answer (its names, its unit) write: an independent reading of its words, by
    vocabulary, not by the checker's reader of the forms.  "Total smmmm pop ..." -> ["smmmm"]."""
    known = FORM_WORDS | {w.lower() for w in _WORD.findall(task.final)}
    return [w for w in _WORD.findall(answer) if w.lower() not in known]


def _answered(task: agent.Task, r: dict[str, Any], seconds: float) -> Outcome:
    """An agent job's outcome: its answer against the one the data fixes and its words against
    the answer forms' (stray_words): independent readings, a verified answer either refutes a
    wrong success; the first decode's tokens and forwards (a retry is the last turn)."""
    c = answers.check(task, r["text"])
    retried = r["attempt"] == "ar_retry"
    turns = r["turns"][:-1] if retried else r["turns"]
    right = c.answer_ok and not stray_words(task, r["answer"] or "")
    return Outcome(ok=c.answer_ok and not retried, tool_ok=c.tool_call_ok, wrong=bool(r["verified"] and not right),
                   generated=sum(t["tokens"] for t in turns), nfe=sum(t["nfe"] for t in turns) - 1, seconds=seconds)


def run_agent_client(model: SetDLM, tok: Tokenizer, ex: tuple[agent.Task, Dataset | Store],
                     params: ParamsSpec, guided: bool = True) -> Outcome:
    """An agent question whose client runs the metric tool (agent_client): at each call the job
    stops (RequiresAction), the client answers from the question's data, and the job runs again
    with the outputs so far, as a resumed job replays its turns."""
    task, data = ex
    spec = AgentSpec(question=task.question, params=params, allow_unverified=True, guided=guided,
                     client_tools=["metric"])
    outputs: dict[str, str] = {}
    for _ in range(spec.max_calls + 1):
        try:
            t0 = time.perf_counter()
            r = agent_flow.run(LocalTurns(model, tok, tool_outputs=dict(outputs)), spec)
            seconds = time.perf_counter() - t0
            break
        except RequiresAction as e:
            call = e.calls[0]
            outputs[call["id"]] = tool_flow.run_call(call["call"], data).result
        except NoAnswer:
            return Outcome(ok=False, tool_ok=False, wrong=False, generated=0, nfe=0, seconds=0.0)
    else:  # more stops than calls allowed: the call limit ends a job before this
        raise RuntimeError(f"{task.question!r}: more client calls than max_calls")
    return _answered(task, r, seconds)


def paired(model: SetDLM, tok: Tokenizer, examples: list[Any], params: ParamsSpec,
           setting: tuple[str, str, int, float | None]) -> list[dict[str, Any]]:
    """A task's examples (every task but infill) each decoded guided and unguided, in turn (which goes
    first alternates): the two rows (setting: task, policy, W, tau; "guided" set), the guided one
    with its time per generated token over the unguided's, the median of the per-example ratios."""
    run = RUNNERS[setting[0]]
    outs: dict[bool, list[Outcome]] = {True: [], False: []}
    for i, ex in enumerate(examples):
        for guided in (True, False) if i % 2 == 0 else (False, True):
            outs[guided].append(run(model, tok, ex, params, guided=guided))
    rows = [{**row(*setting, outs[g]), "guided": g} for g in (True, False)]
    per_token = [(g["seconds"] / max(g["generated"], 1)) / (u["seconds"] / max(u["generated"], 1))
                 for g, u in zip(outs[True], outs[False])]
    rows[0]["time_per_token_vs_unguided"] = round(statistics.median(per_token), 3)
    return rows


def run_infill(model: SetDLM, tok: Tokenizer, p: Payload, params: ParamsSpec) -> Outcome:
    """A payload's key figures, as a report fills them: one infill turn."""
    r, seconds = _timed(lambda turns: report_flow.figures(turns, p, decode_params(params), allow_unverified=True),
                        model, tok)
    first = r.get("retried", r)  # the first decode's turn
    return Outcome(ok=r["exact"] and "retried" not in r, wrong=bool(r["verified"] and not r["exact"]),
                   generated=first["tokens"], nfe=first["nfe"] - 1, seconds=seconds)


def _timed(job: Callable[[LocalTurns], dict[str, Any]], model: SetDLM, tok: Tokenizer,
           datasets: dict[str, list[list[str]]] | None = None) -> tuple[dict[str, Any], float]:
    """job's result on a new session in this process, and its seconds.  A turn's nfe counts its
    forwards: its input's prefill, its steps, and the commit of its last set."""
    t0 = time.perf_counter()
    r = job(LocalTurns(model, tok, datasets=datasets))
    return r, time.perf_counter() - t0


RUNNERS: dict[str, Callable[..., Outcome]] = {
    "infill": run_infill, "report_realistic": run_report,
    **{f"{kind}{source}": run for kind, run in (("narrative", run_narrative), ("section", run_section), ("agent", run_agent))
       for source in ("", "_ood", "_realistic")}, "agent_phrased": run_agent,
    **{f"drivers{source}": partial(run_narrative, drivers=True) for source in ("_ood", "_realistic")},
    "agent_client": run_agent_client}


def row(task: str, policy: str, W: int, tau: float | None, outs: list[Outcome]) -> dict[str, Any]:
    gen = sum(o["generated"] for o in outs)
    secs = sum(o["seconds"] for o in outs)
    r: dict[str, Any] = {"task": task, "policy": policy, "W": W, "tau": tau, "n": len(outs),
                         "fully_correct": round(sum(o["ok"] for o in outs) / len(outs), 4),
                         "wrong_successes": sum(o["wrong"] for o in outs)}
    if task.startswith("report"):
        r["succeeded"] = round(sum(o["succeeded"] for o in outs) / len(outs), 4)
    if task.startswith(("narrative", "section", "report", "drivers")):
        r["facts_correct"] = round(sum(o["facts_ok"] for o in outs) / max(1, sum(o["facts"] for o in outs)), 4)
    if task.startswith("agent"):
        r["tool_call_ok"] = round(sum(o["tool_ok"] for o in outs) / len(outs), 4)
    r.update(tokens=gen, nfe_per_token=round(sum(o["nfe"] for o in outs) / max(gen, 1), 4),
             tokens_per_s=round(gen / secs, 1) if secs else None)
    return r


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, read off the rows: W = 1 quality, and per task the set-decoding
    setting (policy set or prefix) with the fewest forwards per token whose fully-correct rate is
    within 1 point of W = 1."""
    out: dict[str, Any] = {}
    rows = [r for r in rows if r.get("guided", True)]  # --pair: the guided rows, as jobs decode
    for task in TASKS:
        ar = next((r for r in rows if r["task"] == task and r["policy"] == "ar"), None)
        if ar is None:
            continue
        ok = [r for r in rows if r["task"] == task and r["policy"] != "ar"
              and r["fully_correct"] >= ar["fully_correct"] - 0.01]
        best = min(ok, key=lambda r: r["nfe_per_token"], default=None)
        out[task] = {"ar_fully_correct": ar["fully_correct"], "ar_nfe_per_token": ar["nfe_per_token"],
                     "best_set": None if best is None else {
                         "policy": best["policy"], "W": best["W"], "tau": best["tau"],
                         "fully_correct": best["fully_correct"],
                         # none where AR wrote nothing (every question without an answer: agent_phrased)
                         "nfe_ratio": round(best["nfe_per_token"] / ar["nfe_per_token"], 3) if ar["nfe_per_token"] else None,
                         "speedup_tokens_per_s": round(best["tokens_per_s"] / ar["tokens_per_s"], 2)
                         if ar["tokens_per_s"] and best["tokens_per_s"] else None}}
    return out


COLUMNS = (("task", "task", 9), ("policy", "policy", 6), ("W", "W", 2), ("tau", "tau", 4), ("n", "n", 4),
           ("fully_correct", "fully", 6), ("wrong_successes", "wrong", 5), ("facts_correct", "facts", 6),
           ("tool_call_ok", "call", 6),
           ("nfe_per_token", "nfe/tok", 7), ("tokens_per_s", "tok/s", 7), ("guided", "guided", 6),
           ("time_per_token_vs_unguided", "time/tok vs unguided", 20))


def table_line(r: dict[str, Any] | None) -> str:
    if r is None:
        return "  ".join(f"{head:>{w}}" for _, head, w in COLUMNS)
    cell = {"tau": "off" if r["tau"] is None else r["tau"]}
    return "  ".join(f"{cell.get(k, r.get(k, '-'))!s:>{w}}" for k, _, w in COLUMNS)


def main(argv: list[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few examples per task, AR and one set setting: < 1 min")
    ap.add_argument("--n", type=int, default=None, help="examples per task (default: 200/200/100/100, quick 8/8/4/4)")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated subset of {','.join(TASKS)}")
    ap.add_argument("--checkpoint", type=Path, default=shipped.SHIPPED,
                    help="checkpoint folder (default: the shipped model)")
    ap.add_argument("--seed", type=int, default=EVAL_SEED, help="held-out example seed (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as in a worker)")
    ap.add_argument("--unguided", action="store_true",
                    help="the model's tokens as it writes them: agent calls unguided (AgentSpec guided=False), "
                         "narratives, sections and reports not held to the forms (NarrativeSpec guided=False)")
    ap.add_argument("--pair", action="store_true",
                    help="every task but infill: each example guided and unguided in turn, a row each, and the "
                         "guided row's time per token over the unguided's (median of the paired ratios)")
    ap.add_argument("--out-json", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    if args.pair and args.unguided:
        ap.error("--pair runs both ways: drop --unguided")
    tasks = [t for t in args.tasks.split(",") if t]
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        ap.error(f"unknown task(s) {bad}; choose from {', '.join(TASKS)}")
    if args.threads < 1 or (args.n is not None and args.n < 1):
        ap.error("--threads and --n must be >= 1")
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    model, tok = shipped.load(args.checkpoint)
    settings = QUICK_SETTINGS if args.quick else SETTINGS
    sizes = {t: args.n or (N_QUICK if args.quick else N_FULL)[t] for t in tasks}
    print(f"checkpoint {args.checkpoint} ({model.cfg.name}, fingerprint {checkpoint.fingerprint(model)[:12]}); "
          f"held-out seed {args.seed}; threads {args.threads}; decoding "
          f"{'both ways' if args.pair else 'unguided' if args.unguided else 'guided'}; "
          "nfe/tok counts every forward but the prompt's prefill",
          flush=True)
    print(table_line(None))
    rows = []
    for task in tasks:
        examples = [held_out(task, i, args.seed, tok) for i in range(sizes[task])]
        for policy, W, tau in settings:
            params = ParamsSpec.model_validate({"policy": policy, "window": W, "tau": tau,
                                            "max_new_tokens": MAX_NEW.get(task, AGENT_SEGMENT)})
            if args.pair and task != "infill":
                rows += paired(model, tok, examples, params, (task, policy, W, tau))
                print("\n".join(table_line(r) for r in rows[-2:]), flush=True)
                continue
            run = RUNNERS[task] if task == "infill" else partial(RUNNERS[task], guided=not args.unguided)
            outs = [run(model, tok, ex, params) for ex in examples]
            rows.append(row(task, policy, W, tau, outs))
            print(table_line(rows[-1]), flush=True)
    result = {"bench": "quality", "rows": rows, "targets": targets(rows),
              "checkpoint": str(args.checkpoint), "fingerprint": checkpoint.fingerprint(model)[:16],
              "seed": args.seed, "guided": "both" if args.pair else not args.unguided, "threads": args.threads,
              "wall_s": round(time.perf_counter() - t_start, 1)}
    print("targets: " + json.dumps(result["targets"]), file=sys.stderr)
    if args.out_json is not None:
        args.out_json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
