"""Cron expressions in a time zone: checked (`check`), and their runs as epoch seconds (`after`,
`before`, `runs`).  croniter reads the expression; zoneinfo (the IANA database) gives the zone's
offsets, its DST changes included.  Knows nothing of schedules, jobs or clocks: every time is
an argument.

A DST change:
- spring forward (a wall time that does not exist, 02:30 on that night in Europe/Berlin): the
  run comes at the first time after the gap (03:00), once;
- fall back (a wall time that happens twice): a run at a fixed hour (the hour field is a
  number or a list: "30 2 * * *") comes once, at its first occurrence, as Vixie cron does; one
  whose hour field starts with `*` ("0 * * * *", "*/15 */2 * * *") comes at both (each is a
  real hour).
"""

from __future__ import annotations

import re
from datetime import datetime
from functools import cache, lru_cache
from zoneinfo import ZoneInfo, available_timezones

from croniter import croniter
from croniter.croniter import CroniterError

from runtime.errors import BadInput

MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
#: croniter's hashed (H) and random (R) fields: a run no two processes would agree on
_UNSTABLE = re.compile(r"(?:^|[\s,/-])[HR](?:$|[\s,/(-])")
MAX_LEN = 128


@cache
def _zones() -> frozenset[str]:
    return frozenset(available_timezones()) - {"localtime", "posixrules", "Factory"}  # not zones of a place


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name` ("Europe/Berlin", "UTC"); BadInput for any other text."""
    if not isinstance(name, str) or name not in _zones():
        raise BadInput(f"unknown time zone {str(name)[:64]!r}: an IANA name such as Europe/Berlin or UTC")
    return ZoneInfo(name)


def check(expr: str, tz: str, seconds: bool = False) -> str:
    """The expression, stripped, where it has runs: five fields (minute hour day month weekday)
    or a macro (@daily, ...); with `seconds` also six (a seconds field last: tests and
    benchmarks tick every second).  BadInput naming what is wrong."""
    text = " ".join(str(expr).split())
    fields = len(text.split())
    if not 0 < len(text) <= MAX_LEN:
        raise BadInput(f"a cron expression is 1..{MAX_LEN} characters")
    if not (text in MACROS or fields == 5 or (seconds and fields == 6)):
        raise BadInput(f"a cron expression has five fields (minute hour day month weekday) or is one of "
                       f"{', '.join(MACROS)}; got {text[:64]!r}")
    if _UNSTABLE.search(text):
        raise BadInput("a cron expression here has no H (hashed) or R (random) field: every process must agree on its runs")
    try:
        croniter(text, datetime.now(zone(tz))).get_next(datetime)
    except (CroniterError, ValueError, KeyError, IndexError, OverflowError) as e:
        raise BadInput(f"bad cron expression {text[:64]!r}: {e}") from None
    return text


def _fixed_hour(expr: str) -> bool:
    """Its hour field names hours (a run at a wall time a fall-back repeats comes once)."""
    parts = expr.split()
    if parts[0].startswith("@"):
        return parts[0] != "@hourly"
    return not parts[1].startswith("*")


def _repeated(d: datetime) -> bool:
    """d is the second occurrence of a wall time a fall-back repeats."""
    return d.fold == 1 and d.replace(fold=0).utcoffset() != d.utcoffset()


@lru_cache(maxsize=4096)
def after(expr: str, tz: str, t: float) -> float:
    """The first run strictly after t (epoch seconds).  Pure, and kept: a schedule pass asks it
    for every due schedule, and most share an expression, a zone and a tick."""
    it = croniter(expr, datetime.fromtimestamp(t, zone(tz)))
    fixed = _fixed_hour(expr)
    while True:
        d: datetime = it.get_next(datetime)
        if not (fixed and _repeated(d)):
            return d.timestamp()


def before(expr: str, tz: str, t: float, n: int) -> list[float]:
    """Up to n runs strictly before t, the latest first."""
    it = croniter(expr, datetime.fromtimestamp(t, zone(tz)))
    fixed = _fixed_hour(expr)
    out: list[float] = []
    while len(out) < n:
        d: datetime = it.get_prev(datetime)
        if not (fixed and _repeated(d)):
            out.append(d.timestamp())
    return out


def runs(expr: str, tz: str, t: float, n: int) -> list[float]:
    """The next n runs after t, in order."""
    out: list[float] = []
    for _ in range(n):
        t = after(expr, tz, t)
        out.append(t)
    return out
