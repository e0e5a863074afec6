"""A tenant's schedules (`Schedules`: create, list, get, pause, resume, delete): a cron
expression in a time zone and a template (runtime/schedules/templates.py) its ticks submit.
Another tenant's schedules look unknown (NotFound).  Paused, a schedule has no ticks; resumed,
its next is the first after the resume.  Knows nothing of the ticker that submits them
(runtime/schedules/ticker.py) or of Redis.  Time is `clock` (epoch seconds), which tests drive.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, delete, func, select, update
from sqlalchemy.orm import sessionmaker

from runtime.db import writer
from runtime.errors import BadInput, NotFound, OverBudget
from runtime.jobs.datasets import Datasets
from runtime.schedules import cron, templates
from runtime.schedules.templates import DataSource
from runtime.settings import Settings
from runtime.tables import ScheduleRecord, TickRecord, listing, owned

SCHEDULE_ID = r"sch_[0-9a-f]{24}"
MAX_CATCH_UP = 100  # a schedule's max_catch_up, at most


class Schedules:
    """A tenant's schedules: another tenant's look unknown (NotFound)."""

    def __init__(self, engine: Engine, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.datasets = Datasets(engine)
        self.s = settings
        self.clock = clock
        self._db = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)

    def create(self, tenant: str, *, cron_expr: str, timezone: str, kind: str, spec: Any, data: DataSource | None = None,
               name: str = "", missed: str = "skip", max_catch_up: int = 0, seconds: bool = False) -> ScheduleRecord:
        """A new schedule, its first tick the cron's next run; BadInput for a bad cron, time
        zone or template (its spec checked as POST /v1/jobs checks one, its dataset read as it
        is now: templates.check), OverBudget past tenant_max_schedules: nothing written then.
        seconds: a six-field cron (seconds last), for tests and benchmarks."""
        expr = cron.check(cron_expr, timezone, seconds)
        if missed not in ("skip", "catch_up") or not 0 <= max_catch_up <= MAX_CATCH_UP:
            raise BadInput(f"missed is skip or catch_up, and max_catch_up 0..{MAX_CATCH_UP}")
        if len(name) > 128:
            raise BadInput("a schedule's name is at most 128 characters")
        template = templates.check(kind, spec, data, tenant, self._reader(tenant, strict=True))
        with self._write.begin() as db:
            have = int(db.scalar(select(func.count()).select_from(ScheduleRecord).where(ScheduleRecord.tenant == tenant)) or 0)
            if have >= self.s.tenant_max_schedules:
                raise OverBudget(f"tenant {tenant!r} has {have} schedules, the most it may have "
                                 "(tenant_max_schedules): delete one first")
            rec = ScheduleRecord(id=f"sch_{secrets.token_hex(12)}", tenant=tenant, name=name, cron=expr, timezone=timezone,
                                 template=template, missed=missed, max_catch_up=max_catch_up, paused=False,
                                 next_at=cron.after(expr, timezone, self.clock()), created_at=datetime.now(UTC))
            db.add(rec)
        return rec

    def _reader(self, tenant: str, strict: bool = False) -> templates.ReadRows:
        """A dataset's rows by name; strict (at creation): BadInput for one the tenant has not."""
        def read(name: str) -> templates.Rows:
            try:
                return self.datasets.get(tenant, name).rows
            except NotFound as e:
                if strict:
                    raise BadInput(f"{e.message}: upload it first (PUT /v1/datasets/{name})") from None
                raise
        return read

    def get(self, tenant: str, schedule_id: str) -> ScheduleRecord:
        with self._db() as db:
            return owned(db.get(ScheduleRecord, schedule_id), tenant, f"schedule {schedule_id!r}")

    def listing(self, tenant: str, limit: int = 50) -> list[ScheduleRecord]:
        """The tenant's schedules, oldest first."""
        with self._db() as db:
            return list(db.scalars(listing(ScheduleRecord, tenant, limit)))

    def ticks(self, schedule_id: str, limit: int = 10) -> list[TickRecord]:
        """Its latest ticks, the latest first."""
        with self._db() as db:
            return list(db.scalars(select(TickRecord).where(TickRecord.schedule_id == schedule_id)
                                   .order_by(TickRecord.tick_at.desc()).limit(limit)))

    def pause(self, tenant: str, schedule_id: str) -> ScheduleRecord:
        """No tick from now on (a pass that read it before may still submit the tick due then)."""
        self.get(tenant, schedule_id)
        with self._write.begin() as db:
            db.execute(update(ScheduleRecord).where(ScheduleRecord.id == schedule_id).values(paused=True))
        return self.get(tenant, schedule_id)

    def resume(self, tenant: str, schedule_id: str) -> ScheduleRecord:
        """Ticks again, from its first run after now (those while it was paused are not missed
        ticks: none is submitted).  A running schedule stays as it is."""
        rec = self.get(tenant, schedule_id)
        with self._write.begin() as db:
            db.execute(update(ScheduleRecord).where(ScheduleRecord.id == schedule_id, ScheduleRecord.paused.is_(True))
                       .values(paused=False, next_at=cron.after(rec.cron, rec.timezone, self.clock())))
        return self.get(tenant, schedule_id)

    def delete(self, tenant: str, schedule_id: str) -> None:
        """The schedule and its ticks; the jobs it submitted stay."""
        with self._write.begin() as db:
            n = db.execute(delete(ScheduleRecord).where(ScheduleRecord.id == schedule_id, ScheduleRecord.tenant == tenant))
        if not n.rowcount:  # type: ignore[attr-defined]
            raise NotFound(f"no schedule {schedule_id!r} for tenant {tenant!r}")
