"""bench/realistic.py: deterministic by seed; its vocabulary clean (NFC, 1-80 characters, no control
characters, canonical), of several scripts, and disjoint from what training draws; payloads with
distinct names and one number format per metric; tables the API takes; agent answers right
(recomputed here from the table, in decimals)."""

import itertools
import random
import re
import unicodedata
from decimal import Decimal

from bench import realistic as R
from domain import agent, answers, report
from domain.draws import CUSTOM_METRICS
from domain.grammar import canonical
from domain.guide import CallNames
from domain.payload import METRICS, PERIODS, REGIONS, SEGMENTS, STYLES, TENANTS, Payload
from domain.tools import Store, parse_call
from runtime.jobs.datasets import parse_json

NAMES = {"company": R.COMPANIES, "product": R.PRODUCTS, "place": R.PLACES, "metric": tuple(m.name for m in R.METRICS)}
EVERYTHING = (*itertools.chain(*NAMES.values()), *R.PERIODS, *R.SECTION_TITLES, *(m.unit for m in R.METRICS))
# the grammar the training data was drawn from before the API was widened (domain/narrative.py
# NAME_RE, PERIOD_RE: wild_name, wild_period and wild_task draw any string of it)
OLD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 .&'/-]{0,39}")
OLD_PERIOD = re.compile(r"[A-Za-z0-9-]{1,16}")
NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]{1,6})?")  # as the runtime writes one: no +, separators, leading 0s


def _digits(x: str) -> int:
    whole, _, dec = x.lstrip("-").partition(".")
    return len((whole + dec).lstrip("0") or "0")


def _decimals(x: str) -> int:
    return len(x.partition(".")[2])


def test_seed_reproducibility() -> None:
    def draw(seed: int) -> tuple[object, ...]:
        def rng(what: str) -> random.Random:
            return random.Random(f"realistic/{seed}/{what}")
        t = R.table(rng("table"))
        return (R.payload(rng("payload")), R.section(rng("section")), t, R.question(rng("question"), t),
                R.task(rng("task")), R.narrative_example(rng("narrative")), R.section_example(rng("sec")),
                R.agent_example(rng("agent")))
    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


def test_the_vocabulary_is_clean_text() -> None:
    assert min(len(R.COMPANIES), len(R.PRODUCTS), len(R.PLACES)) >= 40
    assert len(R.METRICS) >= 30 and len(R.PERIODS) >= 25 and len(R.SECTION_TITLES) >= 20
    for x in EVERYTHING:
        assert 1 <= len(x) <= 80 and unicodedata.normalize("NFC", x) == x, x
        assert not any(unicodedata.category(c).startswith("C") for c in x), x  # no control, format or unassigned
        assert canonical(x) == x, x  # no spaces at the ends, none doubled
        assert not set(x) & set('|:;"<>'), x  # the payload's and a tool call's separators
    assert all(len(t) <= 60 for t in R.SECTION_TITLES)  # a report outline's title (runtime/jobs/specs.py)
    names = [n for ns in NAMES.values() for n in ns]
    assert len(set(names)) == len(names), "each name once, in one list: a payload's names are distinct"
    assert len(set(R.PERIODS)) == len(R.PERIODS) and all(len(f) >= 2 for f in R.PERIOD_FAMILIES)
    assert sum(60 <= len(n) <= 80 for n in names) >= 4
    for mark in "&'/-.(),":
        assert any(mark in n for n in names), mark
    # a clause is found by its name: none is another's start followed by a mark ("Berlin", "Berlin-Ost")
    for a, b in itertools.permutations(names, 2):
        assert not (b.startswith(a) and not b[len(a)].isalnum()), (a, b)


def test_the_vocabulary_holds_many_scripts() -> None:
    scripts = {unicodedata.name(c).split()[0] for x in EVERYTHING for c in x if c.isalpha()}
    assert {"LATIN", "CJK", "HIRAGANA", "KATAKANA", "HANGUL", "CYRILLIC", "ARABIC", "DEVANAGARI", "GREEK",
            "HEBREW", "THAI"} <= scripts
    latin = [n for ns in NAMES.values() for n in ns if all(c.isascii() for c in n)]
    assert len(latin) < 0.7 * sum(map(len, NAMES.values()))  # accents and other scripts are no rarity
    not_ascii = sum(any(not c.isascii() for c in (p.tenant + "".join(p.names())))
                    for p in (R.payload(random.Random(f"scripts/{i}")) for i in range(200)))
    assert not_ascii > 100


def test_no_name_is_one_training_draws() -> None:
    training = {*TENANTS, *REGIONS, *SEGMENTS, *(m[0] for m in METRICS),
                *(m[1] for m in METRICS), *(m[0] for m in CUSTOM_METRICS),
                *(t for ts in report.TITLES.values() for t in ts)}
    training = {t.casefold() for t in training}
    for x in (*itertools.chain(*NAMES.values()), *R.SECTION_TITLES):
        assert x.casefold() not in training, x
    assert not set(R.PERIODS) & set(PERIODS)
    # and most are outside the grammar wild_name and wild_period drew from (so no draw can be one)
    names = [*itertools.chain(*NAMES.values()), *R.SECTION_TITLES]
    assert sum(not OLD_NAME.fullmatch(n) for n in names) > len(names) / 2
    assert sum(not OLD_PERIOD.fullmatch(p) for p in R.PERIODS) > 0.8 * len(R.PERIODS)
    units = {m.unit for m in R.METRICS} - {m[2] for m in METRICS} - {m[1] for m in CUSTOM_METRICS}
    assert len(units) > 0.75 * len({m.unit for m in R.METRICS})


def _check_payload(p: Payload, max_metrics: int) -> None:
    assert 1 <= len(p.metrics) <= max_metrics and p.style in STYLES
    assert p.tenant in R.COMPANIES and p.period in R.PERIODS
    assert all(m.custom and m.key in NAMES["metric"] for m in p.metrics)
    names = [p.tenant, *p.names()]
    assert len(set(names)) == len(names), names
    unit = {m.name: m.unit for m in R.METRICS}
    dec = {}
    for m in p.metrics:
        assert m.unit == unit[m.key]
        numbers = [x for x in (m.value, m.prev, m.target) if x is not None]
        assert len({_decimals(x) for x in numbers}) == 1, (m.key, numbers)  # one format per metric
        dec[m.key] = _decimals(m.value)
        for x in numbers:
            assert NUMBER.fullmatch(x) and _digits(x) <= 15 and not (x.startswith("-") and Decimal(x) == 0), x
    if p.breakdown is not None:
        b = p.breakdown
        assert b.metric in dec and 1 <= len(b.rows) <= 12
        assert all(r[0] in (R.PLACES if b.kind == "region" else R.PRODUCTS) for r in b.rows), b
        for _, v, pv in b.rows:
            assert NUMBER.fullmatch(v) and NUMBER.fullmatch(pv) and _decimals(v) == _decimals(pv) == dec[b.metric]
            assert _digits(v) <= 15 and _digits(pv) <= 15


def test_payloads_hold_distinct_names_and_numbers_as_the_runtime_writes_them() -> None:
    payloads = [R.payload(random.Random(f"realistic/1/{i}")) for i in range(600)]
    for p in payloads:
        _check_payload(p, 8)
    numbers = [x for p in payloads for m in p.metrics for x in (m.value, m.prev, m.target) if x is not None]
    assert any(x.startswith("-") for x in numbers)  # a loss, a negative margin
    assert max(map(_digits, numbers)) >= 12 and max(map(_decimals, numbers)) >= 4  # a few big or fine ones ...
    assert sorted(map(_digits, numbers))[len(numbers) // 2] <= 6  # ... most of ordinary size
    assert {len(p.metrics) for p in payloads} == set(range(1, 9))
    rows = [len(p.breakdown.rows) for p in payloads if p.breakdown is not None]
    assert 0.4 < len(rows) / len(payloads) < 0.6 and min(rows) == 1 and max(rows) >= 10
    with_target = [m.target is not None for p in payloads for m in p.metrics]
    assert 0.5 < sum(with_target) / len(with_target) < 0.7


def test_sections_have_a_title_and_at_most_two_metrics() -> None:
    for i in range(200):
        s = R.section(random.Random(f"realistic/s/{i}"))
        assert isinstance(s, report.Section) and s.title in R.SECTION_TITLES
        _check_payload(s.payload, 2)


def test_a_table_is_what_the_api_takes() -> None:
    for i in range(100):
        t = R.table(random.Random(f"realistic/t/{i}"))
        assert parse_json(t) == [[r["metric"], r["region"], r["period"], r["value"]] for r in t["rows"]]
        keys = {(r["metric"], r["region"], r["period"]) for r in t["rows"]}
        fields = [sorted({k[f] for k in keys}) for f in range(3)]
        assert len(keys) == len(t["rows"]) == len(list(itertools.product(*fields)))  # every combination, once
        assert all(_decimals(r["value"]) <= 2 and _digits(r["value"]) <= 12 for r in t["rows"])
        assert any(fields[2] == sorted(f[j:j + len(fields[2])]) for f in R.PERIOD_FAMILIES for j in range(len(f)))


def _plain(x: Decimal) -> str:
    """x to 2 decimals, trailing zeros dropped (domain/agent.py format_number's output)."""
    s = f"{x.quantize(Decimal('0.01')):f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _expected(question: str, t: R.Table) -> tuple[str, Decimal, Decimal]:
    """(kind, the exact answer, the tolerance), found by writing every question of the four
    phrasings over the table's own names and recomputing its answer in decimals."""
    value = {(r["metric"], r["region"], r["period"]): Decimal(r["value"]) for r in t["rows"]}
    metrics, names, periods = ([*dict.fromkeys(k[f] for k in value)] for f in range(3))
    found = []
    for m, p in itertools.product(metrics, periods):
        for r in names:
            if question in (f"What was {m} in {r} in {p}?", f"Look up {m} for {r}, {p}."):
                found.append(("lookup", value[m, r, p], Decimal(0)))
            for p2 in periods:
                if question == f"By how much did {m} in {r} change from {p} to {p2}, in percent?":
                    v1, v2 = value[m, r, p], value[m, r, p2]
                    assert v1 > 0 and periods.index(p) < periods.index(p2)
                    found.append(("change", (v2 - v1) / v1 * 100, Decimal("0.005")))
        for k in (2, 3):
            for where in itertools.permutations(names, k):
                if question == f"What was the total {m} across {', '.join(where[:-1])} and {where[-1]} in {p}?":
                    found.append(("total", sum(value[m, r, p] for r in where), Decimal(0)))
        for r1, r2 in itertools.permutations(names, 2):
            if question == f"How much higher was {m} in {r1} than in {r2} in {p}?":
                found.append(("diff", value[m, r1, p] - value[m, r2, p], Decimal(0)))
    assert len(found) == 1, (question, found)
    return found[0]


def test_agent_answers_are_right() -> None:
    kinds = set()
    for i in range(300):
        rng = random.Random(f"realistic/q/{i}")
        t = R.table(rng)
        q, answer = R.question(rng, t)
        assert 1 <= len(q) <= 400 and not re.search(r"[\x00-\x1f<>]", q)  # an agent job's question
        kind, exact, tolerance = _expected(q, t)
        kinds.add(kind)
        if kind == "lookup":
            assert Decimal(answer) == exact and answer in (r["value"] for r in t["rows"]), (q, answer)  # as the table writes it
        elif tolerance:
            assert answer == _plain(Decimal(answer)) and abs(Decimal(answer) - exact) <= tolerance, (q, answer, exact)
        else:
            assert answer == _plain(exact), (q, answer, exact)
    assert kinds == {"lookup", "change", "total", "diff"}


def test_a_task_runs_as_agent_ood_does() -> None:
    """task(): the (Task, Store) pair wild_task gives; its reference transcript passes the agent's
    checker, and every name a call copies is one the question holds whole (guided calls)."""
    for i in range(200):
        task, store, pieces = R.agent_example(random.Random(f"realistic/a/{i}"))
        assert isinstance(task, agent.Task) and isinstance(store, Store)
        c = answers.check(task, "".join(text for text, _ in pieces))
        assert c.tool_call_ok and c.answer_ok, (task, c)
        names = CallNames(task.question)
        for call in task.calls:
            tool, args = parse_call(call)
            if tool == "metric":
                assert all(names.names(f, a) for f, a in enumerate(args)), call
                assert store.lookup(*args) == store.values[tuple(args)]
