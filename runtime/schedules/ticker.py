"""Schedules: a tenant's cron jobs (`Schedules`: create, list, get, pause, resume, delete) and
the ticker that submits their ticks (`Ticker`), which every worker runs and one leads.

    Ticker.step, every schedule_interval_s in each worker:
      lead: the Redis lock {p}:ticker (SET NX PX schedule_lock_s, renewed by its holder every
            third of it while a pass runs): one leader; when it dies another takes over within
            schedule_lock_s
      1) complete the claims left behind: ticks claimed more than RETRY_S ago, not submitted
      2) the due schedules (not paused, next_at <= now), BATCH at a time, the most overdue
         first: plan each due tick's jobs -> claim the ticks and advance each next_at (one
         transaction) -> submit their jobs, a batch per tenant (one transaction each) -> record
         the ticks submitted (one transaction): a few commits per BATCH ticks, not five a tick
      3) now and then, forget the ticks past job_retention_s
      each tenant: at most SHARE_S of planning a pass (timer); past it, its other due schedules
      and claims are carried to the next pass (right after: they are due), not planned now

Exactly one job set per tick, whoever runs it (two leaders in a split brain, a leader that died
mid-tick):
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

A tenant's share of a pass: planning its ticks (its templates over its datasets) is timed, and
a tenant that has spent SHARE_S in a pass plans nothing more in it: its other due schedules
keep their next_at, and its claims left behind stay claimed, for the next pass, which comes at
once (they are due).  Its first schedule of a pass always goes (it is bounded: its template
built once for all its ticks due, templates.MAX_JOBS jobs), so every tenant gets on; one
tenant's costly schedules make its own ticks late, not another's.  A carried tick is late as
any slow pass's, no more: submitted as usual within schedule_grace_s, its schedule's missed
policy past it (never dropped unsaid: the pass counts it `carried`, and `skipped` where its
policy skips).

Missed ticks: a tick found up to schedule_grace_s late is submitted as usual (a failover, a slow
pass).  Older ones were missed (the service was down): `skip` jumps to the next tick and records
none of them; `catch_up` submits the most recent max_catch_up of them (oldest first), then goes
on.  Paused, a schedule has no ticks; resumed, its next is the first after the resume.
Time is `clock` (epoch seconds), which tests and the benchmark drive.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Engine, Table, and_, bindparam, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from runtime.db import writer
from runtime.errors import BadInput, Duplicate, NotFound, OverBudget
from runtime.jobs import cron, templates
from runtime.jobs.datasets import Datasets
from runtime.jobs.dispatch import Dispatcher
from runtime.jobs.templates import DataSource, Planned
from runtime.keys import Keys
from runtime.settings import Settings
from runtime.tables import ScheduleRecord, TickRecord

log = logging.getLogger("setflow.schedules")
SCHEDULE_ID = r"sch_[0-9a-f]{24}"
BATCH = 1000  # schedules one query of a pass reads and fires together (and claims left behind one pass completes)
MAX_TICKS = 100  # ticks of one schedule one pass submits at most (the rest: the next pass)
MAX_CATCH_UP = 100  # a schedule's max_catch_up, at most
RETRY_S = 10.0  # a claim not submitted this long after it was made is completed by the next pass
GIVE_UP_S = 3600.0  # ... for this long; then its jobs not yet submitted fail (the tick's error)
MIN_PAUSE_S = 0.01  # the leader's shortest wait between two passes
SHARE_S = 0.25  # a tenant's planning time in one pass, at most (then: the next pass; its first schedule always goes)
PRUNE_S = 60.0  # how often the leader deletes ticks past their retention (at most 1000 a time)
TickPlan = tuple[float, list[Planned], list[str]]  # a tick, its jobs planned, the problems of those it could not plan
Won = tuple[ScheduleRecord, TickRecord, list[Planned], list[str]]  # a claim this process made, with its plan
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


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
            rec = db.get(ScheduleRecord, schedule_id)
        if rec is None or rec.tenant != tenant:
            raise NotFound(f"no schedule {schedule_id!r} for tenant {tenant!r}")
        return rec

    def listing(self, tenant: str, limit: int = 50) -> list[ScheduleRecord]:
        """The tenant's schedules, oldest first."""
        with self._db() as db:
            return list(db.scalars(select(ScheduleRecord).where(ScheduleRecord.tenant == tenant)
                                   .order_by(ScheduleRecord.created_at, ScheduleRecord.id).limit(limit)))

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


class Ticker:
    """One worker's ticker; `step` is one pass (nothing unless it leads)."""

    def __init__(self, dispatcher: Dispatcher, clock: Callable[[], float] = time.time, name: str = "",
                 timer: Callable[[], float] = time.monotonic) -> None:
        """clock: the schedules' time (epoch seconds); timer: what a tenant's share of a pass is
        measured in (seconds; tests drive both)."""
        self.d = dispatcher
        self.s = dispatcher.s
        self.r = dispatcher.r
        self.clock = clock
        self.timer = timer
        self._spent: defaultdict[str, float] = defaultdict(float)  # tenant -> its planning time in this pass (timer seconds)
        self.key = Keys(self.s.key_prefix).ticker
        self.token = f"{name or socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.schedules = Schedules(dispatcher.jobs.engine, self.s, clock)
        self._db = sessionmaker(dispatcher.jobs.engine, expire_on_commit=False)
        self._write = sessionmaker(writer(dispatcher.jobs.engine), expire_on_commit=False)
        self._renew = self.r.register_script(_RENEW)
        self._release = self.r.register_script(_RELEASE)
        self._renewed = -math.inf  # monotonic time of the last take or renewal
        self._pruned = -math.inf

    # ---- the leader -----------------------------------------------------------------------

    def lead(self) -> bool:
        """Take the lock, or renew it where this ticker holds it: whether it leads."""
        ms = max(1, int(self.s.schedule_lock_s * 1000))
        held = bool(self.r.set(self.key, self.token, nx=True, px=ms)) or bool(self._renew(keys=[self.key], args=[self.token, ms]))
        self._renewed = time.monotonic() if held else -math.inf
        return held

    def _leads(self) -> bool:
        """Still the leader (renewed once a third of the lock's life has passed)."""
        return time.monotonic() - self._renewed < self.s.schedule_lock_s / 3 or self.lead()

    def release(self) -> None:
        """Let go of the lock (a worker shutting down): another ticker leads at its next pass."""
        try:
            self._release(keys=[self.key], args=[self.token])
        except Exception:  # noqa: BLE001 - Redis away: the lock expires by itself
            pass

    def run(self, stop: threading.Event) -> None:
        """Passes until `stop` (a worker's thread): every schedule_interval_s, and the leader's
        also when its next tick is due (not up to an interval after it)."""
        wait = self.s.schedule_interval_s
        try:
            while not stop.wait(wait):
                try:
                    done = self.step()
                    if done.get("failed") or done.get("pending") or done.get("skipped") or done.get("carried"):
                        log.warning("schedules: %s", done)
                    wait = self.pause()
                except Exception:  # noqa: BLE001 - Redis or the database away: keep trying, never die
                    log.warning("schedule pass failed", exc_info=True)
                    wait = self.s.schedule_interval_s
        finally:
            self.release()

    def pause(self) -> float:
        """Seconds until the next pass: schedule_interval_s, or where this ticker leads and a
        schedule's next tick comes sooner, until then."""
        every = self.s.schedule_interval_s
        if time.monotonic() - self._renewed >= self.s.schedule_lock_s / 3:  # not the leader (or its renewal is due)
            return every
        try:
            with self._db() as db:
                due = db.scalar(select(func.min(ScheduleRecord.next_at)).where(ScheduleRecord.paused.is_(False)))
        except Exception:  # noqa: BLE001 - the database away: the next pass says so
            return every
        return every if due is None else min(every, max(MIN_PAUSE_S, float(due) - self.clock()))

    # ---- a pass ---------------------------------------------------------------------------

    def step(self) -> dict[str, int]:
        """One pass if this ticker leads: the claims left behind, then the due schedules.
        Returns what it did: ticks submitted, failed (a refusal for good), pending (to be
        completed later), taken (another process claimed them), skipped (schedules whose
        missed ticks were skipped), carried (schedules and claims of a tenant past its share of
        the pass: the next pass's); {} where it does not lead."""
        if not self.lead():
            return {}
        now, out = self.clock(), Counter[str]()
        self._spent = defaultdict(float)
        for claim in self._left_behind(now):
            if not self._leads():
                return dict(out)
            out[self._complete(claim)] += 1
        after: tuple[float, str] = (-math.inf, "")
        while True:
            due = self._due(now, after)
            if due and not self._leads():
                return dict(out)
            out.update(self.fire(due, now))
            if len(due) < BATCH:
                break
            after = (due[-1].next_at, due[-1].id)
        if time.monotonic() - self._pruned >= PRUNE_S:
            self._pruned = time.monotonic()
            out["pruned"] = self._prune(now)
        return dict(out)

    def _due(self, now: float, after: tuple[float, str]) -> list[ScheduleRecord]:
        """Due schedules past `after` (next_at, id), the most overdue first."""
        s = ScheduleRecord
        with self._db() as db:
            return list(db.scalars(select(s).where(s.paused.is_(False), s.next_at <= now,
                                                   or_(s.next_at > after[0], and_(s.next_at == after[0], s.id > after[1])))
                                   .order_by(s.next_at, s.id).limit(BATCH)))

    def fire(self, due: list[ScheduleRecord], now: float) -> Counter[str]:
        """Submit the due schedules' ticks at `now` (their missed ones as each one's policy says):
        their claims and next_at moves in one transaction, their jobs in one batch per tenant
        (Dispatcher.submit_batch), the ticks' outcomes in one more transaction."""
        out, plans = Counter[str](), []
        for sch in due:
            if self._spent[sch.tenant] >= SHARE_S:  # its share of this pass spent: next_at unmoved, the next pass's
                out["carried"] += 1
                continue
            on_time, missed = self.due_ticks(sch, now)
            out["skipped"] += int(sch.missed == "skip" and sch.next_at < self._edge(now))
            ticks = (missed if sch.missed == "catch_up" else []) + on_time
            nxt = cron.after(sch.cron, sch.timezone, ticks[-1] if len(on_time) == MAX_TICKS else max([now, *ticks]))
            plans.append((sch, [(t, *p) for t, p in zip(ticks, self._plan(sch, ticks), strict=True)], nxt))
        if not plans:
            return out
        won = self._claim_all(plans)
        out["taken"] += sum(len(ticks) for _, ticks, _ in plans) - len(won)  # claimed by another process: its to submit
        out.update(self._submit_all(won))
        return out

    def due_ticks(self, sch: ScheduleRecord, now: float) -> tuple[list[float], list[float]]:
        """(on time, missed to catch up): the ticks from next_at to now, those within
        schedule_grace_s of now (at most MAX_TICKS), and the latest max_catch_up of the older
        ones; each list oldest first."""
        edge = self._edge(now)
        missed: list[float] = []
        if sch.next_at < edge and sch.missed == "catch_up" and sch.max_catch_up:
            missed = [t for t in cron.before(sch.cron, sch.timezone, edge, sch.max_catch_up) if t >= sch.next_at][::-1]
        t = sch.next_at if sch.next_at >= edge else cron.after(sch.cron, sch.timezone, edge - 1)
        on_time: list[float] = []
        while t <= now and len(on_time) < MAX_TICKS:
            on_time.append(t)
            t = cron.after(sch.cron, sch.timezone, t)
        return on_time, missed

    def _edge(self, now: float) -> float:
        """The oldest tick on time at `now` (ticks are whole seconds)."""
        return float(math.ceil(now - self.s.schedule_grace_s))

    # ---- a tick ---------------------------------------------------------------------------

    def _claim_all(self, plans: list[tuple[ScheduleRecord, list[TickPlan], float]]) -> list[Won]:
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
        """_claim_all for one schedule, in one transaction; where another process claimed one
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

    def _submit_all(self, won: list[Won]) -> Counter[str]:
        """Submit the fresh claims' jobs, a batch per tenant (Dispatcher.submit_batch), record
        their ticks as submitted (or failed, where none of a tick's jobs could be) in one
        transaction, then admit each tenant's jobs to the broker (as many as its share: the rest
        wait in SQL, queued, as any backlog does).  A tick is submitted once its jobs are queued
        in SQL: their admission, which the reaper also runs, neither delays its record nor fails
        it.  A tenant whose batch is refused as a whole (its rate, a quota, Redis or the database
        away) has its claims submitted one at a time (_submit: a refusal for a while leaves a
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
            except Exception:  # noqa: BLE001 - as a whole: one at a time, as _submit takes them
                for sch, claim, planned, problems in claims:
                    out[self._submit(sch, claim, planned, problems, fresh=True)] += 1
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

    def _plan(self, sch: ScheduleRecord, ticks: list[float]) -> list[tuple[list[Planned], list[str]]]:
        """Each tick's jobs (its template built once for them all: templates.plan_ticks), the
        time charged to its tenant's share of the pass."""
        start = self.timer()
        try:
            return templates.plan_ticks(sch.id, ticks, sch.template, sch.tenant, self.schedules._reader(sch.tenant))
        except (BadInput, NotFound) as e:  # its dataset deleted, or none of its rows fits now
            return [([], [e.message]) for _ in ticks]
        finally:
            self._spent[sch.tenant] += self.timer() - start

    def _submit(self, sch: ScheduleRecord, claim: TickRecord, planned: list[Planned], problems: list[str],
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

    def _left_behind(self, now: float) -> list[TickRecord]:
        with self._db() as db:
            return list(db.scalars(select(TickRecord).where(TickRecord.status == "claimed",
                                                            TickRecord.claimed_at < now - RETRY_S)
                                   .order_by(TickRecord.claimed_at).limit(BATCH)))

    def _complete(self, claim: TickRecord) -> str:
        """A claim left behind (its claimer died, or was refused for a while): the jobs it
        planned, their specs rebuilt from the template as it is now (a group whose rows make no
        payload any more fails)."""
        with self._db() as db:
            sch = db.get(ScheduleRecord, claim.schedule_id)
        if sch is None:
            return "taken"  # deleted meanwhile (its ticks with it)
        if self._spent[sch.tenant] >= SHARE_S:  # its share of this pass spent: still claimed, the next pass's
            return "carried"
        [(planned, problems)] = self._plan(sch, [claim.tick_at])
        return self._submit(sch, claim, [p for p in planned if p.job_id in claim.jobs], problems)

    def _prune(self, now: float, limit: int = 1000) -> int:
        """Delete up to `limit` ended ticks claimed more than job_retention_s ago (their jobs' retention)."""
        with self._write.begin() as db:
            old = select(TickRecord.id).where(TickRecord.status != "claimed",
                                              TickRecord.claimed_at < now - self.s.job_retention_s).limit(limit)
            return int(db.execute(delete(TickRecord).where(TickRecord.id.in_(old.scalar_subquery()))).rowcount)  # type: ignore[attr-defined]


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
