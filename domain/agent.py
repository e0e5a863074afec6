"""Agent transcripts with tool calls: a question about metrics or arithmetic -> tool calls ->
a final answer that uses their results.  Deterministic by seed.

    Q: By how much did churn in EMEA change from 2026-Q2 to 2026-Q3, in percent?
    <call>metric("churn", "EMEA", "2026-Q2")</call><result>2.5</result>
    <call>metric("churn", "EMEA", "2026-Q3")</call><result>3.1</result>
    <call>calc("(3.1-2.5)/2.5*100")</call><result>24</result>
    A: Churn in EMEA changed by 24% from 2026-Q2 to 2026-Q3.

The model writes the calls and the answer; the runtime writes each `<result>...</result>` (in
training those tokens are given, not predicted).  Metric values come from a `Dataset`, a
deterministic function of (seed, metric, region, period): training draws a fresh dataset per
example, so the model learns to copy results rather than to memorise them.

The tools' semantics (`calc`, `format_number`, `Dataset`, the call syntax) are domain/tools.py,
so that generated results and the runtime's tools cannot disagree; workflows/ wraps them for the
agent loop, domain/guide.py keeps its calls' copies right.  How a transcript and its answer are
read back (`check` against a task, `verify` with none) is domain/answers.py.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from domain import draws, grammar
from domain.payload import METRIC, METRICS, PERIODS, REGIONS
from domain.tools import (
    ARG_RE,
    CALL,
    END_CALL,
    END_RESULT,
    NUMBER,
    RESULT,
    Dataset,
    Store,
    calc,
    call_text,
    error_result,
    format_number,
    held_names,
    metric_name,
    no_row,
    run_call,
)

# ---- generation ---------------------------------------------------------------------------

#: the answers training writes, one form per kind of question: every word an answer holds outside
#: its facts is one of these (domain/answers.py form_problems reads an answer back against them).
#: Its fields: a name the question says ({metric}, {region}, {region2}, {period}, {period2}), two
#: or more of them as a list ({regions}: "A, B and C"), the result ({number}) and its unit
#: ({unit}: " k USD", or nothing where the rows have none)
ANSWERS = {
    "lookup": "{metric} in {region} in {period} was {number}{unit}.",
    "change": "{metric} in {region} changed by {number}% from {period} to {period2}.",
    "total": "Total {metric} across {regions} in {period} was {number}{unit}.",
    "diff": "{metric} in {region} was {number}{unit} higher than in {region2}.",
    "arith": "The result is {number}.",
}


@dataclass
class Task:
    question: str
    calls: list[str]  # the expected call texts, in order
    answer: str  # the expected final number
    final: str  # the final answer line (without the "A: " prefix)


def _unit(key: str) -> str:
    return METRIC[key][2]


def make_task(rng: random.Random, data: Dataset) -> Task:
    kind = rng.choice(("lookup", "change", "total", "diff", "arith", "arith"))
    key = rng.choice([m[0] for m in METRICS])
    m = metric_name(key)  # as the question names it, and so the calls and the answer
    if kind == "lookup":
        r, p = rng.choice(REGIONS), rng.choice(PERIODS)
        v = data.lookup(key, r, p)
        q = rng.choice((f"What was {m} in {r} in {p}?", f"Look up {m} for {r}, {p}."))
        return Task(q, [call_text("metric", m, r, p)], v,
                    ANSWERS["lookup"].format(metric=m, region=r, period=p, number=v, unit=f" {_unit(key)}"))
    if kind == "change":
        r = rng.choice(REGIONS)
        p1, p2 = sorted(rng.sample(PERIODS[:8], 2))
        v1, v2 = data.lookup(key, r, p1), data.lookup(key, r, p2)
        expr = f"({v2}-{v1})/{v1}*100"
        res = calc(expr)
        q = f"By how much did {m} in {r} change from {p1} to {p2}, in percent?"
        return Task(q, [call_text("metric", m, r, p1), call_text("metric", m, r, p2), call_text("calc", expr)],
                    res, ANSWERS["change"].format(metric=m, region=r, number=res, period=p1, period2=p2))
    if kind == "total":
        regions, p = rng.sample(REGIONS, rng.randint(2, 3)), rng.choice(PERIODS)
        vals = [data.lookup(key, r, p) for r in regions]
        expr = "+".join(vals)
        res = calc(expr)
        where = ", ".join(regions[:-1]) + " and " + regions[-1]
        q = f"What was the total {m} across {where} in {p}?"
        return Task(q, [call_text("metric", m, r, p) for r in regions] + [call_text("calc", expr)], res,
                    ANSWERS["total"].format(metric=m, regions=where, period=p, number=res, unit=f" {_unit(key)}"))
    if kind == "diff":
        r1, r2 = rng.sample(REGIONS, 2)
        p = rng.choice(PERIODS)
        v1, v2 = data.lookup(key, r1, p), data.lookup(key, r2, p)
        expr = f"{v1}-{v2}"
        res = calc(expr)
        q = f"How much higher was {m} in {r1} than in {r2} in {p}?"
        return Task(q, [call_text("metric", m, r1, p), call_text("metric", m, r2, p), call_text("calc", expr)],
                    res, ANSWERS["diff"].format(metric=m, region=r1, number=res, unit=f" {_unit(key)}", region2=r2))
    # plain arithmetic
    a, b = rng.randint(2, 9999), rng.randint(2, 999)
    op = rng.choice("+-*/")
    if rng.random() < 0.3:
        c = rng.randint(2, 999)
        op2 = rng.choice("+-")
        expr = f"({a}{op}{b}){op2}{c}"
    else:
        expr = f"{a}{op}{b}"
    res = calc(expr)
    shown = expr.replace("*", " * ").replace("/", " / ").replace("+", " + ").replace("-", " - ")
    q = rng.choice((f"What is {shown}?", f"Compute {shown}.", f"Calculate {shown}."))
    return Task(q, [call_text("calc", expr)], res, ANSWERS["arith"].format(number=res))


def _wild_arg(rng: random.Random) -> str:
    """A name as a call's argument holds it: the API's name grammar, lower case for a metric; not
    a bare number (an answer that restates it could not be told from its result by a reader)."""
    while True:
        name = draws.wild_name(rng)
        if not NUMBER.fullmatch(name):
            return name


def wild_task(rng: random.Random) -> tuple[Task, Store]:
    """A question over a store whose metrics, regions and periods are drawn from the API's
    grammar (any names, periods, numbers of 1-9 digits with up to 2 decimals), not the corpus's
    lists: the same four kinds as make_task's, the calls copying the names from the question."""
    metric = _wild_arg(rng).lower()
    regions = list(dict.fromkeys(_wild_arg(rng) for _ in range(3)))
    periods = list(dict.fromkeys(draws.wild_period(rng) for _ in range(2)))
    dec = rng.choice((0, 0, 1, 2))
    values: dict[tuple[str, str, str], str] = {}

    def value(r: str, p: str) -> str:
        if (metric, r, p) not in values:
            v = draws.wild_number(rng, rng.randint(1, 6), dec)
            values[metric, r, p] = format_number(v)
        return values[metric, r, p]

    tail = ""  # a tenant's table gives no unit: an answer that wrote one would make it up
    kind = rng.choice(("lookup", "change", "total", "diff"))
    r, p = regions[0], periods[0]
    if kind == "lookup" or (kind == "change" and len(periods) < 2) or (kind != "lookup" and len(regions) < 2):
        v = value(r, p)
        q = rng.choice((f"What was {metric} in {r} in {p}?", f"Look up {metric} for {r}, {p}."))
        return Task(q, [call_text("metric", metric, r, p)], v,
                    ANSWERS["lookup"].format(metric=metric, region=r, period=p, number=v, unit=tail)), Store(values)
    if kind == "change":
        p1, p2 = periods
        v1, v2 = value(r, p1), value(r, p2)
        if float(v1) == 0:
            return wild_task(rng)
        expr = f"({v2}-{v1})/{v1}*100"
        res = calc(expr)
        q = f"By how much did {metric} in {r} change from {p1} to {p2}, in percent?"
        return Task(q, [call_text("metric", metric, r, p1), call_text("metric", metric, r, p2), call_text("calc", expr)],
                    res, ANSWERS["change"].format(metric=metric, region=r, number=res, period=p1, period2=p2)), Store(values)
    if kind == "total":
        vals = [value(x, p) for x in regions]
        expr = "+".join(vals)
        res = calc(expr)
        where = ", ".join(regions[:-1]) + " and " + regions[-1]
        q = f"What was the total {metric} across {where} in {p}?"
        return Task(q, [call_text("metric", metric, x, p) for x in regions] + [call_text("calc", expr)], res,
                    ANSWERS["total"].format(metric=metric, regions=where, period=p, number=res, unit=tail)), Store(values)
    r1, r2 = regions[:2]
    v1, v2 = value(r1, p), value(r2, p)
    expr = f"{v1}-{v2}"
    res = calc(expr)
    q = f"How much higher was {metric} in {r1} than in {r2} in {p}?"
    return Task(q, [call_text("metric", metric, r1, p), call_text("metric", metric, r2, p), call_text("calc", expr)],
                res, ANSWERS["diff"].format(metric=metric, region=r1, number=res, unit=tail, region2=r2)), Store(values)


def transcript(task: Task, data: Dataset | Store) -> list[tuple[str, bool]]:
    """The assistant's side after the prompt, as (text, given) pieces: given pieces are the
    runtime's tool results."""
    out: list[tuple[str, bool]] = []
    for c in task.calls:
        out.append((f"{CALL}{c}{END_CALL}", False))
        out.append((f"{RESULT}{run_call(c, data)}{END_RESULT}\n", True))
    out.append((f"A: {task.final}", False))
    return out


def prompt_text(question: str) -> str:
    return f"Q: {question}\n"


def example(rng: random.Random) -> tuple[Task, Dataset, list[tuple[str, bool]]]:
    data = Dataset(rng.randrange(2**31))
    task = make_task(rng, data)
    return task, data, transcript(task, data)


def wild_example(rng: random.Random) -> tuple[Task, Store, list[tuple[str, bool]]]:
    task, store = wild_task(rng)
    return task, store, transcript(task, store)


def slipped(task: Task, store: Store, rng: random.Random) -> list[tuple[str, bool]]:
    """The transcript with one metric call first miscopied (a character of one name replaced,
    dropped or added, as the model slips: "Xfers 32" -> "Xfgis 32", "st1m7" -> "s1m7"), its error
    result as the runtime's tenant table gives it (no_row, with the question: the hint), then the
    call mended.  The slip and its result are given (no loss: the model learns to mend a call, not
    to miscopy one); the rest is transcript()'s."""
    pieces = transcript(task, store)
    at = [i for i, c in enumerate(task.calls) if c.startswith("metric(")]
    held = held_names(store.values)
    for _ in range(20):  # a slip that is still a held name is no slip: another draw
        i = rng.choice(at)
        args = ARG_RE.findall(task.calls[i])
        f = rng.randrange(3)
        wrong = _slip(args[f], rng)
        if wrong and wrong == grammar.canonical(wrong) and wrong not in held[f]:  # as the runtime reads it
            args[f] = wrong
            call = call_text("metric", *args)
            said = error_result(str(no_row((args[0], args[1], args[2]), held, task.question)))
            slip = [(f"{CALL}{call}{END_CALL}", True), (f"{RESULT}{said}{END_RESULT}\n", True)]
            return pieces[:2 * i] + slip + pieces[2 * i:]
    return pieces


def _slip(name: str, rng: random.Random) -> str:
    """name with one character replaced, dropped or added (a letter or digit)."""
    j = rng.randrange(len(name))
    c = rng.choice(string.ascii_letters + string.digits)
    kind = rng.choice(("replace", "replace", "drop", "add"))
    if kind == "replace":
        return name[:j] + c + name[j + 1:]
    if kind == "drop":
        return name[:j] + name[j + 1:]
    return name[:j] + c + name[j:]
