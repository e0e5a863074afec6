"""The ticker that submits the schedules' ticks (`Ticker`), which every worker runs and one
leads; the ticks' claims and submissions are runtime/schedules/claims.py's.

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
on.  Time is `clock` (epoch seconds), which tests and the benchmark drive.
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

from sqlalchemy import and_, delete, func, or_, select
from sqlalchemy.orm import sessionmaker

from runtime.db import writer
from runtime.errors import BadInput, NotFound
from runtime.jobs.dispatch import Dispatcher
from runtime.keys import Keys
from runtime.schedules import cron, templates
from runtime.schedules.claims import Claims
from runtime.schedules.crud import Schedules
from runtime.schedules.templates import Planned
from runtime.tables import ScheduleRecord, TickRecord

log = logging.getLogger("setflow.schedules")
BATCH = 1000  # schedules one query of a pass reads and fires together (and claims left behind one pass completes)
MAX_TICKS = 100  # ticks of one schedule one pass submits at most (the rest: the next pass)
RETRY_S = 10.0  # a claim not submitted this long after it was made is completed by the next pass
MIN_PAUSE_S = 0.01  # the leader's shortest wait between two passes
SHARE_S = 0.25  # a tenant's planning time in one pass, at most (then: the next pass; its first schedule always goes)
PRUNE_S = 60.0  # how often the leader deletes ticks past their retention (at most 1000 a time)
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


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
        self.claims = Claims(dispatcher, clock, self._write)
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
        won = self.claims.claim_all(plans)
        out["taken"] += sum(len(ticks) for _, ticks, _ in plans) - len(won)  # claimed by another process: its to submit
        out.update(self.claims.submit_all(won))
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
        return self.claims.submit(sch, claim, [p for p in planned if p.job_id in claim.jobs], problems)

    def _prune(self, now: float, limit: int = 1000) -> int:
        """Delete up to `limit` ended ticks claimed more than job_retention_s ago (their jobs' retention)."""
        with self._write.begin() as db:
            old = select(TickRecord.id).where(TickRecord.status != "claimed",
                                              TickRecord.claimed_at < now - self.s.job_retention_s).limit(limit)
            return int(db.execute(delete(TickRecord).where(TickRecord.id.in_(old.scalar_subquery()))).rowcount)  # type: ignore[attr-defined]
