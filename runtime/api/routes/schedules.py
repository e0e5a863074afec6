"""/v1/schedules: a tenant's cron jobs (runtime/schedules/): create (checked whole: a bad
cron, time zone, spec or dataset is a 422 that writes nothing), list (each with its next runs),
read (with its latest ticks), pause, resume, delete.  The workers' ticker submits their jobs."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from runtime.api.deps import Limit, Svc, Tenant
from runtime.api.models import ERRORS, Utc
from runtime.schedules import cron
from runtime.schedules.cron import MAX_LEN
from runtime.schedules.crud import MAX_CATCH_UP, SCHEDULE_ID, Schedules
from runtime.schedules.templates import DataSource
from runtime.tables import ScheduleRecord, TickRecord

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])
ScheduleId = Annotated[str, Path(pattern=f"^{SCHEDULE_ID}$")]
NEXT_RUNS = 3  # runs a schedule shows


class Template(BaseModel):
    """The job each tick submits."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["report", "narrative"]
    spec: dict[str, Any] = Field(description="a ReportSpec or NarrativeSpec as POST /v1/jobs takes it; where `data` "
                                             "names a dataset, without its numbers (a report's `data`, a narrative's "
                                             "`payload`): each tick reads them from the dataset")


class ScheduleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="", max_length=128)
    cron: str = Field(min_length=1, max_length=MAX_LEN,
                      description="minute hour day month weekday (\"0 7 * * 1\": Mondays at 07:00), or @daily, @weekly, ...")
    timezone: str = Field(default="UTC", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_+/-]+$",
                          description="an IANA time zone (Europe/Berlin): the cron's wall clock, its DST changes included")
    template: Template
    data: DataSource | None = Field(default=None, description="read the numbers from a dataset at each tick")
    missed: Literal["skip", "catch_up"] = Field(default="skip", description="ticks missed while the service was down: "
                                                "skipped, or the most recent max_catch_up submitted")
    max_catch_up: int = Field(default=0, ge=0, le=MAX_CATCH_UP)


class TickView(BaseModel):
    tick: Utc
    status: str  # claimed (being submitted), submitted, failed
    jobs: list[str]
    late_s: float  # how long after its time its last job was submitted
    error: str  # why a job of it was refused ("" where none was)


class ScheduleView(BaseModel):
    id: str
    name: str
    cron: str
    timezone: str
    template: Template
    data: dict[str, Any] | None
    missed: str
    max_catch_up: int
    paused: bool
    next_runs: list[datetime] = Field(description=f"its next {NEXT_RUNS} runs, in its time zone (none while paused)")
    created_at: Utc


class ScheduleDetail(ScheduleView):
    ticks: list[TickView] = Field(description="its latest ticks, the latest first")


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]


def _store(svc: Svc) -> Schedules:
    return Schedules(svc.sql, svc.settings)


def _view(r: ScheduleRecord) -> ScheduleView:
    runs = [] if r.paused else cron.runs(r.cron, r.timezone, max(time.time(), r.next_at - 1), NEXT_RUNS)
    zone = cron.zone(r.timezone)
    return ScheduleView(id=r.id, name=r.name, cron=r.cron, timezone=r.timezone,
                        template=Template(kind=r.template["kind"], spec=r.template["spec"]), data=r.template.get("data"),
                        missed=r.missed, max_catch_up=r.max_catch_up, paused=r.paused,
                        next_runs=[datetime.fromtimestamp(t, zone) for t in runs], created_at=r.created_at)


def _tick(t: TickRecord, zone: Any) -> TickView:
    return TickView(tick=datetime.fromtimestamp(t.tick_at, zone), status=t.status, jobs=t.jobs, late_s=round(t.late_s, 3),
                    error=t.error)


@router.post("", status_code=201, response_model=ScheduleView, responses=ERRORS)
def create_schedule(req: ScheduleCreate, who: Tenant, svc: Svc) -> ScheduleView:
    """A schedule: at each run of `cron` in `timezone` the workers submit the template's job (a
    batch job on a new session), or with `data` {"dataset", "per": "region"} one per region of
    the dataset.  Checked whole, the dataset read as it is now: a bad cron, time zone, spec or
    dataset is a 422 naming it; past tenant_max_schedules a 409 over_budget; nothing written.
    Takes a rate-limit token first, as a submission does: a refused schedule has cost a check
    too (its dataset read), so a flood of them is a 429 at the tenant's rate."""
    svc.limiter.take(who)
    rec = _store(svc).create(who, cron_expr=req.cron, timezone=req.timezone, kind=req.template.kind,
                             spec=req.template.spec, data=req.data, name=req.name, missed=req.missed,
                             max_catch_up=req.max_catch_up)
    return _view(rec)


@router.get("", response_model=ScheduleList, responses=ERRORS)
def list_schedules(who: Tenant, svc: Svc, limit: Limit = 50) -> ScheduleList:
    """The tenant's schedules, oldest first, each with its next runs."""
    return ScheduleList(schedules=[_view(r) for r in _store(svc).listing(who, limit)])


@router.get("/{schedule_id}", response_model=ScheduleDetail, responses=ERRORS)
def get_schedule(schedule_id: ScheduleId, who: Tenant, svc: Svc) -> ScheduleDetail:
    store = _store(svc)
    rec = store.get(who, schedule_id)
    zone = cron.zone(rec.timezone)
    return ScheduleDetail(**_view(rec).model_dump(), ticks=[_tick(t, zone) for t in store.ticks(schedule_id)])


@router.post("/{schedule_id}/pause", response_model=ScheduleView, responses=ERRORS)
def pause_schedule(schedule_id: ScheduleId, who: Tenant, svc: Svc) -> ScheduleView:
    """No tick until it is resumed."""
    return _view(_store(svc).pause(who, schedule_id))


@router.post("/{schedule_id}/resume", response_model=ScheduleView, responses=ERRORS)
def resume_schedule(schedule_id: ScheduleId, who: Tenant, svc: Svc) -> ScheduleView:
    """Ticks again from its next run after now; the runs while it was paused are not submitted."""
    return _view(_store(svc).resume(who, schedule_id))


@router.delete("/{schedule_id}", status_code=204, responses=ERRORS)
def delete_schedule(schedule_id: ScheduleId, who: Tenant, svc: Svc) -> Response:
    """The schedule and its ticks; the jobs it submitted stay."""
    _store(svc).delete(who, schedule_id)
    return Response(status_code=204)
