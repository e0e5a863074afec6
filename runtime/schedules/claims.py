"""A pass's ticks claimed and their jobs submitted (`Claims`, which the ticker runs:
runtime/schedules/ticker.py).  Exactly one job set per tick, whoever runs it (two leaders in a
split brain, a leader that died mid-tick):
- at most once: a tick's job has an id of its own (templates.job_id: its schedule, tick and
  group), so the jobs table's primary key writes it once (a second submission: Duplicate);
- at least once: a tick is claimed (INSERT of its row with the ids its jobs will have; the
  UNIQUE (schedule, tick) lets one claim in) before any of its jobs is submitted, and next_at
  moves past a tick only once it is claimed.  A process that dies leaves either no claim
  (next_at unmoved: the next pass claims the tick) or a claim, which a later pass completes
  RETRY_S after it was made: it submits the claim's ids that no job holds yet.  A claimer that
  loses the INSERT submits nothing (the winner's plan stands).
A submission refused for a while (the tenant's rate or quota, Redis or the database away) leaves
the claim to be completed later, for up to GIVE_UP_S; one refused for good (its rows no longer
make a payload, a dataset deleted) is kept in the tick's `error`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from runtime.errors import BadInput, Duplicate, NotFound
from runtime.jobs.dispatch import Dispatcher
from runtime.schedules.templates import Planned
from runtime.tables import ScheduleRecord, TickRecord

log = logging.getLogger("setflow.schedules")
GIVE_UP_S = 3600.0  # a claim refused for a while is completed for this long; then its jobs not yet submitted fail (the tick's error)
TickPlan = tuple[float, list[Planned], list[str]]  # a tick, its jobs planned, the problems of those it could not plan
Won = tuple[ScheduleRecord, TickRecord, list[Planned], list[str]]  # a claim this process made, with its plan


class Claims:
    """The claims and submissions of one ticker's passes."""

    def __init__(self, dispatcher: Dispatcher, clock: Callable[[], float], write: sessionmaker[Session]) -> None:
        self.d = dispatcher
        self.clock = clock
        self._write = write

    def claim_all(self, plans: list[tuple[ScheduleRecord, list[TickPlan], float]]) -> list[Won]:
        """Claim the schedules' ticks (each row with its planned job ids; one with none is failed
        at once) and move each one's next_at to its `nxt` (where nobody moved it meanwhile: a
        pause, a resume, another leader), in one transaction; where another process claimed one
        of them already, schedule by schedule (_claim).  Returns the claims this process made."""
        try:
            with self._write.begin() as db:
                won = [(sch, self._row(sch, t, planned, problems), planned, problems)
                       for sch, ticks, _ in plans for t, planned, problems in ticks]
                db.add_all([claim for _, claim, _, _ in won])
                db.flush()
                db.execute(_ADVANCE, [_advance_row(sch, nxt) for sch, _, nxt in plans])  # one executemany
            return won
        except IntegrityError:  # a tick claimed already (or a schedule deleted): not ours to submit
            pass
        return [(sch, *w) for sch, ticks, nxt in plans for w in self._claim(sch, ticks, nxt)]

    def _claim(self, sch: ScheduleRecord, plans: list[TickPlan],
               nxt: float) -> list[tuple[TickRecord, list[Planned], list[str]]]:
        """claim_all for one schedule, in one transaction; where another process claimed one
        of its ticks already, one at a time."""
        try:
            with self._write.begin() as db:
                won = [(self._row(sch, t, planned, problems), planned, problems) for t, planned, problems in plans]
                db.add_all([claim for claim, _, _ in won])
                db.flush()
                db.execute(_ADVANCE, [_advance_row(sch, nxt)])
            return won
        except IntegrityError:  # a tick claimed already (or the schedule deleted): not ours to submit
            pass
        won = []
        for t, planned, problems in plans:
            try:
                with self._write.begin() as db:
                    claim = self._row(sch, t, planned, problems)
                    db.add(claim)
                won.append((claim, planned, problems))
            except IntegrityError:
                continue
        with self._write.begin() as db:
            db.execute(_ADVANCE, [_advance_row(sch, nxt)])
        return won

    def _row(self, sch: ScheduleRecord, t: float, planned: list[Planned], problems: list[str]) -> TickRecord:
        """A tick's claim: its planned job ids (none: failed at once, its problems kept)."""
        now = self.clock()
        return TickRecord(schedule_id=sch.id, tick_at=t, jobs=[p.job_id for p in planned],
                          status="claimed" if planned else "failed", error=_error(problems), claimed_at=now,
                          late_s=now - t, created_at=datetime.now(UTC))

    def submit_all(self, won: list[Won]) -> Counter[str]:
        """Submit the fresh claims' jobs, a batch per tenant (Dispatcher.submit_batch), record
        their ticks as submitted (or failed, where none of a tick's jobs could be) in one
        transaction, then admit each tenant's jobs to the broker (as many as its share: the rest
        wait in SQL, queued, as any backlog does).  A tick is submitted once its jobs are queued
        in SQL: their admission, which the reaper also runs, neither delays its record nor fails
        it.  A tenant whose batch is refused as a whole (its rate, a quota, Redis or the database
        away) has its claims submitted one at a time (submit: a refusal for a while leaves a
        claim pending, completed later)."""
        out, by_tenant = Counter[str](), dict[str, list[Won]]()
        for w in won:
            if w[2]:
                by_tenant.setdefault(w[0].tenant, []).append(w)
            else:
                out["failed"] += 1
        ended: list[tuple[TickRecord, str, list[str], list[str]]] = []  # claim, status, its jobs, problems
        batched: list[str] = []  # the tenants whose batch went (one at a time, submit admitted each job)
        for tenant, claims in by_tenant.items():
            batch = [(sch.template["kind"], p.spec, p.job_id, (sch.id, claim.tick_at))
                     for sch, claim, planned, _ in claims for p in planned]
            try:
                refused = self.d.submit_batch(tenant, batch, admit=False)
            except Exception:  # noqa: BLE001 - as a whole: one at a time, as submit takes them
                for sch, claim, planned, problems in claims:
                    out[self.submit(sch, claim, planned, problems, fresh=True)] += 1
                continue
            batched.append(tenant)
            for _, claim, planned, problems in claims:
                have = [p.job_id for p in planned if p.job_id not in refused]
                why = [*problems, *((f"region {p.group!r}: " if p.group else "") + refused[p.job_id]
                                    for p in planned if p.job_id in refused)]
                ended.append((claim, "submitted" if have else "failed", have, why))
        if ended:
            now = self.clock()
            with self._write.begin() as db:  # one executemany
                db.execute(_RECORD, [{"b_id": claim.id, "b_status": status, "b_jobs": have, "b_error": _error(why),
                                      "b_late": now - claim.tick_at} for claim, status, have, why in ended])
            out.update(status for _, status, _, _ in ended)
        for tenant in batched:
            self.d.admit_quietly(tenant)
        return out

    def submit(self, sch: ScheduleRecord, claim: TickRecord, planned: list[Planned], problems: list[str],
                fresh: bool = False) -> str:
        """Submit the claim's jobs that no job holds yet (none, where this process has just made
        the claim: `fresh`); record the tick as submitted (or failed, where none could be)
        unless a refusal for a while leaves it pending."""
        kind, problems, pending = sch.template["kind"], list(problems), False
        have = set() if fresh else self.d.jobs.existing(claim.jobs)
        gone = set(claim.jobs) - have - {p.job_id for p in planned}  # not written, and its rows make none now
        if gone:
            problems.append(f"{len(gone)} of its jobs' rows make no payload any more")
        for p in planned:
            if p.job_id in have:
                continue
            try:
                self.d.submit(kind, sch.tenant, p.spec, priority="batch", open_session=True, job_id=p.job_id,
                              tick=(sch.id, claim.tick_at))
                have.add(p.job_id)
            except Duplicate:  # another process submitted it meanwhile
                have.add(p.job_id)
            except (BadInput, NotFound) as e:  # refused for good
                problems.append((f"region {p.group!r}: " if p.group else "") + e.message)
            except Exception as e:  # noqa: BLE001 - rate, quota, Redis, the database: the claim is completed later
                pending = True
                problems.append(f"{type(e).__name__}: {e}")
                break
        now = self.clock()
        if pending and now - claim.claimed_at < GIVE_UP_S:
            log.info("schedule %s tick %s: pending (%s)", sch.id, claim.tick_at, problems[-1])
            return "pending"
        status = "submitted" if have else "failed"
        with self._write.begin() as db:
            db.execute(update(TickRecord).where(TickRecord.id == claim.id, TickRecord.status == "claimed")
                       .values(status=status, jobs=[i for i in claim.jobs if i in have],
                               error=_error(problems), late_s=now - claim.tick_at))
        return status


#: move a schedule's next_at where nobody moved it since it was read (_advance_row's parameters);
#: Core statements, so that a pass's rows go as one executemany
_SCHEDULES, _TICKS = cast(Table, ScheduleRecord.__table__), cast(Table, TickRecord.__table__)
_ADVANCE = update(_SCHEDULES).where(_SCHEDULES.c.id == bindparam("b_id"), _SCHEDULES.c.next_at == bindparam("b_was")) \
    .values(next_at=bindparam("b_next"))
#: a claimed tick's outcome: submitted (its jobs written) or failed
_RECORD = update(_TICKS).where(_TICKS.c.id == bindparam("b_id"), _TICKS.c.status == "claimed") \
    .values(status=bindparam("b_status"), jobs=bindparam("b_jobs"), error=bindparam("b_error"), late_s=bindparam("b_late"))


def _advance_row(sch: ScheduleRecord, nxt: float) -> dict[str, Any]:
    return {"b_id": sch.id, "b_was": sch.next_at, "b_next": nxt}


def _error(problems: list[str]) -> str:
    return "; ".join(problems)[:500]
