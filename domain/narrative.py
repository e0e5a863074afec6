"""Dashboard narratives: a metrics payload -> a narrative paragraph, and the checker that reads
a text back against its payload.  Deterministic by seed.

The model never copies a fact: every name, unit, period and number of the payload enters its
input as a slot token (domain/facts.py), and it writes slot tokens where a fact goes; the runtime
writes the facts.  The payload as the model reads it (Payload.render):

    tenant: [F1] | period: [F2] | style: brief
    [F3]: up [F4], [F5] [F6], prev [F7], below target [F8]
    [F9]: flat, [F10] [F11], prev [F12]
    by region ([F3]): [F13] up [F14] prev [F15]; [F16] down [F17] prev [F18]

and the narrative it writes mentions every metric and every breakdown row once, in payload
order: "[F3] rose [F4] to [F5] [F6] from [F7], below the [F8] target. ..." ("Revenue rose 12.2%
to 1240 k USD from 1105, below the 1300 target.").  What a number implies is computed here,
exactly, and given: the trend against prev, the standing against the target, the percent change
(none from a prev of 0 or below); the model phrases it.  Each payload line gives its facts in
the order a clause says them, so writing a clause is copying the next slot of its line.

The narrative's forms (narrative_form: its lead, a clause per metric, the breakdown's sentence,
each a sequence of choices) are the one source of both the training texts and the checker: a
text is fully correct only when it is one of them for its payload (read_back), and the reading
of each clause says what is wrong.  A payload's names may be any text (the API's grammar below):
no name is ever tokenized for setflow's own models.
"""

from __future__ import annotations

import random
import re
import string
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

from domain.facts import SLOT, Slots, slots_in
from domain.markup import MARKUP_TOKENS, SPECIAL_TOKENS

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

    def names(self) -> list[str]:
        """The name each clause opens with, in text order: the metrics' (display names), then the
        breakdown's rows (the API refuses a payload where two are one: a reader could not tell them apart)."""
        return [m.display for m in self.metrics] + [n for n, _, _ in (self.breakdown.rows if self.breakdown else [])]

    def render(self, slots: Slots | None = None) -> Rendered:
        """The payload with every fact in a slot: the prompt's lines and each clause's slots.
        slots: a table to go on from (a section's title is its first slot; training starts
        some tables at a later slot, so that every slot id is learnt)."""
        return render(self, Slots() if slots is None else slots)

    def to_text(self) -> str:
        """The payload's lines with the facts written out (an imported model that copies facts as
        text reads this; setflow's models read render().prompt)."""
        r = self.render()
        return r.slots.lexicalise(r.prompt)


def direction(value: str, prev: str) -> str:
    v, p = Decimal(value), Decimal(prev)
    return "up" if v > p else "down" if v < p else "flat"


def comparison(value: str, target: str | None) -> str | None:
    if target is None:
        return None
    v, t = Decimal(value), Decimal(target)
    return "above" if v > t else "below" if v < t else "on"


def change(value: str, prev: str) -> str | None:
    """The percent change from prev to value as a narrative says it: its size, one decimal (two
    significant digits under 0.1%; "under 0.01%" below that), the direction word saying its sign.
    None where there is none to say: no change, or a prev of 0 or below (a change from nothing,
    or from a loss, has no percent a reader can take)."""
    v, p = Decimal(value), Decimal(prev)
    if v == p or p <= 0:
        return None
    pct = abs(v - p) / p * 100
    if pct >= Decimal("0.1"):
        return f"{pct.quantize(Decimal('0.1'), ROUND_HALF_UP)}%"
    if pct >= Decimal("0.01"):
        return f"{float(pct):.2g}%"
    return "under 0.01%"


# ---- slots: the payload as the model reads it, and each clause's slots ---------------------------


@dataclass(frozen=True)
class Clause:
    """One fact's clause in slot tokens: a metric's (name, change, value, unit, prev, target) or a
    breakdown row's (name, value, prev), with what the runtime computed of its numbers."""

    name: str
    value: str
    prev: str
    direction: str
    unit: str | None = None
    change: str | None = None
    target: str | None = None
    comparison: str | None = None

    @property
    def numbers(self) -> list[str]:
        """The slots a clause says after its name, in order (the change and the unit included)."""
        return [s for s in (self.change, self.value, self.unit, self.prev, self.target) if s is not None]

    @property
    def count(self) -> int:
        """Facts in this clause: each slot after its name, the direction, the comparison."""
        return len(self.numbers) + 1 + (self.comparison is not None)


@dataclass
class Rendered:
    """A payload in slot form: the prompt's lines ([F1] the tenant, [F2] the period, then each
    metric's and row's facts in the order a clause says them), the slot table, and the clauses."""

    prompt: str
    slots: Slots
    tenant: str
    period: str
    style: str
    metrics: list[Clause]
    kind: str | None  # the breakdown's ("region" or "segment"), None without one
    rows: list[Clause]

    @property
    def clauses(self) -> list[Clause]:
        return self.metrics + self.rows


def render(p: Payload, slots: Slots) -> Rendered:
    """The payload's slot form (Payload.render):

        tenant: [F1] | period: [F2] | style: brief
        [F3]: up [F4], [F5] [F6], prev [F7], below target [F8]
        [F9]: flat, [F10] [F11], prev [F12]
        by region ([F3]): [F13] up [F14] prev [F15]; [F16] down [F17] prev [F18]

    Each line gives its facts in the order a clause says them, so that writing a clause is
    copying the next slot of its line; the trend, the change and the standing against the target
    are computed here, never by the model."""
    tenant, period = slots.add(p.tenant), slots.add(p.period)
    lines = [f"tenant: {tenant} | period: {period} | style: {p.style}"]
    metrics: list[Clause] = []
    names: dict[str, str] = {}
    for m in p.metrics:
        d, pct = direction(m.value, m.prev), change(m.value, m.prev)
        name = names[m.key] = slots.add(m.display)
        ch = slots.add(pct) if pct is not None else None
        value, unit, prev = slots.add(m.value), slots.add(m.unit), slots.add(m.prev)
        cmp = comparison(m.value, m.target)
        target = slots.add(m.target) if m.target is not None else None
        metrics.append(Clause(name, value, prev, d, unit, ch, target, cmp))
        tail = f", {cmp} target {target}" if target is not None else ""
        lines.append(f"{name}: {d}{' ' + ch if ch else ''}, {value} {unit}, prev {prev}{tail}")
    rows: list[Clause] = []
    b = p.breakdown
    if b is not None:
        for n, v, pv in b.rows:
            rows.append(Clause(slots.add(n), slots.add(v), slots.add(pv), direction(v, pv)))
        said = "; ".join(f"{r.name} {r.direction} {r.value} prev {r.prev}" for r in rows)
        lines.append(f"by {b.kind} ({names[b.metric]}): {said}")
    return Rendered("\n".join(lines) + "\n", slots, tenant, period, p.style, metrics, b.kind if b else None, rows)


# ---- the narrative's forms: one source for writing a narrative and for reading one back ----------

#: a text as a sequence of choices: one alternative of each, in order (a literal is a choice of one)
Form = list[tuple[str, ...]]


def _target_forms(c: Clause, style: str) -> tuple[str, ...]:
    if c.target is None or c.comparison is None:
        return ("",)
    words = COMPARISONS[c.comparison]
    if style == "casual":
        return tuple(f", {w} the goal of {c.target}" for w in words)
    return tuple(f", {w} the {c.target} target" for w in words) + tuple(f", {w} its target of {c.target}" for w in words)


def metric_form(c: Clause, style: str, first: bool) -> Form:
    to = "at" if c.direction == "flat" else "to"
    unit = f" {c.unit}" if c.unit else ""
    dirs, tgt = DIRECTIONS[c.direction], _target_forms(c, style)
    if style == "brief":
        return [(f"{c.name} ",), dirs, (f"{' ' + c.change if c.change else ''} {to} {c.value}{unit} from {c.prev}",), tgt,
                (".",)]
    if style == "formal":
        return [(f"{c.name} ",), dirs, (f"{' ' + c.change if c.change else ''} {to} {c.value}{unit}, compared with "
                                        f"{c.prev} in the prior period",), tgt, (".",)]
    lead = ("",) if first else ("", "Meanwhile, ", "Also, ")
    return [lead, (f"{c.name} ",), dirs, (f"{' by ' + c.change if c.change else ''}: {c.value}{unit} now vs {c.prev} "
                                          "before",), tgt, (".",)]


def breakdown_form(r: Rendered) -> Form:
    form: Form = [(f"Broken down by {r.kind}: " if r.style == "formal" else f"By {r.kind}, ",)]
    for i, c in enumerate(r.rows):
        if i:
            form.append((" and " if i == len(r.rows) - 1 else ", ",))
        form += [(f"{c.name} ",), DIRECTIONS[c.direction], (f" {'at' if c.direction == 'flat' else 'to'} {c.value} from "
                                                             f"{c.prev}",)]
    return form + [(".",)]


def leads(r: Rendered) -> tuple[str, ...]:
    """The sentences a narrative may open with, by style."""
    return {"brief": ("",),
            "formal": (f"In {r.period}, {r.tenant} reported the following. ", f"This is the {r.period} summary for {r.tenant}. "),
            "casual": (f"Here is how {r.period} went for {r.tenant}. ", f"Quick look at {r.period}. ")}[r.style]


def narrative_form(r: Rendered) -> Form:
    """Every narrative of a payload: its lead, a clause per metric, the breakdown's sentence."""
    form: Form = [leads(r)]
    for i, c in enumerate(r.metrics):
        form += ([(" ",)] if i else []) + metric_form(c, r.style, i == 0)
    if r.rows:
        form += [(" ",), *breakdown_form(r)]
    return form


def write(rng: random.Random, form: Form) -> str:
    """One text of `form`; rng picks among each choice's alternatives."""
    return "".join(alts[0] if len(alts) == 1 else rng.choice(alts) for alts in form)


def pattern(form: Form) -> re.Pattern[str]:
    """What every text of `form` matches, and nothing else."""
    return re.compile("".join("(?:" + "|".join(map(re.escape, alts)) + ")" for alts in form))


def narrative(rng: random.Random, p: Payload, slots: Slots | None = None) -> str:
    """One narrative for payload p, in slot form (Slots.lexicalise writes its facts); rng picks
    the phrasing."""
    return write(rng, narrative_form(p.render(slots)))


def example(rng: random.Random) -> tuple[Payload, str]:
    p = make_payload(rng)
    return p, narrative(rng, p)


def wild_example(rng: random.Random) -> tuple[Payload, str]:
    p = wild_payload(rng)
    return p, narrative(rng, p)


def prompt_text(p: Payload) -> str:
    """The prompt the model sees: the payload in slot form, then the narrative marker."""
    return prompt_of(p.render())


def prompt_of(r: Rendered) -> str:
    return r.prompt + "narrative: "


# ---- checking -----------------------------------------------------------------------------

_DIGIT = re.compile(r"\d")
_MARKUP = (*SPECIAL_TOKENS, *MARKUP_TOKENS, "<", ">")


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
    """A narrative in slot form read back against its payload (read_back)."""
    return read_back(p.render(), text)


def read_back(r: Rendered, text: str) -> Check:
    """Read a narrative in slot form back against its payload's rendering.  Fully correct only when the whole
    text is one the narrative's forms write for this payload (its lead, each clause with its own
    slots in their places, its trend and target words, nothing else): a slot that names another
    fact, a missing or doubled fact, a stray number, a word or mark the forms never write, a
    garbled lead all fail.  The reading of each clause (its slots, trend and target words) says
    what is wrong and counts the facts that are right."""
    total = sum(c.count for c in r.clauses)
    if pattern(narrative_form(r)).fullmatch(text):
        return Check(total, total)
    ok, problems = _read(r, text)
    return Check(ok, total, problems or [f"the text is not one the narrative's forms write: {text!r}"])


def _read(r: Rendered, text: str) -> tuple[int, list[str]]:
    """(facts right, problems) of a text that is not one of its forms."""
    lex = r.slots.lexicalise
    problems = [f"markup in the text: {m!r}" for m in _MARKUP if m in text]
    known = set(r.slots.tokens())
    problems += [f"slot {s} names no fact" for s in dict.fromkeys(slots_in(text)) if s not in known]
    if _DIGIT.search(SLOT.sub("", text)):
        problems.append(f"a number the payload does not give: {SLOT.sub('', text)!r}")
    found: list[tuple[int, int, Clause]] = []  # (start, end of the name, clause)
    cursor = 0
    for c in r.clauses:
        at = text.find(c.name, cursor)
        if at < 0:
            problems.append(f"{lex(c.name)!r} not mentioned")
            continue
        found.append((at, at + len(c.name), c))
        cursor = at + len(c.name)
    head = text[: found[0][0]] if found else text
    if r.metrics and found and found[0][2] is r.metrics[0] and head not in leads(r):
        problems.append(f"the opening {lex(head)!r} is not one of the {r.style} style's")
    ok = 0
    for j, (_, e_name, c) in enumerate(found):
        clause = text[e_name: found[j + 1][0] if j + 1 < len(found) else len(text)]
        got = slots_in(clause)
        if got != c.numbers:
            problems.append(f"{lex(c.name)}: slots {_said(got, lex)} where {_said(c.numbers, lex)} go")
        dirs, cmps = _classify(clause, DIRECTIONS), _classify(clause, COMPARISONS)
        if dirs != [c.direction]:
            problems.append(f"{lex(c.name)}: direction {dirs} != {c.direction}")
        want_c = [c.comparison] if c.comparison else []
        if cmps != want_c:
            problems.append(f"{lex(c.name)}: comparison {cmps} != {want_c}")
        ok += _common(got, c.numbers) + (dirs == [c.direction]) + (cmps == want_c and c.comparison is not None)
    return ok, list(dict.fromkeys(problems))


def _common(got: list[str], want: list[str]) -> int:
    """The facts of `want` that `got` says in their places: the longest common subsequence (a
    swapped pair loses one of its two, a left-out fact only itself)."""
    row = [0] * (len(want) + 1)
    for g in got:
        prev_diag = 0
        for j, w in enumerate(want):
            prev_diag, row[j + 1] = row[j + 1], prev_diag + 1 if g == w else max(row[j + 1], row[j])
    return row[-1]


def _said(slots: list[str], lex: Callable[[str], str]) -> str:
    return "[" + ", ".join(f"{s}={lex(s)!r}" for s in slots) + "]"


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


def _signed(rng: random.Random, digits: int, decimals: int) -> str:
    """wild_number, negative about 1 in 7 (a loss, a negative margin)."""
    x = wild_number(rng, digits, decimals)
    return number_text("-" + x) if rng.random() < 1 / 7 else x


def _wild_near(rng: random.Random, value: str, decimals: int) -> str:
    """A second number for value: equal about 1 in 6, else near it (or, 1 in 5, of any size)."""
    if rng.random() < 1 / 6:
        return value
    if rng.random() < 0.2:
        return _signed(rng, rng.randint(1, 9), decimals)
    out = f"{Decimal(value) * Decimal(str(round(rng.uniform(0.5, 1.5), 3))):.{decimals}f}"
    return out if out != value and _fits(out) else _signed(rng, len(value.lstrip("-").split(".")[0]), decimals)


def _fits(x: str) -> bool:
    try:
        return number_text(x) == x
    except ValueError:
        return False


def _wild_digits(rng: random.Random) -> tuple[int, int]:
    """(integer digits, decimals) of a metric's numbers: mostly a dashboard's, up to the grammar's
    MAX_DIGITS significant digits and MAX_DECIMALS decimals."""
    if rng.random() < 0.1:
        decimals = rng.randint(0, MAX_DECIMALS)
        return rng.randint(1, MAX_DIGITS - decimals), decimals
    return rng.randint(1, 9), rng.choice((0, 0, 1, 1, 2, 3))


def wild_metric(rng: random.Random, key: str | None, with_target: bool) -> Metric:
    """A built-in metric (key) or a custom one (key None), its numbers anywhere in the grammar."""
    digits, decimals = _wild_digits(rng)
    value = _signed(rng, digits, decimals)
    prev = _wild_near(rng, value, decimals)
    target = _wild_near(rng, value, decimals) if with_target else None
    if key is not None:
        return Metric(key, value, prev, target)
    name, unit = rng.choice(CUSTOM_METRICS) if rng.random() < 0.4 else (wild_name(rng), wild_unit(rng))
    return Metric(name, value, prev, target, custom_unit=unit)


def wild_payload(rng: random.Random) -> Payload:
    """A payload drawn from the API's grammar rather than the corpus's lists: any tenant, period,
    names, custom metrics and numbers (negative ones too); 1-MAX_METRICS metrics, most often few,
    and a breakdown of 1-MAX_ROWS rows half the time.  Its names are distinct (the API refuses
    two clauses of one name: a reader could not tell them apart)."""
    while True:
        n = rng.choice((1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8))
        keys = [rng.choice(METRICS)[0] for _ in range(n)]
        metrics = [wild_metric(rng, k if rng.random() < 0.5 else None, rng.random() < 0.6) for k in keys]
        breakdown = None
        if rng.random() < 0.5:
            m = rng.choice(metrics)
            dec = len(m.value.partition(".")[2])
            n_rows = rng.randint(1, MAX_ROWS) if rng.random() < 0.3 else rng.randint(1, 4)
            rows = []
            for _ in range(n_rows):
                v = _signed(rng, rng.randint(1, min(9, MAX_DIGITS - dec)), dec)
                rows.append((wild_name(rng), v, _wild_near(rng, v, dec)))
            breakdown = Breakdown(rng.choice(("region", "segment")), m.key, rows)
        p = Payload(wild_name(rng), wild_period(rng), rng.choice(STYLES), metrics, breakdown)
        names = p.names()
        if len(set(names)) == len(names) and len({m.key for m in p.metrics}) == n and valid(p) is None:
            return p


# ---- the API's grammar (runtime/jobs/specs.py takes payloads by it; wild_payload draws from it) ----
# The model never reads a name or a number of a payload (they enter as slots, domain/facts.py), so
# the grammar is what a dashboard sends, not what a small model can copy.
MAX_NAME = 80  # characters of a name: a tenant, a metric, a unit, a period, a breakdown row
MAX_METRICS, MAX_ROWS = 8, 12
MAX_DIGITS, MAX_DECIMALS = 15, 6  # significant digits of a number (a double holds 15 exactly), decimals
_NUMBER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
# a number written with thousands separators: one kind of mark between groups of three digits
# ("1,240", "1 240", "1.240.567"), then decimals after the other mark ("1,240.5", "1.240,5")
_SEPARATED = re.compile(r"(-?)([0-9]{1,3}([,' \u00a0\u202f.])[0-9]{3}(?:\3[0-9]{3})*)(?:(?!\3)[.,]([0-9]+))?")
# the format characters a word of some scripts holds: ZWNJ (Persian, Indic scripts), ZWJ (Indic
# conjuncts, emoji sequences); every other one (a bidi override, a soft hyphen) is refused
_JOINERS = frozenset("\u200c\u200d")


def name_problem(name: str) -> str | None:
    """Why `name` is no name (None: it is one): any text of 1-MAX_NAME characters in NFC (a name
    sent decomposed is composed first, see clean_name), no control character, no line break."""
    if not 1 <= len(name) <= MAX_NAME:
        return f"a name is 1-{MAX_NAME} characters, got {len(name)}"
    bad = sorted({f"U+{ord(ch):04X}" for ch in name if ch not in _JOINERS and unicodedata.category(ch) in (
        "Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")})
    if bad:
        return f"a name holds no control or unassigned characters, got {', '.join(bad)} in {name!r}"
    return None


def clean_name(name: str) -> str:
    """A name as the runtime writes, checks and looks it up: NFC, then canonical (spaces)."""
    return canonical(unicodedata.normalize("NFC", name))


def number_text(x: str | int | float) -> str:
    """A payload number as the runtime writes it, from a JSON number or a string; ValueError that
    says how to write it.  Negative allowed; at most MAX_DIGITS significant digits and
    MAX_DECIMALS decimals; the decimals as given ("2.50" stays "2.50": the data's own rounding);
    a JSON number as Python reads it (1020.5; 1e3 is 1000.0, written "1000.0")."""
    if isinstance(x, bool) or not isinstance(x, (str, int, float)):
        raise ValueError(f"a number is a JSON number or a string like \"-1240.5\", got {x!r}")
    if isinstance(x, float):
        if x != x or x in (float("inf"), float("-inf")):
            raise ValueError(f"a number is finite, got {x!r}")
        text = format(Decimal(repr(x)), "f")
    else:
        text = str(x)
    if not _NUMBER_TEXT.fullmatch(text):
        sep = _SEPARATED.fullmatch(text.strip()) if isinstance(x, str) else None
        if sep is not None:  # "1.240" is no such number: it is 1.24 written with three decimals
            like = sep[1] + re.sub(r"[^0-9]", "", sep[2]) + (f".{sep[4]}" if sep[4] else "")
            raise ValueError(f"{x!r} has a thousands separator: write it without one, with a point for decimals, "
                             f"like {like}")
        if isinstance(x, str) and _NUMBER_TEXT.fullmatch(x.strip().replace(",", ".", 1)):  # "2,5": a decimal comma
            raise ValueError(f"{x!r} has a decimal comma: write the decimals after a point, like "
                             f"{x.strip().replace(',', '.', 1)}")
        raise ValueError(f"a number is digits with an optional leading '-' and decimal point, like -1240.5, got {x!r}")
    whole, _, decimals = text.lstrip("-").partition(".")
    digits = (whole + decimals).lstrip("0") or "0"
    if len(decimals) > MAX_DECIMALS:
        raise ValueError(f"a number has at most {MAX_DECIMALS} decimals, got {len(decimals)} in {x!r}: round it")
    if len(digits) > MAX_DIGITS:
        raise ValueError(f"a number has at most {MAX_DIGITS} significant digits, got {len(digits)} in {x!r}")
    return "0" + text[2:] if text.startswith("-0") and Decimal(text) == 0 else text  # -0 is 0


def valid(p: Payload) -> str | None:
    """Why p is outside the API's grammar (None: inside): what runtime/jobs/specs.py accepts."""
    names = [("tenant", p.tenant), ("period", p.period),
             *[(w, x) for m in p.metrics if m.custom for w, x in (("metric", m.key), ("unit", m.unit))],
             *[("row", r[0]) for r in (p.breakdown.rows if p.breakdown else [])]]
    for what, text in names:
        why = name_problem(text)
        if why is not None or text != clean_name(text):
            return f"{what} {text!r}: {why or 'not canonical'}"
    numbers = [x for m in p.metrics for x in (m.value, m.prev, m.target) if x is not None]
    numbers += [x for r in (p.breakdown.rows if p.breakdown else []) for x in r[1:]]
    for x in numbers:
        try:
            if number_text(x) != x:
                return f"number {x!r} is not as the runtime writes it"
        except ValueError as e:
            return str(e)
    if not 1 <= len(p.metrics) <= MAX_METRICS or (p.breakdown is not None and not 1 <= len(p.breakdown.rows) <= MAX_ROWS):
        return f"1-{MAX_METRICS} metrics, a breakdown of 1-{MAX_ROWS} rows"
    return None
