"""The schedules' tests' shared inputs: a time zone, a dataset of three regions, a template."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from runtime.jobs.datasets import parse_json

BERLIN = "Europe/Berlin"
T0 = datetime(2026, 3, 2, 6, 0, tzinfo=ZoneInfo(BERLIN)).timestamp()  # a Monday, 06:00
ROOT = Path(__file__).resolve().parents[3]
REGIONS = {"AMER": ("319", "427"), "APAC": ("318", "301"), "EMEA": ("468", "512")}
NARRATIVE = {"params": {"max_new_tokens": 32}}
PAYLOAD = {"tenant": "Northwind", "period": "2026-Q3",
           "metrics": [{"key": "revenue", "value": "1240", "prev": "1105"}, {"key": "churn", "value": "2.4", "prev": "2.6"}]}


def rows(regions: dict[str, tuple[str, str]] = REGIONS) -> list[list[str]]:
    """A dataset: revenue and churn in two quarters per region."""
    return parse_json({"rows": [{"metric": m, "region": r, "period": p, "value": v}
                                for r, (q2, q3) in regions.items()
                                for m, (a, b) in (("revenue", (q2, q3)), ("churn", ("2.6", "2.4")))
                                for p, v in (("2026-Q2", a), ("2026-Q3", b))]})


def local(t: float, tz: str = BERLIN) -> str:
    return datetime.fromtimestamp(t, ZoneInfo(tz)).isoformat()
