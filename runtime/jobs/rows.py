"""Jobs in SQL: their lifecycle, claimed and finished under a fencing token.

    create -> queued --claim--> running --finish--> succeeded | failed | cancelled
               ^ ^                 |  |
               | +---- requeue ----+  |  (the reaper: the running job's lease expired)
               |                      | suspend (at calls its client runs)
               +------ answer ---- requires_action --cancel / expire--> cancelled | failed

A job waiting for its client (requires_action) holds no claim, no lease and no worker; the
outputs its client sends are kept (`tool_outputs`), and once every pending call has one it is
queued again, its attempts counted afresh, and any worker reruns it: its committed steps replay,
and the outputs stand where the calls were.

A claim is an optimistic UPDATE conditioned on the row being as it was read (status and
attempts), so two deliveries of one job never both run it: the loser sees a running job under a
live lease, or a finished one, and does nothing.  Every later write of the holder (heartbeat,
step, finish) is conditioned on its claim token (`owner`): a holder whose job was requeued after
its lease expired can no longer change the row (ClaimLost), only the new holder can.

Jobs on one session run one at a time, in submission order (`seq`): a job is `blocked` while an
earlier job of its session has not finished; the one finishing sends the next (runtime/jobs/dispatch.py).

Every write that ends a job (finish, cancel, expire_waits, _give_up) writes its webhook messages
in the same transaction (runtime/webhooks/outbox.py enqueue).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, case, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from runtime.errors import BadInput, Busy, Duplicate, NotFound, RateLimited
from runtime.jobs import hosts
from runtime.jobs.hosts import Host
from runtime.jobs.table import JobSweeps, JobWaits, matched, waits_for_an_earlier_job
from runtime.sessions import quota
from runtime.tables import PRIORITIES, TERMINAL, JobRecord, SessionRecord, owned
from runtime.webhooks import outbox


@dataclass
class Claim:
    job: JobRecord
    owner: str | None  # the claim token; None: not claimed, see reason
    reason: str = ""  # "claimed", "finished", "running elsewhere", "waiting", "waiting for tool outputs", "gave up"


class Jobs(JobWaits, JobSweeps):
    """One short transaction per call; the plumbing and reads, a wait for a client's outputs and
    the reaper's queries are runtime/jobs/table.py's."""

    # ---- submission -------------------------------------------------------------------------

    @staticmethod
    def check(tenant: str, priority: str) -> None:
        if priority not in PRIORITIES:
            raise BadInput(f"priority must be one of {PRIORITIES}, got {priority!r}")
        if not isinstance(tenant, str) or not tenant or len(tenant) > 128:
            raise BadInput("tenant must be 1..128 characters")

    def create(self, kind: str, tenant: str, spec: dict[str, Any], session: str | None = None,
               priority: str = "interactive", queue: str = "", open_session: bool = False,
               host: Host | None = None, positions: int | None = None, job_id: str | None = None,
               tick: tuple[str, float] | None = None) -> tuple[JobRecord, bool]:
        """A queued job, and whether it is blocked (an earlier job of its session is
        unfinished: that one's end sends it).  A session's jobs get consecutive seq numbers in
        submission order.  queue: where it is about to be sent, recorded as sent now unless it
        is blocked (then recorded as never sent: the reaper sends it if nobody else does).
        open_session (with session None): the job runs on a new session, written in the same
        transaction (a refused job leaves no session behind).  host: what the session is bound
        to where it is bound to no model yet (its model, numerics and weights); the job carries
        its session's pool, and only workers of that pool run it.  positions: what the job
        appends to its session at most, as the API planned it (kept: the next submission's
        plan adds it up).  OverBudget where the tenant's turns fill its SQL quota already, or a
        new session would pass it (runtime/sessions/quota.py); the session used is touched
        (its retention counts from its last use).  job_id: its id (default: a random one);
        Duplicate where a job holds it already (nothing written).  tick: (schedule id, tick) of
        the schedule's tick that submits it."""
        self.check(tenant, priority)
        for _ in range(20):  # two submissions to one session at once: one of them takes the next seq
            try:
                with self._write.begin() as db:
                    seq, pool = 0, ""
                    quota.check_room(db, tenant, self.quota)
                    if session is None and open_session:
                        session = self._open_session(db, tenant)
                    self._check_unfinished(db, tenant)
                    if session is not None:
                        seq, pool = self._place(db, session, tenant, host)
                    blocked = session is not None and db.scalar(select(JobRecord.id).where(
                        JobRecord.session_id == session, JobRecord.status.not_in(TERMINAL)).limit(1)) is not None
                    sent = bool(queue) and not blocked
                    row = _queued(kind, tenant, spec, session, seq, priority, pool, job_id, tick, positions=positions,
                                  queue=queue if sent else "")
                    quota.charge(db, tenant, self.quota, stored=row["nbytes"])
                    job = JobRecord(**row)
                    db.add(job)
                return job, blocked
            except IntegrityError:
                if job_id is not None and self._exists(job_id):
                    raise Duplicate(f"job {job_id} exists already") from None
                continue
        raise BadInput(f"session {session}: too many concurrent submissions")

    def create_batch(self, tenant: str, batch: list[tuple[str, dict[str, Any], str, tuple[str, float]]],
                     priority: str = "batch") -> None:
        """Queued jobs, each the first (seq 1) on a new session of its own (a schedule's ticks'
        jobs: kind, spec, job id, tick), in one transaction: what create() writes for each with
        open_session, the tenant's SQL quota and its unfinished jobs checked once for them all,
        the rows inserted in bulk.  OverBudget or RateLimited where they do not all fit,
        Duplicate where an id is taken: nothing written."""
        self.check(tenant, priority)
        try:
            with self._write.begin() as db:
                quota.check_room(db, tenant, self.quota)
                self._check_unfinished(db, tenant, more=len(batch))
                sessions = [secrets.token_hex(16) for _ in batch]
                db.execute(insert(SessionRecord), [{"id": s, "tenant": tenant, "model_fingerprint": ""} for s in sessions])
                # a new session's first job: seq 1, bound to no model yet (its pool ""), as create() places it
                rows = [_queued(kind, tenant, spec, s, 1, priority, "", job_id, tick)
                        for (kind, spec, job_id, tick), s in zip(batch, sessions, strict=True)]
                quota.charge(db, tenant, self.quota, sessions=len(batch), stored=sum(r["nbytes"] for r in rows))
                db.execute(insert(JobRecord), rows)
        except IntegrityError:
            raise Duplicate(f"a job of the batch exists already: {[j for _, _, j, _ in batch][:3]}...") from None

    def _open_session(self, db: Session, tenant: str) -> str:
        """A new session of the tenant's, in the submission's transaction; charged to its quota."""
        session = secrets.token_hex(16)
        db.add(SessionRecord(id=session, tenant=tenant, model_fingerprint=""))
        db.flush()
        quota.charge(db, tenant, self.quota, sessions=1)
        return session

    def _check_unfinished(self, db: Session, tenant: str, more: int = 1) -> None:
        """RateLimited where `more` jobs would take the tenant past tenant_max_unfinished jobs
        queued or running."""
        unfinished = int(db.scalar(select(func.count()).select_from(JobRecord).where(
            JobRecord.tenant == tenant, JobRecord.status.not_in(TERMINAL))) or 0)
        if unfinished + more > self.s.tenant_max_unfinished:
            raise RateLimited(f"tenant {tenant!r} has {unfinished} unfinished jobs (queued or running), "
                              f"the most it may have (tenant_max_unfinished): wait for some to end",
                              retry_after_s=1.0)

    @staticmethod
    def _place(db: Session, session: str, tenant: str, host: Host | None) -> tuple[int, str]:
        """(seq, pool) of the session's next job: the row locked (vs a delete, Records.delete_session),
        bound to `host` where no job bound it to a model yet, touched (its retention counts from
        its last use).  NotFound for an unknown session and for another tenant's."""
        owner = owned(db.get(SessionRecord, session, with_for_update=True), tenant, f"session {session!r}")
        if host is not None and not owner.model:  # bound now, by its first job
            owner.model, owner.numerics = host.model, host.numerics
            owner.model_fingerprint = owner.model_fingerprint or host.fingerprint
        pool = hosts.pool(owner.model, owner.numerics) if owner.model else ""
        owner.updated_at = datetime.now(UTC)
        seq = int(db.scalar(select(func.max(JobRecord.seq)).where(JobRecord.session_id == session)) or 0) + 1
        return seq, pool

    def admissible(self, tenant: str, cap: int, in_flight: int | None = None) -> list[JobRecord]:
        """The tenant's queued jobs not yet sent that may go now: none waits for an earlier job
        of its session; interactive before batch, then oldest first; as many as the tenant has
        room for (cap minus its jobs sent and not started; and, given `in_flight`, that minus
        its jobs sent or running)."""
        sent = and_(JobRecord.status == "queued", JobRecord.queue != "")
        with self._db() as db:
            waiting, running = db.execute(select(
                func.coalesce(func.sum(case((sent, 1), else_=0)), 0),
                func.coalesce(func.sum(case((JobRecord.status == "running", 1), else_=0)), 0)).where(
                JobRecord.tenant == tenant, JobRecord.status.in_(("queued", "running")))).one()
            room = cap - int(waiting)
            if in_flight is not None:
                room = min(room, in_flight - int(waiting) - int(running))
            if room <= 0:
                return []
            return list(db.scalars(select(JobRecord).where(
                JobRecord.tenant == tenant, JobRecord.status == "queued", JobRecord.queue == "", ~waits_for_an_earlier_job())
                .order_by(JobRecord.priority == "batch", JobRecord.created_at).limit(room)))

    def mark_sending(self, job_id: str, queue: str) -> bool:
        """Record the job as sent to `queue`, if nobody has (it is still queued and unsent):
        True when this caller is the one to send it."""
        with self._write.begin() as db:
            return matched(db.execute(update(JobRecord).where(
                JobRecord.id == job_id, JobRecord.status == "queued", JobRecord.queue == "")
                .values(queue=queue, dispatched_at=time.time()))) == 1

    def tenants_unsent(self, limit: int = 1000) -> list[str]:
        """Tenants with queued jobs that no admission has sent, those waiting longest first."""
        with self._db() as db:
            return list(db.scalars(select(JobRecord.tenant).where(JobRecord.status == "queued", JobRecord.queue == "")
                                   .group_by(JobRecord.tenant).order_by(func.min(JobRecord.created_at)).limit(limit)))

    def mark_dispatched(self, job_id: str, queue: str, sent: bool = True) -> None:
        """Where the job was sent; sent=False: the send failed (the reaper sends it at its next pass)."""
        with self._write.begin() as db:
            db.execute(update(JobRecord).where(JobRecord.id == job_id, JobRecord.status == "queued")
                       .values(queue=queue if sent else "", dispatched_at=time.time() if sent else 0.0))

    # ---- ordering ---------------------------------------------------------------------------

    def blocked(self, job: JobRecord) -> bool:
        """An earlier job of the same session has not finished."""
        if job.session_id is None:
            return False
        with self._db() as db:
            return db.scalar(select(JobRecord.id).where(
                JobRecord.session_id == job.session_id, JobRecord.seq < job.seq,
                JobRecord.status.not_in(TERMINAL)).limit(1)) is not None

    def next_queued(self, session: str) -> JobRecord | None:
        """The session's next job to run: its earliest unfinished one, when that one is queued."""
        with self._db() as db:
            job = db.scalar(select(JobRecord).where(JobRecord.session_id == session,
                                                    JobRecord.status.not_in(TERMINAL))
                            .order_by(JobRecord.seq).limit(1))
        return job if job is not None and job.status == "queued" else None

    # ---- the holder -------------------------------------------------------------------------

    def claim(self, job_id: str, worker: str) -> Claim:
        now = time.time()
        job = self.get(job_id)
        if job.status in TERMINAL:
            return Claim(job, None, "finished")
        if job.status == "running" and job.lease_until >= now:
            return Claim(job, None, "running elsewhere")
        if job.status == "requires_action":  # a late or duplicated message: its client's outputs send it again
            return Claim(job, None, "waiting for tool outputs")
        if self.blocked(job):
            return Claim(job, None, "waiting")
        if job.attempts >= self.s.job_max_attempts:
            if self._give_up(job):
                return Claim(self.get(job_id), None, "gave up")
            return Claim(self.get(job_id), None, "running elsewhere")  # its holder renewed meanwhile
        owner = secrets.token_hex(16)
        with self._write.begin() as db:
            n = matched(db.execute(update(JobRecord).where(
                JobRecord.id == job_id, JobRecord.status == job.status, JobRecord.status.in_(("queued", "running")),
                JobRecord.attempts == job.attempts,
                JobRecord.owner.is_(None) if job.owner is None else JobRecord.owner == job.owner,
                # a holder that renewed its lease since we read it keeps the job
                *([JobRecord.lease_until < now] if job.status == "running" else []),
            ).values(status="running", owner=owner, worker=worker, attempts=job.attempts + 1,
                     lease_until=now + self.s.job_lease_s,
                     started_at=job.started_at or datetime.now(UTC))))
        if n != 1:  # another delivery claimed it between our read and our write
            return Claim(self.get(job_id), None, "running elsewhere")
        return Claim(self.get(job_id), owner, "claimed")

    def heartbeat(self, job_id: str, owner: str) -> bool:
        """Extend the holder's lease; ClaimLost when the job is no longer this holder's.
        Returns whether a cancellation was requested (the Redis flag's durable twin)."""
        self._own(job_id, owner, lease_until=time.time() + self.s.job_lease_s)
        with self._db() as db:
            return bool(db.scalar(select(JobRecord.cancel_requested).where(JobRecord.id == job_id)) or False)

    def step_done(self, job_id: str, owner: str, step: int, progress: dict[str, Any]) -> None:
        self._own(job_id, owner, step=step, progress=progress, lease_until=time.time() + self.s.job_lease_s)

    def finish(self, job_id: str, owner: str, status: str, result: dict[str, Any] | None = None,
               error: dict[str, Any] | None = None) -> None:
        if status not in TERMINAL:
            raise ValueError(f"finish with a terminal status, not {status!r}")
        self._own(job_id, owner, status=status, result=result, error=error, owner=None, lease_until=0.0,
                  finished_at=datetime.now(UTC), stored=quota.size(result, error))

    # ---- cancellation -----------------------------------------------------------------------

    def cancel(self, job_id: str, tenant: str) -> tuple[JobRecord, bool]:
        """A queued job, or one waiting for its client's tool outputs, is cancelled here (returns
        it with True: this call ended it); a running one is marked, and its holder stops at its
        next step.  A finished job stays as it is.  The row is locked while this decides (a
        holder suspending the job at the same moment goes before or after, never between)."""
        self.get(job_id, tenant)
        with self._write.begin() as db:
            job = db.get(JobRecord, job_id, with_for_update=True)
            if job is None:
                raise NotFound(f"no job {job_id!r}")
            ended = job.status in ("queued", "requires_action")
            if ended:
                waited = job.status == "requires_action"
                job.status, job.owner, job.action, job.finished_at = "cancelled", None, None, datetime.now(UTC)
                job.error = {"code": "cancelled", "message": "cancelled while waiting for tool outputs" if waited
                             else "cancelled while queued"}
                outbox.enqueue(db, job_id)
            if ended or job.status == "running":  # a running one: its holder stops at its next step
                job.cancel_requested = True
        return self.get(job_id), ended

    # ---- deletion -------------------------------------------------------------------------

    def delete(self, job_id: str, tenant: str) -> None:
        """Delete a job that has ended (its turns stay: they are its session's); NotFound for an
        unknown or another tenant's, Busy for one that has not ended."""
        with self._write.begin() as db:
            gone = db.execute(delete(JobRecord).where(JobRecord.id == job_id, JobRecord.tenant == tenant,
                                                      JobRecord.status.in_(TERMINAL)).returning(JobRecord.nbytes)).all()
            if gone:
                quota.release(db, tenant, stored=gone[0][0])
        if not gone:
            self.get(job_id, tenant)  # NotFound
            raise Busy(f"job {job_id} has not ended: cancel it first")


def _queued(kind: str, tenant: str, spec: dict[str, Any], session: str | None, seq: int, priority: str, pool: str,
            job_id: str | None, tick: tuple[str, float] | None, positions: int | None = None,
            queue: str = "") -> dict[str, Any]:
    """A new job's row (its columns' values but the defaults), queued; `queue`: where it is about
    to be sent (recorded as sent now), or "" (never sent: an admission sends it)."""
    return {"id": job_id or secrets.token_hex(12), "kind": kind, "tenant": tenant, "session_id": session, "seq": seq,
            "priority": priority, "pool": pool, "spec": spec, "status": "queued", "attempts": 0, "lease_until": 0.0,
            "queue": queue, "dispatched_at": time.time() if queue else 0.0, "step": 0, "positions": positions,
            "progress": {}, "cancel_requested": False, "nbytes": quota.size(spec),
            "schedule_id": tick[0] if tick else None, "tick_at": tick[1] if tick else None}
