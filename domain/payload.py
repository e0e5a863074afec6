"""A dashboard's metrics payload, and its slot form: what the model reads of it.

A payload is a tenant, a period, a style, its metrics (each a value, the previous value, maybe a
target) and maybe one breakdown of a metric by region or segment.  What a number implies is
computed here, exactly, and given: the trend against prev, the standing against the target, the
percent change (none from a prev of 0 or below).  The model never copies a fact: every name, unit,
period and number enters its input as a slot token (domain/facts.py); render() writes the prompt's
lines and each clause's slots.  Knows nothing of how a narrative is phrased (domain/narrative.py)
nor of what the API accepts (domain/grammar.py)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from domain.facts import Slots

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
        some tables at a later slot, so that every slot id is learnt).  With the breakdown's
        drivers too (a narrative at detail `full`): domain/drivers.py rendered."""
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
    if pct >= Decimal("0.01"):  # two significant digits, half up as above (a float's .2g said 0.011 of 0.0115)
        q = pct.quantize(Decimal("0.001"), ROUND_HALF_UP)
        return "0.1%" if q >= Decimal("0.1") else f"{format(q.normalize(), 'f')}%"
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


@dataclass(frozen=True)
class Drivers:
    """A breakdown's drivers as a narrative says them, in slot tokens (domain/drivers.py rendered
    computes them): the row that added most to its metric's change, that row's share of the
    change (a percent, one decimal: above 100% where other rows moved against it), the rows
    that moved against the change, in payload order, and whether the rows cover the change (their
    deltas add up to the metric's): a claim about the whole change is said only where they do."""

    largest: str
    share: str
    against: tuple[str, ...]
    covers: bool

    @property
    def numbers(self) -> list[str]:
        """The slots the drivers' sentences say, in order."""
        return [self.largest, self.share, *self.against]

    @property
    def count(self) -> int:
        return len(self.numbers)


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
    drivers: Drivers | None = None  # asked for, and its metric changed

    @property
    def clauses(self) -> list[Clause]:
        return self.metrics + self.rows

    @property
    def facts(self) -> int:
        """The facts a narrative of it says: each clause's, and the drivers'."""
        return sum(c.count for c in self.clauses) + (self.drivers.count if self.drivers else 0)


def render(p: Payload, slots: Slots) -> Rendered:
    """The payload's slot form (Payload.render):

        tenant: [F1] | period: [F2] | style: brief
        [F3]: up [F4], [F5] [F6], prev [F7], below target [F8]
        [F9]: flat, [F10] [F11], prev [F12]
        by region ([F3]): [F13] up [F14] prev [F15]; [F16] down [F17] prev [F18]

    (domain/drivers.py rendered adds a last line, "drivers: largest [F13] [F19] of the change;
    against [F16]", for a narrative at detail `full`).

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
