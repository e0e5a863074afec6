"""Drivers: what moved a payload's numbers, computed exactly (Decimal, as narrative.change is).
Per metric, its pace to target; for the breakdown, each row's share of its metric's change and
whether one row dominates the value or the change.  Pure functions of a Payload; knows nothing
of how a driver is phrased or shown (the exports show them; a narrative's text at detail `full`
says the breakdown's: rendered() gives them to the model as slots, domain/narrative.py
drivers_form phrases them).

    revenue 1105 -> 1240 (delta 135), target 1300: pace 135 / 195 = 0.6923
    EMEA  468 -> 512  delta  44  share of delta  0.3259
    APAC  318 -> 301  delta -17  share of delta -0.1259   (against the total)
    AMER  319 -> 427  delta 108  share of delta  0.8000   (largest; more than half of the delta)

A share is the row's over the metric's own value and delta (a breakdown that covers only part
of its metric leaves the rest unassigned: `covers` says whether its rows' deltas add up to the
metric's, and only then is the row that added most to the change the largest part of it),
signed: a row that moved against the total has a negative share, and the shares of the rows
that moved with it may then pass 1.  Ratios are strings of RATIO_PLACES decimals, rounded half
up; None where a ratio has no meaning."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any

from domain.facts import Slots
from domain.payload import Breakdown, Drivers, Metric, Payload, Rendered

RATIO_PLACES = Decimal("0.0001")  # 4 decimals: a share shown as a percent keeps one decimal exact
HALF = Decimal("0.5")  # "concentrated": one row holds more than this share


def ratio(part: Decimal, whole: Decimal) -> Decimal | None:
    """part / whole, rounded to RATIO_PLACES (a tiny negative one is "0.0000", not "-0.0000");
    None for a whole of 0."""
    if whole == 0:
        return None
    q = (part / whole).quantize(RATIO_PLACES, ROUND_HALF_UP)
    return q.copy_abs() if q == 0 else q


def text(x: Decimal | None) -> str | None:
    return None if x is None else format(x, "f")


def pace(value: str, prev: str, target: str | None) -> Decimal | None:
    """The share of the way from prev to target that value covers: 1 reached, over 1 passed,
    negative moved away; None without a target or with a target equal to prev (no way to go)."""
    if target is None:
        return None
    return ratio(Decimal(value) - Decimal(prev), Decimal(target) - Decimal(prev))


@dataclass(frozen=True)
class MetricDriver:
    metric: str  # its display name
    unit: str
    value: str
    prev: str
    delta: str  # value - prev
    target: str | None
    pace: str | None  # pace(); None: no target, or target == prev


@dataclass(frozen=True)
class RowDriver:
    name: str
    value: str
    prev: str
    delta: str
    share_of_delta: str | None  # signed; None: the metric did not change
    share_of_value: str | None  # None: the metric's value is 0 or below, or some row's is negative
    against: bool  # it moved the other way from its metric


@dataclass(frozen=True)
class BreakdownDriver:
    metric: str  # its display name
    kind: str  # region or segment
    delta: str  # the metric's
    rows: list[RowDriver]
    largest: str | None  # the row that added most to the change (its largest positive share); None: no change
    dominant_value: str | None  # the row holding more than half of the value
    dominant_delta: str | None  # the row holding more than half of the change
    against: list[str]  # rows that moved against the total
    covers: bool  # the rows' deltas add up to the metric's: their shares are of the whole change


def metric_driver(m: Metric) -> MetricDriver:
    delta = Decimal(m.value) - Decimal(m.prev)
    return MetricDriver(m.display, m.unit, m.value, m.prev, format(delta, "f"), m.target, text(pace(m.value, m.prev, m.target)))


def breakdown_driver(b: Breakdown, m: Metric) -> BreakdownDriver:
    """b's rows against their metric m: shares of m's change and value, concentration."""
    total_delta = Decimal(m.value) - Decimal(m.prev)
    total_value = Decimal(m.value)
    values_share = total_value > 0 and all(Decimal(v) >= 0 for _, v, _ in b.rows)
    rows = []
    for name, v, pv in b.rows:
        d = Decimal(v) - Decimal(pv)
        share_d = ratio(d, total_delta)
        share_v = ratio(Decimal(v), total_value) if values_share else None
        against = d != 0 and total_delta != 0 and (d > 0) != (total_delta > 0)
        rows.append((RowDriver(name, v, pv, format(d, "f"), text(share_d), text(share_v), against), share_d, share_v))
    largest = _most([(s, r.name) for r, s, _ in rows if s is not None and s > 0])
    dom_v = _most([(s, r.name) for r, _, s in rows if s is not None and s > HALF])
    dom_d = _most([(s, r.name) for r, s, _ in rows if s is not None and s > HALF])
    covers = sum((Decimal(r.delta) for r, _, _ in rows), Decimal(0)) == total_delta
    return BreakdownDriver(m.display, b.kind, format(total_delta, "f"), [r for r, _, _ in rows], largest, dom_v, dom_d,
                           [r.name for r, _, _ in rows if r.against], covers)


def _most(shares: list[tuple[Decimal, str]]) -> str | None:
    """The name of the largest share (the first of equals); None for none.  Two rows may both pass
    a half where some row moved against the total, or where the rows overlap."""
    return max(shares, key=lambda x: x[0])[1] if shares else None


def drivers(p: Payload) -> dict[str, Any]:
    """The payload's drivers as JSON: {"metrics": [MetricDriver], "breakdown": BreakdownDriver | None}."""
    by_key = {m.key: m for m in p.metrics}
    b = p.breakdown
    return {"metrics": [asdict(metric_driver(m)) for m in p.metrics],
            "breakdown": asdict(breakdown_driver(b, by_key[b.metric])) if b is not None else None}


# ---- the drivers as a narrative says them (detail `full`) ------------------------------------


def share_percent(part: str, whole: str) -> str:
    """A share of a change as a narrative says it, from the deltas themselves (rounded once: from
    RATIO_PLACES' 0.8765 it would say 87.7% of 87.645%): "108", "135" -> "80.0%" (one decimal, half up)."""
    with localcontext() as ctx:
        ctx.prec = 80  # the quotient exact far past the one decimal it is rounded to
        return f"{(Decimal(part) * 100 / Decimal(whole)).quantize(Decimal('0.1'), ROUND_HALF_UP)}%"


def rendered(p: Payload, slots: Slots | None = None, said: bool = False) -> Rendered:
    """p.render(slots), and where `said` (a narrative at detail `full`) and its breakdown's metric
    changed, the breakdown's drivers as facts after its lines: the row that added most to the
    change (its name's slot), its share of the change (a new slot), the rows that moved against it;
    where the rows do not cover the change (BreakdownDriver.covers), that the claim is of the rows
    shown:

        drivers: largest [F13] [F19] of the change; against [F16]
        drivers: largest [F13] [F19] of the change, of the rows shown; against [F16]
    """
    r = p.render(slots)
    b = p.breakdown
    if not said or b is None:
        return r
    d = breakdown_driver(b, next(m for m in p.metrics if m.key == b.metric))
    if d.largest is None:  # the metric did not change: no row drove anything
        return r
    slot = {row.name: clause.name for row, clause in zip(d.rows, r.rows, strict=True)}
    largest = next(row for row in d.rows if row.name == d.largest)  # its share is above 0: d.delta is not
    said_ = Drivers(slot[d.largest], r.slots.add(share_percent(largest.delta, d.delta)), tuple(slot[a] for a in d.against),
                    d.covers)
    against = f"; against {', '.join(said_.against)}" if said_.against else ""
    shown = "" if d.covers else ", of the rows shown"
    return replace(r, prompt=f"{r.prompt}drivers: largest {said_.largest} {said_.share} of the change{shown}{against}\n",
                   drivers=said_)
