"""Dashboard narratives: a metrics payload -> a narrative paragraph, and the checker that reads
the facts back out of a text.  Deterministic by seed.

The payload is a few text lines (the prompt):

    tenant: Northwind | period: 2026-Q3 | style: brief
    revenue: up, 1240 k USD, prev 1105, below target 1300
    churn: flat, 2.4 %, prev 2.4
    by region (revenue): EMEA up 400 prev 380; APAC down 300 prev 310

and the narrative (the target) mentions every metric and every breakdown row once, in payload
order, as a clause "<name> <direction word> ... <value> ... <prev> [... <comparison> ... <target>]".
Phrasing varies with the style and with random synonyms, but every number, direction (up /
down / flat: value against prev) and comparison (above / below / on target) is fixed by the
payload.  Numbers are copied verbatim, never computed: a small model can learn to copy and
phrase, not to do arithmetic in its head (that is what the agent's calculator is for).

The trend against prev and the standing against target are computed here, exactly, and written
into the payload text: the runtime does the comparisons (a dashboard payload carries its deltas),
the model phrases them.  A 1M-parameter model that had to compare two numbers digit by digit
before writing the direction word got it wrong in about a third of the clauses (run 3 in
docs/BENCHMARKS.md).  Each payload line gives its fields in the order a
clause says them, so writing a clause is copying the next field, never searching the line.

The checker splits a text at the names it knows (metrics and breakdown rows) and, per clause,
reads the numbers in order (value, prev, target), the direction class and the comparison class.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# name, display name, unit, decimals, (low, high)
METRICS: tuple[tuple[str, str, str, int, tuple[float, float]], ...] = (
    ("revenue", "Revenue", "k USD", 0, (200, 9000)),
    ("orders", "Order count", "orders", 0, (100, 20000)),
    ("conversion", "Conversion rate", "%", 1, (0.5, 9.9)),
    ("churn", "Churn", "%", 1, (0.5, 8.0)),
    ("aov", "Average order value", "USD", 2, (20, 250)),
    ("latency", "P95 latency", "ms", 0, (40, 900)),
    ("active_users", "Active users", "users", 0, (1000, 90000)),
    ("tickets", "Support tickets", "tickets", 0, (50, 3000)),
    ("margin", "Gross margin", "%", 1, (10, 70)),
    ("signups", "New signups", "signups", 0, (100, 15000)),
)
METRIC = {m[0]: m for m in METRICS}
REGIONS = ("EMEA", "APAC", "AMER", "LATAM", "Nordics", "DACH")
SEGMENTS = ("Enterprise", "Midmarket", "SMB", "Self-serve")
TENANTS = ("Northwind", "Acme Retail", "Globex", "Initech", "Umbrella Health", "Stark Logistics",
           "Wayne Media", "Hooli", "Vandelay Imports", "Soylent Foods", "Tyrell Labs", "Cyberdyne")
PERIODS = tuple(f"{y}-Q{q}" for y in (2025, 2026) for q in (1, 2, 3, 4)) + tuple(
    f"2026-{m:02d}" for m in range(1, 13))
STYLES = ("brief", "formal", "casual")

# direction and comparison vocabularies: the checker classifies a clause by these words, so none
# of them may appear elsewhere in a template
UP = ("rose", "increased", "climbed", "grew")
DOWN = ("fell", "decreased", "dropped", "declined")
FLAT = ("held flat", "was unchanged", "stayed level")
ABOVE = ("above", "ahead of")
BELOW = ("below", "short of")
ON = ("right on", "exactly at")
DIRECTIONS: dict[str, tuple[str, ...]] = {"up": UP, "down": DOWN, "flat": FLAT}
COMPARISONS: dict[str, tuple[str, ...]] = {"above": ABOVE, "below": BELOW, "on": ON}


@dataclass
class Metric:
    key: str
    value: str
    prev: str
    target: str | None = None

    @property
    def display(self) -> str:
        return METRIC[self.key][1]

    @property
    def unit(self) -> str:
        return METRIC[self.key][2]


@dataclass
class Breakdown:
    kind: str  # "region" or "segment"
    metric: str  # key of the metric it breaks down
    rows: list[tuple[str, str, str]]  # (name, value, prev)


@dataclass
class Payload:
    tenant: str
    period: str
    style: str
    metrics: list[Metric]
    breakdown: Breakdown | None = None

    def to_text(self) -> str:
        lines = [f"tenant: {self.tenant} | period: {self.period} | style: {self.style}"]
        # each line in the order a clause says it: name, trend, value, prev, standing, target
        for m in self.metrics:
            tail = f", {comparison(m.value, m.target)} target {m.target}" if m.target is not None else ""
            lines.append(f"{m.key}: {direction(m.value, m.prev)}, {m.value} {m.unit}, prev {m.prev}{tail}")
        if self.breakdown is not None:
            b = self.breakdown
            rows = "; ".join(f"{n} {direction(v, p)} {v} prev {p}" for n, v, p in b.rows)
            lines.append(f"by {b.kind} ({b.metric}): {rows}")
        return "\n".join(lines) + "\n"

    def facts(self) -> list[Fact]:
        """What the narrative must say, in text order."""
        out = [Fact(m.display, [m.value, m.prev] + ([m.target] if m.target else []), direction(m.value, m.prev),
                    comparison(m.value, m.target) if m.target else None) for m in self.metrics]
        if self.breakdown is not None:
            out += [Fact(n, [v, p], direction(v, p), None) for n, v, p in self.breakdown.rows]
        return out


@dataclass
class Fact:
    name: str
    numbers: list[str]  # value, prev[, target]
    direction: str
    comparison: str | None

    @property
    def count(self) -> int:
        """Facts in this clause: each number, the direction, the comparison."""
        return len(self.numbers) + 1 + (self.comparison is not None)


def direction(value: str, prev: str) -> str:
    v, p = float(value), float(prev)
    return "up" if v > p else "down" if v < p else "flat"


def comparison(value: str, target: str | None) -> str | None:
    if target is None:
        return None
    v, t = float(value), float(target)
    return "above" if v > t else "below" if v < t else "on"


# ---- generation ---------------------------------------------------------------------------


def _fmt(x: float, decimals: int) -> str:
    return f"{x:.{decimals}f}"


def _number(rng: random.Random, lo: float, hi: float, decimals: int) -> float:
    return round(rng.uniform(lo, hi), decimals)


def _near(rng: random.Random, x: float, decimals: int) -> str:
    """A second number near x: equal (flat / on target) about 1 in 6, else within +-30%."""
    if rng.random() < 1 / 6:
        return _fmt(x, decimals)
    y = round(x * rng.uniform(0.7, 1.3), decimals)
    if y == x:  # a tiny number rounded back: force a change of one unit in the last place
        y = round(x + 10 ** -decimals * rng.choice((-1, 1)), decimals)
    return _fmt(max(y, 10 ** -decimals), decimals)


def make_metric(rng: random.Random, key: str, with_target: bool) -> Metric:
    _, _, _, dec, (lo, hi) = METRIC[key]
    v = _number(rng, lo, hi, dec)
    prev = _near(rng, v, dec)
    target = _near(rng, v, dec) if with_target else None
    return Metric(key, _fmt(v, dec), prev, target)


def make_payload(rng: random.Random) -> Payload:
    keys = rng.sample([m[0] for m in METRICS], rng.randint(1, 4))
    metrics = [make_metric(rng, k, rng.random() < 0.6) for k in keys]
    breakdown = None
    if rng.random() < 0.4:
        kind = rng.choice(("region", "segment"))
        names = rng.sample(REGIONS if kind == "region" else SEGMENTS, rng.randint(2, 3))
        m = metrics[0]
        dec = METRIC[m.key][3]
        lo, hi = METRIC[m.key][4]
        rows = []
        for n in names:
            v = _number(rng, lo / 4, hi / 3, dec) if dec == 0 else _number(rng, lo, hi, dec)
            rows.append((n, _fmt(v, dec), _near(rng, v, dec)))
        breakdown = Breakdown(kind, m.key, rows)
    return Payload(rng.choice(TENANTS), rng.choice(PERIODS), rng.choice(STYLES), metrics, breakdown)


def _dir_word(rng: random.Random, d: str) -> str:
    return rng.choice(DIRECTIONS[d])


def _target_phrase(rng: random.Random, m: Metric, style: str) -> str:
    if m.target is None:
        return ""
    cmp = comparison(m.value, m.target)
    assert cmp is not None
    word = rng.choice(COMPARISONS[cmp])
    if style == "casual":
        return f", {word} the goal of {m.target}"
    return f", {word} the {m.target} target" if rng.random() < 0.5 else f", {word} its target of {m.target}"


def metric_clause(rng: random.Random, m: Metric, style: str, first: bool) -> str:
    d = direction(m.value, m.prev)
    word = _dir_word(rng, d)
    tgt = _target_phrase(rng, m, style)
    name = m.display if first or style != "formal" else m.display.lower()
    to = "at" if d == "flat" else "to"
    if style == "brief":
        return f"{name} {word} {to} {m.value} {m.unit} from {m.prev}{tgt}."
    if style == "formal":
        return f"{name} {word} {to} {m.value} {m.unit}, compared with {m.prev} in the prior period{tgt}."
    lead = rng.choice(("", "Meanwhile, ", "Also, ")) if not first else ""
    return f"{lead}{name} {word}: {m.value} {m.unit} now vs {m.prev} before{tgt}."


def breakdown_sentence(rng: random.Random, b: Breakdown, style: str) -> str:
    def row(n: str, v: str, p: str) -> str:
        d = direction(v, p)
        return f"{n} {_dir_word(rng, d)} {'at' if d == 'flat' else 'to'} {v} from {p}"
    parts = [row(*r) for r in b.rows]
    joined = ", ".join(parts[:-1]) + " and " + parts[-1]
    if style == "formal":
        return f"Broken down by {b.kind}: {joined}."
    return f"By {b.kind}, {joined}."


def narrative(rng: random.Random, p: Payload) -> str:
    """One narrative for payload p; rng picks the phrasing."""
    if p.style == "brief":
        lead = ""
    elif p.style == "formal":
        lead = rng.choice((f"In {p.period}, {p.tenant} reported the following. ",
                           f"This is the {p.period} summary for {p.tenant}. "))
    else:
        lead = rng.choice((f"Here is how {p.period} went for {p.tenant}. ", f"Quick look at {p.period}. "))
    clauses = [metric_clause(rng, m, p.style, i == 0) for i, m in enumerate(p.metrics)]
    if p.breakdown is not None:
        clauses.append(breakdown_sentence(rng, p.breakdown, p.style))
    return lead + " ".join(clauses)


def example(rng: random.Random) -> tuple[Payload, str]:
    p = make_payload(rng)
    return p, narrative(rng, p)


def prompt_text(p: Payload) -> str:
    """The prompt the model sees: the payload then the narrative marker."""
    return p.to_text() + "narrative: "


# ---- checking -----------------------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")


@dataclass
class Check:
    facts_ok: int
    facts_total: int
    problems: list[str] = field(default_factory=list)

    @property
    def fully_correct(self) -> bool:
        return not self.problems and self.facts_ok == self.facts_total


def _classify(text: str, vocab: Mapping[str, tuple[str, ...]]) -> list[str]:
    return [cls for cls, words in vocab.items() for w in words if re.search(rf"\b{w}\b", text)]


def check(p: Payload, text: str) -> Check:
    """Read the facts back out of `text` and compare them with the payload's.  A fact is a
    number, a direction or a comparison of one clause; a missing clause loses all of its facts.
    Fully correct: every fact right, each name mentioned once, no stray numbers."""
    facts = p.facts()
    total = sum(f.count for f in facts)
    problems: list[str] = []
    body = text.replace(p.period, " ")
    names = [f.name for f in facts]
    # where each clause starts: the first mention of its name (formal style lower-cases later ones)
    starts: list[tuple[int, int]] = []
    for i, n in enumerate(names):
        hits = [m.start() for m in re.finditer(rf"\b{re.escape(n)}\b", body, flags=re.IGNORECASE)]
        if len(hits) != 1:
            problems.append(f"{n!r} mentioned {len(hits)} times")
        if hits:
            starts.append((hits[0], i))
    starts.sort()
    if [i for _, i in starts] != sorted(i for _, i in starts):
        problems.append("clauses out of payload order")
    head = body[: starts[0][0]] if starts else body
    if _NUMBER.search(head):
        problems.append(f"stray number before the first clause: {head!r}")
    ok = 0
    for j, (s, i) in enumerate(starts):
        e = starts[j + 1][0] if j + 1 < len(starts) else len(body)
        clause = body[s:e]
        f = facts[i]
        nums = _NUMBER.findall(clause[len(f.name):])
        got_n = sum(a == b for a, b in zip(nums, f.numbers))
        if nums != f.numbers:
            problems.append(f"{f.name}: numbers {nums} != {f.numbers}")
        dirs = _classify(clause, DIRECTIONS)
        got_d = dirs == [f.direction]
        if not got_d:
            problems.append(f"{f.name}: direction {dirs} != {f.direction}")
        cmps = _classify(clause, COMPARISONS)
        want_c = [f.comparison] if f.comparison else []
        got_c = cmps == want_c
        if not got_c:
            problems.append(f"{f.name}: comparison {cmps} != {want_c}")
        ok += got_n + got_d + (got_c and f.comparison is not None)
    return Check(ok, total, problems)
