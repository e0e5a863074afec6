"""The figures a benchmark reports of its samples: a percentile, a rounded median."""

from __future__ import annotations

import statistics


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def med(xs: list[float], nd: int = 1) -> float | None:
    return round(statistics.median(xs), nd) if xs else None
