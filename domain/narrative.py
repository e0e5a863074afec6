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
import string
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


# ---- the API's grammar (runtime/jobs/specs.py validates payloads with these; wild_payload draws from them)
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9 .&'/-]{0,39}$"  # tenants, breakdown rows, custom metrics: one line, no '|'
PERIOD_RE = r"^[A-Za-z0-9-]{1,16}$"
NUMBER_RE = r"^[0-9]{1,9}(\.[0-9]{1,3})?$"  # a number as text: 1-9 digits, up to 3 decimals
UNIT_RE = r"^[A-Za-z%$/]([A-Za-z%$/ ]{0,14}[A-Za-z%$/])?$"  # a custom metric's unit: 1-16, no digits
NAME_FIRST = string.ascii_letters + string.digits
NAME_REST = NAME_FIRST + " .&'/-"
UNIT_CHARS = string.ascii_letters + "%$/"


_SPACES = re.compile(" {2,}")


def canonical(name: str) -> str:
    """A name as the runtime uses it: the spaces at its ends dropped and each run of spaces inside
    made one.  The API accepts "North  America " (a name copied from a spreadsheet often has
    them) and writes, checks and looks up "North America": a space at the end of a name is
    invisible in a narrative, and two names that differ only so are one to a reader."""
    return _SPACES.sub(" ", name).strip(" ")  # only U+0020: other whitespace is another character


@dataclass
class Metric:
    key: str  # a built-in metric's key (METRIC), or a custom metric's display name
    value: str
    prev: str
    target: str | None = None
    custom_unit: str | None = None  # set for a custom metric (its unit); None: a built-in

    @property
    def custom(self) -> bool:
        return self.custom_unit is not None

    @property
    def display(self) -> str:
        return self.key if self.custom else METRIC[self.key][1]

    @property
    def unit(self) -> str:
        return self.custom_unit if self.custom_unit is not None else METRIC[self.key][2]


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
                    comparison(m.value, m.target) if m.target else None, m.unit, not m.custom) for m in self.metrics]
        if self.breakdown is not None:
            out += [Fact(n, [v, p], direction(v, p), None) for n, v, p in self.breakdown.rows]
        return out

    def leads(self) -> dict[str, tuple[str, ...]]:
        """The sentences a narrative may open with, by style (the checker strips them: the
        tenant and the period may hold digits and any word)."""
        return {"brief": ("",),
                "formal": (f"In {self.period}, {self.tenant} reported the following. ",
                           f"This is the {self.period} summary for {self.tenant}. "),
                "casual": (f"Here is how {self.period} went for {self.tenant}. ", f"Quick look at {self.period}. ")}


@dataclass
class Fact:
    name: str
    numbers: list[str]  # value, prev[, target]
    direction: str
    comparison: str | None
    unit: str | None = None  # a metric's, written after its value
    builtin: bool = False  # a built-in metric: the formal style lower-cases its later mentions

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


# ---- drawn from the API's grammar (names, periods, numbers, custom metrics the corpus lists never hold)

CUSTOM_METRICS = (("NPS", "points"), ("Net revenue retention", "%"), ("Tickets per agent", "tickets"),
                  ("CSAT", "%"), ("ARR", "k EUR"), ("Time to resolve", "h"), ("Pipeline", "M USD"),
                  ("Uptime", "%"), ("Cost per lead", "$"), ("Refunds", "orders"), ("DAU/MAU", "%"))
PERIOD_FORMATS = ("FY{y}", "{y}-H{h}", "{y}-Q{q}", "Q{q}-{y}", "{y}-{m:02d}", "W{w}-{y}", "{y}", "H{h}-{y}",
                  "{mon}-{y}", "{mon}{y2}", "FY{y2}-Q{q}", "{y}-W{w}")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def wild_name(rng: random.Random) -> str:
    """A name the grammar allows (NAME_RE): pseudo-words, words with digits and signs, or any
    characters; short ones most often, up to 40."""
    kind = rng.random()
    if kind < 0.15:
        return rng.choice(TENANTS + REGIONS + SEGMENTS)
    if kind < 0.55:  # pseudo-words, some with a number or a sign
        words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 9))).capitalize()
                 if rng.random() < 0.8 else "".join(rng.choice(string.ascii_uppercase) for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 999)))
        sep = rng.choice((" ", " ", " ", " & ", "-", "/", ". ", "'"))
        name = sep.join(words)
    else:  # any characters of the grammar
        n = min(40, 1 + int(rng.expovariate(1 / 9)))
        name = rng.choice(NAME_FIRST) + "".join(rng.choice(NAME_REST) for _ in range(n - 1))
    return canonical(name[:40])  # as the API passes it on


def wild_period(rng: random.Random) -> str:
    """A period the grammar allows (PERIOD_RE): a common format, or any 1-16 characters."""
    if rng.random() < 0.7:
        y = rng.randint(1990, 2099)
        return rng.choice(PERIOD_FORMATS).format(y=y, y2=y % 100, q=rng.randint(1, 4), h=rng.randint(1, 2),
                                                 m=rng.randint(1, 12), w=rng.randint(1, 53), mon=rng.choice(MONTHS))
    chars = string.ascii_letters + string.digits + "-"
    return "".join(rng.choice(chars) for _ in range(rng.randint(1, 16)))


def wild_unit(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(("%", "$", "USD", "EUR", "k USD", "M EUR", "ms", "s", "h", "days", "users", "points",
                           "orders", "tickets", "per day", "GB", "req/s", "units"))
    n = rng.randint(1, 16)
    unit = canonical("".join(rng.choice(UNIT_CHARS + "  ") for _ in range(n)))
    return unit or rng.choice(UNIT_CHARS)


def wild_number(rng: random.Random, digits: int, decimals: int) -> str:
    """A number with `digits` integer digits (no leading zero but for 0 itself) and `decimals`."""
    whole = str(rng.randint(10 ** (digits - 1), 10 ** digits - 1)) if digits > 1 else str(rng.randint(0, 9))
    return whole + ("." + "".join(rng.choice(string.digits) for _ in range(decimals)) if decimals else "")


def _wild_near(rng: random.Random, value: str, decimals: int) -> str:
    """A second number for value: equal about 1 in 6, else near it (or, 1 in 5, of any size)."""
    if rng.random() < 1 / 6:
        return value
    if rng.random() < 0.2:
        return wild_number(rng, rng.randint(1, 9), rng.choice((0, 0, 1, 2, 3)))
    x = float(value) * rng.uniform(0.5, 1.5)
    out = f"{x:.{decimals}f}"
    return out if NUMBER_RE_C.fullmatch(out) and out != value else wild_number(rng, len(value.split(".")[0]), decimals)


def wild_metric(rng: random.Random, key: str | None, with_target: bool) -> Metric:
    """A built-in metric (key) or a custom one (key None), its numbers anywhere in the grammar."""
    digits, decimals = rng.randint(1, 9), rng.choice((0, 0, 1, 1, 2, 3))
    value = wild_number(rng, digits, decimals)
    prev = _wild_near(rng, value, decimals)
    target = _wild_near(rng, value, decimals) if with_target else None
    if key is not None:
        return Metric(key, value, prev, target)
    name, unit = rng.choice(CUSTOM_METRICS) if rng.random() < 0.4 else (wild_name(rng), wild_unit(rng))
    return Metric(name, value, prev, target, custom_unit=unit)


def wild_payload(rng: random.Random) -> Payload:
    """A payload drawn from the API's grammar rather than the corpus's lists: any tenant, period,
    names, custom metrics and numbers of 1-9 digits with up to 3 decimals; 1-4 metrics, a
    breakdown of 1-4 rows.  Its names are distinct (each clause is found by its name)."""
    while True:
        n = rng.randint(1, 4)
        keys = rng.sample([m[0] for m in METRICS], n)
        metrics = [wild_metric(rng, k if rng.random() < 0.5 else None, rng.random() < 0.6) for k in keys]
        breakdown = None
        if rng.random() < 0.5:
            m = rng.choice(metrics)
            dec = len(m.value.partition(".")[2])
            rows = []
            for _ in range(rng.randint(1, 4)):
                v = wild_number(rng, rng.randint(1, 9), dec)
                rows.append((wild_name(rng), v, _wild_near(rng, v, dec)))
            breakdown = Breakdown(rng.choice(("region", "segment")), m.key, rows)
        p = Payload(wild_name(rng), wild_period(rng), rng.choice(STYLES), metrics, breakdown)
        names = [f.name for f in p.facts()]
        if len(set(names)) == len(names) and valid(p) is None:
            return p


def valid(p: Payload) -> str | None:
    """Why p is outside the API's grammar (None: inside): what runtime/jobs/specs.py accepts."""
    for what, text, pattern in [("tenant", p.tenant, NAME_RE_C), ("period", p.period, PERIOD_RE_C),
                                *[("metric", m.key, NAME_RE_C) for m in p.metrics if m.custom],
                                *[("unit", m.unit, UNIT_RE_C) for m in p.metrics if m.custom],
                                *[("number", x, NUMBER_RE_C) for m in p.metrics for x in (m.value, m.prev, m.target)
                                  if x is not None],
                                *[(w, x, NAME_RE_C if w == "row" else NUMBER_RE_C) for r in
                                  (p.breakdown.rows if p.breakdown else []) for w, x in zip(("row", "number", "number"), r)]]:
        if not pattern.fullmatch(text):
            return f"{what} {text!r}"
    if not 1 <= len(p.metrics) <= 4 or (p.breakdown is not None and not 1 <= len(p.breakdown.rows) <= 4):
        return "1-4 metrics, a breakdown of 1-4 rows"
    return None


NAME_RE_C, PERIOD_RE_C, NUMBER_RE_C, UNIT_RE_C = (re.compile(x) for x in (NAME_RE, PERIOD_RE, NUMBER_RE, UNIT_RE))


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
    name = m.display if first or style != "formal" or m.custom else m.display.lower()
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
    leads = p.leads()[p.style]
    lead = leads[0] if len(leads) == 1 else rng.choice(leads)
    clauses = [metric_clause(rng, m, p.style, i == 0) for i, m in enumerate(p.metrics)]
    if p.breakdown is not None:
        clauses.append(breakdown_sentence(rng, p.breakdown, p.style))
    return lead + " ".join(clauses)


def example(rng: random.Random) -> tuple[Payload, str]:
    p = make_payload(rng)
    return p, narrative(rng, p)


def wild_example(rng: random.Random) -> tuple[Payload, str]:
    p = wild_payload(rng)
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


# a clause begins a sentence, or follows the list punctuation of the breakdown sentence: a name is
# looked for only there (never inside a number, a unit or another name)
_AT_CLAUSE = r"(?:^|(?<=\. )|(?<=, )|(?<= and )|(?<=: )|(?<=Meanwhile, )|(?<=Also, ))"


def _name_re(f: Fact) -> re.Pattern[str]:
    names = [f.name] + ([f.name.lower()] if f.builtin and f.name.lower() != f.name else [])
    return re.compile(_AT_CLAUSE + "(?:" + "|".join(map(re.escape, names)) + ")(?![A-Za-z0-9])")


def check(p: Payload, text: str) -> Check:
    """Read the facts back out of `text` and compare them with the payload's.  A fact is a
    number, a direction or a comparison of one clause; a missing clause loses all of its facts.
    Fully correct: every fact right, each name mentioned once, no stray numbers.

    The opening sentence (its style's, with the tenant and the period) is stripped; then each
    clause is found in payload order, at its name where a clause may begin; its numbers, trend
    and target words are read from what follows its name (its unit taken out), so names, units,
    tenants and periods may hold any digits or words the API's grammar allows."""
    facts = p.facts()
    total = sum(f.count for f in facts)
    problems: list[str] = []
    body = text
    for lead in sorted(p.leads()[p.style], key=len, reverse=True):
        if lead and body.startswith(lead):
            body = body[len(lead):]
            break
    found: list[tuple[int, int, int]] = []  # (start, end of the name, fact)
    cursor = 0
    for i, f in enumerate(facts):
        m = _name_re(f).search(body, cursor)
        if m is None:
            problems.append(f"{f.name!r} not mentioned")
            continue
        found.append((m.start(), m.end(), i))
        cursor = m.end()
    head = body[: found[0][0]] if found else body
    if _NUMBER.search(head):
        problems.append(f"stray number before the first clause: {head!r}")
    ok = 0
    for j, (_, e_name, i) in enumerate(found):
        e = found[j + 1][0] if j + 1 < len(found) else len(body)
        f = facts[i]
        clause = body[e_name:e]
        for g in facts:
            if _name_re(g).search(clause) or (j == 0 and _name_re(g).search(head)):
                problems.append(f"{g.name!r} mentioned again")
        if f.unit:  # the unit follows the value: out, so that its words and signs are not read
            clause = clause.replace(f"{f.numbers[0]} {f.unit}", f.numbers[0], 1)
        nums = _NUMBER.findall(clause)
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
    return Check(ok, total, list(dict.fromkeys(problems)))
