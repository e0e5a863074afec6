"""Payloads drawn at random, deterministic by seed: the corpus's (make_payload: the built-in
metrics, tenants, regions and periods) and the API grammar's (wild_payload: any names, periods,
units and numbers domain/grammar.py allows, negative ones too).  Knows nothing of narratives."""

from __future__ import annotations

import random
import string
from decimal import Decimal

from domain.grammar import MAX_DECIMALS, MAX_DIGITS, MAX_ROWS, NAME_FIRST, NAME_REST, UNIT_CHARS, canonical, number_text, valid
from domain.payload import METRIC, METRICS, PERIODS, REGIONS, SEGMENTS, STYLES, TENANTS, Breakdown, Metric, Payload

# ---- the corpus's: its lists ----------------------------------------------------------------

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
