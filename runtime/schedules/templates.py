"""What a schedule's tick submits (runtime/schedules/ticker.py): its template's job specs, each
with an id of its own.  A template is `{"kind": "report" | "narrative", "spec": {...}, "data":
{...} | None}`: the spec as POST /v1/jobs takes it, whose numbers (a narrative's `payload`, a
report's `data`) are given in the spec, or read at each tick from one of the tenant's
datasets (runtime/jobs/datasets.py: rows of [metric, region, period, value]) as `data` says:

    {"dataset": "sales"}                     one job from all the rows (they hold one region)
    {"dataset": "sales", "region": "EMEA"}   one job from that region's rows
    {"dataset": "sales", "per": "region"}    one job per region (a customer each), from its rows

A job's payload (runtime/jobs/specs.py PayloadSpec) from its rows:
- period: the latest of the rows' periods; each metric's `prev` is its value in the period
  before that one.  Periods compare as text: name them so that they sort ("2026-Q3", "2026-03").
- metrics: each metric (in the dataset's order) that has a value in both periods, at most 8
  (MAX_METRICS): a built-in one (revenue, churn, ...) by its key, any other as a custom metric
  with its unit from `units`.  A metric missing either period is left out.
- tenant: with `per`, the region's value (the job is that customer's); else `tenant`, else the
  schedule's tenant.  style: `style` (formal).  No breakdown, no targets.
The same rules hold when a schedule is created (over the dataset as it is then: a 422 naming
what does not fit) and at each tick (a job whose rows no longer fit is left out of its tick,
the reason kept with the tick).  Knows nothing of SQL, Redis or time.

Bounded before any work: a template's jobs are counted (its dataset's distinct regions, one
pass over its rows) before any is built.  Created, `per` over more than MAX_JOBS regions is a
BadInput that builds no payload; at a tick, only the first MAX_JOBS regions (sorted) are built,
the others named in the tick's error.  A dataset's rows are read in one pass whatever its
number of regions (one scan of the rows per region made 5000 regions cost seconds).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from domain.grammar import MAX_METRICS
from domain.payload import METRIC
from runtime.errors import BadInput
from runtime.jobs.datasets import NAME
from runtime.jobs.kinds import check_spec
from runtime.jobs.payload import Name

KINDS = ("report", "narrative")
NUMBERS = {"narrative": "payload", "report": "data"}  #: where a kind's spec holds its payload
MAX_JOBS = 50  # jobs one tick submits at most (`per`: the first regions in sorted order)

Rows = list[list[str]]  # [metric, region, period, value] per row
ReadRows = Callable[[str], Rows]  # a dataset's name -> its rows (NotFound where it has gone)


class DataSource(BaseModel):
    """Where a tick reads its template's numbers: one of the tenant's datasets."""

    model_config = ConfigDict(extra="forbid")
    dataset: str = Field(pattern=NAME, description="the tenant's dataset (PUT /v1/datasets/{name})")
    per: Literal["region"] | None = Field(default=None, description="one job per region, from its rows")
    region: Name | None = Field(default=None, description="one job, from this region's rows")
    tenant: Name | None = Field(default=None, description="the payload's tenant (without `per`); default: yours")
    style: Literal["brief", "formal", "casual"] = "formal"
    units: dict[Name, Name] = Field(default_factory=dict, max_length=64,
                                    description="a custom metric's unit, by its name (built-in ones have theirs)")

    @model_validator(mode="after")
    def _one_group(self) -> DataSource:
        if self.per is not None and (self.region is not None or self.tenant is not None):
            raise ValueError("`per` makes one job per region, each named by its region: no `region` or `tenant` with it")
        return self


class Planned(NamedTuple):
    """One job of a tick."""

    job_id: str
    group: str  # its region with `per`, else ""
    spec: dict[str, Any]


def job_id(schedule_id: str, tick_at: float, group: str) -> str:
    """The id of the tick's job for `group`: the same in every process (a jobs row's primary key,
    so that a tick's job is written once, whoever submits it)."""
    return hashlib.sha256(f"{schedule_id}\n{tick_at:.0f}\n{group}".encode()).hexdigest()[:24]


def check(kind: str, spec: Any, data: DataSource | None, tenant: str, read: ReadRows) -> dict[str, Any]:
    """The template, as stored, where it gives at least one job now (its dataset read as it is)
    and at most MAX_JOBS (counted before any is built); BadInput naming the first problem."""
    if kind not in KINDS:
        raise BadInput(f"a schedule submits a report or a narrative, not {kind!r}")
    template = {"kind": kind, "spec": spec, "data": None if data is None else data.model_dump(exclude_defaults=True)}
    jobs, problems = specs(template, tenant, read, strict=True)
    if problems:
        raise BadInput(problems[0] if len(problems) == 1 else f"{problems[0]} (and {len(problems) - 1} more)")
    assert jobs, "a template without a problem gives a job"
    return template


def plan(schedule_id: str, tick_at: float, template: dict[str, Any], tenant: str,
         read: ReadRows) -> tuple[list[Planned], list[str]]:
    """The tick's jobs (ids and specs) and why any group gave none."""
    [(planned, problems)] = plan_ticks(schedule_id, [tick_at], template, tenant, read)
    return planned, problems


def plan_ticks(schedule_id: str, ticks: list[float], template: dict[str, Any], tenant: str,
               read: ReadRows) -> list[tuple[list[Planned], list[str]]]:
    """plan for each of a schedule's ticks due together (a pass's, a catch-up's): the template
    read and built once for all of them (its dataset as it is now), each tick's jobs with ids
    of their own."""
    jobs, problems = specs(template, tenant, read)
    return [([Planned(job_id(schedule_id, t, g), g, s) for g, s in jobs], problems) for t in ticks]


def specs(template: dict[str, Any], tenant: str, read: ReadRows,
          strict: bool = False) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """(group, spec) of each job the template gives now, at most MAX_JOBS, and the problems of
    the groups that give none.  BadInput (NotFound for a dataset gone) where it gives none at
    all; strict (a schedule created), also where it would give more than MAX_JOBS, before any
    is built.  Else the groups past MAX_JOBS are named in the problems, never built."""
    kind, spec = template["kind"], template["spec"]
    if not isinstance(spec, dict):
        raise BadInput(f"a job spec is a JSON object, got {type(spec).__name__}")
    if template.get("data") is None:
        _check(kind, spec)
        return [("", spec)], []
    source = DataSource.model_validate(template["data"])
    if NUMBERS[kind] in spec:
        raise BadInput(f"the {kind}'s `{NUMBERS[kind]}` comes from dataset {source.dataset!r}: leave it out of the spec")
    mine, more = groups(read(source.dataset), source, tenant)
    too_many = f"{source.dataset}: {len(mine) + more} regions, at most {MAX_JOBS} jobs a tick"
    if more and strict:
        raise BadInput(f"dataset {too_many}: split it, or name one region (`region`)")
    out, problems = [], [f"{too_many} (the first {MAX_JOBS} go)"] if more else []
    for group, rows, name in mine:
        try:
            job = {**spec, NUMBERS[kind]: payload(rows, source, name)}
            _check(kind, job)
            out.append((group, job))
        except BadInput as e:
            problems.append(f"{source.dataset}" + (f" region {group!r}" if group else "") + f": {e.message}")
    return out, problems


def groups(rows: Rows, source: DataSource, tenant: str) -> tuple[list[tuple[str, Rows, str]], int]:
    """(group, its rows, its payload's tenant) for each job the rows give, at most MAX_JOBS (the
    first regions, sorted), and how many more they would give; BadInput where they give none.
    One pass over the rows, whatever their number of regions."""
    by_region: dict[str, Rows] = {}
    for r in rows:
        by_region.setdefault(r[1], []).append(r)
    regions = sorted(by_region)
    if source.per == "region":
        return [(g, by_region[g], g) for g in regions[:MAX_JOBS]], max(0, len(regions) - MAX_JOBS)
    if source.region is not None:
        if source.region not in by_region:
            raise BadInput(f"dataset {source.dataset!r} has no rows of region {source.region!r} "
                           f"(it has {', '.join(regions[:10])})")
        return [("", by_region[source.region], source.tenant or tenant)], 0
    if len(regions) > 1:
        raise BadInput(f"dataset {source.dataset!r} has rows of {len(regions)} regions ({', '.join(regions[:10])}): "
                       "name one (`region`) or make one job per region (`per`)")
    return [("", rows, source.tenant or tenant)], 0


def payload(rows: Rows, source: DataSource, tenant: str) -> dict[str, Any]:
    """One group's rows as a payload (the rules above); BadInput where they make none."""
    periods = sorted({r[2] for r in rows})
    if len(periods) < 2:
        raise BadInput(f"rows of {len(periods)} period: a payload compares the latest period with the one before")
    now, then = periods[-1], periods[-2]
    value = {(r[0], r[2]): r[3] for r in rows}
    metrics: list[dict[str, Any]] = []
    for m in dict.fromkeys(r[0] for r in rows):
        if (m, now) not in value or (m, then) not in value:
            continue
        if m not in METRIC and m not in source.units:
            raise BadInput(f"metric {m!r} is not built in: give its unit in `units`")
        named = {"key": m} if m in METRIC else {"name": m, "unit": source.units[m]}
        metrics.append({**named, "value": value[(m, now)], "prev": value[(m, then)]})
    if not metrics:
        raise BadInput(f"no metric has a value in both {then} and {now}")
    if len(metrics) > MAX_METRICS:
        raise BadInput(f"{len(metrics)} metrics have values in {then} and {now}; a payload has at most {MAX_METRICS}")
    return {"tenant": tenant, "period": now, "style": source.style, "metrics": metrics}


def _check(kind: str, spec: dict[str, Any]) -> None:
    check_spec(kind, spec, "new")  # BadInput with pydantic's reasons
