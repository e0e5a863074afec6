"""The jobs table under a job's lifecycle (rows.py's Jobs is each of these):

- JobTable, the plumbing: the sessions to read and to write, a job by id and the reads of many,
  a write under the holder's claim, and two SQL helpers; it knows no lifecycle of its own.
- JobWaits, a job waiting for its client (requires_action): the holder suspends it at calls its
  client runs, the client's outputs are kept and queue it again once every pending call has one,
  and a wait that runs out fails it (tool_deadline).  A tool's output the running job keeps
  (once) is written here too.
- JobSweeps, the reaper's queries: running jobs whose lease expired (requeued, or failed once
  their attempts are spent), queued jobs sent but maybe never delivered, and finished jobs past
  their retention."""

from __future__ import annotations

import functools
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, delete, func, or_, select, update
from sqlalchemy.orm import aliased, defer, sessionmaker

from runtime.db import writer
from runtime.errors import AlreadyAnswered, ClaimLost, DeadlinePassed, NotFound, NotWaiting, UnknownCall
from runtime.sessions import quota
from runtime.sessions.quota import Quota
from runtime.settings import Settings
from runtime.tables import TERMINAL, JobRecord, SessionRecord, owned
from runtime.webhooks import outbox

JOB_ID = re.compile(r"[0-9a-f]{24}")


class JobTable:
    """One short transaction per call."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.s = settings
        self.quota = Quota.of(settings)
        self._db = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)

    def get(self, job_id: str, tenant: str | None = None) -> JobRecord:
        """NotFound for an unknown job and for another tenant's."""
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise NotFound(f"no job {job_id!r}")
        with self._db() as db:
            return owned(db.get(JobRecord, job_id), tenant, f"job {job_id!r}")

    def _own(self, job_id: str, holder: str, stored: int = 0, **values: Any) -> None:
        """Write `values` to the job while `holder` holds it (running under its claim); ClaimLost
        where it does not.  An ending's webhook messages go in the same transaction, and so do
        the `stored` bytes it adds (its result), counted to its tenant (never refused: the work
        is done; the tenant's next submission is)."""
        if stored:
            values["nbytes"] = JobRecord.nbytes + stored
        with self._write.begin() as db:
            n = matched(db.execute(update(JobRecord).where(JobRecord.id == job_id, JobRecord.owner == holder,
                                                     JobRecord.status == "running").values(**values)))
            if n == 1 and stored:
                quota.charge(db, db.scalar(select(JobRecord.tenant).where(JobRecord.id == job_id)) or "", quota.COUNTED,
                             stored=stored)
            if n == 1 and values.get("status") in TERMINAL:  # finish: the ending's webhooks, in its transaction
                outbox.enqueue(db, job_id)
        if n != 1:
            raise ClaimLost(f"job {job_id}: no longer held by this worker (lease expired, requeued or cancelled)")

    def _exists(self, job_id: str) -> bool:
        with self._db() as db:
            return db.scalar(select(JobRecord.id).where(JobRecord.id == job_id)) is not None

    def existing(self, job_ids: list[str]) -> set[str]:
        """Those of the ids a job holds."""
        if not job_ids:
            return set()
        with self._db() as db:
            return set(db.scalars(select(JobRecord.id).where(JobRecord.id.in_(job_ids))))

    def listing(self, tenant: str, status: str | None = None, kind: str | None = None, session: str | None = None,
             limit: int = 50) -> list[JobRecord]:
        """The tenant's jobs, newest first, without their specs (a listing shows none)."""
        q = select(JobRecord).options(defer(JobRecord.spec, raiseload=True)).where(JobRecord.tenant == tenant)
        if status is not None:
            q = q.where(JobRecord.status == status)
        if kind is not None:
            q = q.where(JobRecord.kind == kind)
        if session is not None:
            q = q.where(JobRecord.session_id == session)
        with self._db() as db:
            return list(db.scalars(q.order_by(JobRecord.created_at.desc(), JobRecord.id).limit(limit)))

    def unfinished_jobs(self, session: str) -> list[JobRecord]:
        """The session's jobs not yet finished, in submission order."""
        with self._db() as db:
            return list(db.scalars(select(JobRecord).where(
                JobRecord.session_id == session, JobRecord.status.not_in(TERMINAL)).order_by(JobRecord.seq)))

    def planned(self, session: str) -> list[tuple[str, int | None]]:
        """(id, positions) of the session's jobs not yet finished: what they append to it at
        most, as planned at their submission (None: not planned then)."""
        with self._db() as db:
            return [(i, n) for i, n in db.execute(select(JobRecord.id, JobRecord.positions).where(
                JobRecord.session_id == session, JobRecord.status.not_in(TERMINAL)))]

    def specs(self, job_ids: list[str]) -> list[JobRecord]:
        """The jobs (their specs) by id."""
        if not job_ids:
            return []
        with self._db() as db:
            return list(db.scalars(select(JobRecord).where(JobRecord.id.in_(job_ids))))

    def counts(self) -> dict[tuple[str, str], int]:
        """(kind, status) -> jobs, over every tenant (the metrics)."""
        with self._db() as db:
            rows = db.execute(select(JobRecord.kind, JobRecord.status, func.count()).group_by(
                JobRecord.kind, JobRecord.status)).all()
        return {(k, s): int(n) for k, s, n in rows}

    def check_session(self, session: str, tenant: str) -> None:
        with self._db() as db:
            owned(db.get(SessionRecord, session), tenant, f"session {session!r}")


@functools.cache
def waits_for_an_earlier_job() -> Any:
    """A where-clause: the job's session has an unfinished job submitted before it.  Built once
    (an expression is immutable): its alias cost 1.8 ms of the API's CPU at every submission."""
    earlier = aliased(JobRecord)
    return select(earlier.id).where(earlier.session_id == JobRecord.session_id, earlier.seq < JobRecord.seq,
                                    earlier.status.not_in(TERMINAL)).exists()


def matched(result: Any) -> int:
    """Rows an UPDATE matched (a CursorResult's rowcount)."""
    return int(result.rowcount)


class JobWaits(JobTable):
    """The jobs table's calls around a wait for a client's tool outputs (rows.Jobs has them)."""

    def suspend(self, job_id: str, owner: str, calls: list[dict[str, Any]], wait_s: float) -> None:
        """The holder stops at `calls` its client runs: requires_action for up to wait_s, its
        claim and lease let go."""
        self._own(job_id, owner, status="requires_action", action={"calls": calls}, owner=None, lease_until=0.0,
                  wait_until=time.time() + wait_s)

    def answer(self, job_id: str, tenant: str, outputs: dict[str, str]) -> tuple[JobRecord, bool]:
        """Record the client's outputs of calls the job waits for; returns the job and whether it
        was queued again (every pending call has its output now: send it).  NotFound (another
        tenant's), UnknownCall, AlreadyAnswered, NotWaiting, DeadlinePassed: nothing written."""
        self.get(job_id, tenant)
        with self._write.begin() as db:
            job = db.get(JobRecord, job_id, with_for_update=True)  # two answers at once: one after the other
            if job is None:
                raise NotFound(f"no job {job_id!r}")
            have = dict(job.tool_outputs or {})
            pending = [c["id"] for c in (job.action or {}).get("calls", [])]
            for call in outputs:
                if call in have:
                    raise AlreadyAnswered(f"call {call!r} of job {job_id} has its output already")
            error = job.error or {}
            if job.status != "requires_action" and error.get("code") == "tool_deadline":
                raise DeadlinePassed(f"job {job_id} waits for its tool outputs no more: {error.get('message')}")
            if job.status != "requires_action":
                raise NotWaiting(f"job {job_id} is {job.status}, not waiting for tool outputs")
            if job.wait_until < time.time():
                raise DeadlinePassed(f"job {job_id} waited for its tool outputs until "
                                     f"{datetime.fromtimestamp(job.wait_until, UTC).isoformat()}; it has expired")
            for call in outputs:
                if call not in pending:
                    raise UnknownCall(f"job {job_id} has no call {call!r} waiting (it waits for {pending})")
            job.tool_outputs = {**have, **outputs}
            resumed = all(c in job.tool_outputs for c in pending)
            if resumed:
                job.status, job.action, job.wait_until, job.attempts = "queued", None, 0.0, 0
                job.queue, job.dispatched_at = "", 0.0  # unsent: the caller sends it (or the reaper)
        return self.get(job_id), resumed

    def keep_output(self, job_id: str, owner: str, key: str, output: str) -> None:
        """A tool's output kept with the running job (under its holder's claim: ClaimLost)."""
        with self._write.begin() as db:
            job = db.get(JobRecord, job_id, with_for_update=True)
            if job is None or job.owner != owner or job.status != "running":
                raise ClaimLost(f"job {job_id}: no longer held by this worker")
            job.tool_outputs = {**(job.tool_outputs or {}), key: output}

    def expire_waits(self, limit: int = 100) -> list[JobRecord]:
        """Fail the jobs whose wait for their client's tool outputs ran out; returns them."""
        now = time.time()
        with self._db() as db:
            late = list(db.scalars(select(JobRecord).where(JobRecord.status == "requires_action",
                                                           JobRecord.wait_until < now).limit(limit)))
        out = []
        for job in late:
            calls = [c["id"] for c in (job.action or {}).get("calls", [])]
            with self._write.begin() as db:
                n = matched(db.execute(update(JobRecord).where(
                    JobRecord.id == job.id, JobRecord.status == "requires_action", JobRecord.wait_until < now)
                    .values(status="failed", action=None, finished_at=datetime.now(UTC),
                            error={"code": "tool_deadline",
                                   "message": f"no output of {calls} came before its deadline"})))
                if n == 1:
                    outbox.enqueue(db, job.id)
            if n == 1:
                out.append(self.get(job.id))
        return out


class JobSweeps(JobTable):
    """What the reaper reads and writes (rows.Jobs has it); a claim of a job whose attempts are
    spent fails it here too (_give_up)."""

    def expired(self, limit: int = 100) -> list[JobRecord]:
        """Running jobs whose holder stopped renewing its lease (its worker died or hung)."""
        with self._db() as db:
            return list(db.scalars(select(JobRecord).where(JobRecord.status == "running",
                                                           JobRecord.lease_until < time.time()).limit(limit)))

    def requeue(self, job: JobRecord) -> bool:
        """Back to queued, if it is still the expired claim the reaper read."""
        if job.attempts >= self.s.job_max_attempts:
            self._give_up(job)
            return False
        with self._write.begin() as db:
            n = matched(db.execute(update(JobRecord).where(
                JobRecord.id == job.id, JobRecord.status == "running", JobRecord.owner == job.owner,
                JobRecord.lease_until < time.time()).values(status="queued", owner=None)))
        return n == 1

    def stale(self, dead_queues: list[str], busy_queues: list[str] = (), limit: int = 100) -> list[JobRecord]:  # type: ignore[assignment]
        """Queued jobs sent but maybe never delivered: sent more than job_requeue_after_s ago, or
        to a dead worker's queue.  One in a busy queue (a shared queue with a backlog every worker
        serves) waits its turn: it counts only past 3 x job_requeue_after_s.  Never one that
        waits for an earlier job of its session (that one's end sends it).  Filtered here, in
        SQL, so that a page of jobs that legitimately wait cannot starve the others."""
        now = time.time()
        old, very_old = now - self.s.job_requeue_after_s, now - 3 * self.s.job_requeue_after_s
        due = and_(JobRecord.dispatched_at < old, or_(JobRecord.queue.not_in(list(busy_queues)),
                                                      JobRecord.dispatched_at < very_old))
        conds = [due]
        if dead_queues:
            conds.append(JobRecord.queue.in_(dead_queues))
        waits = waits_for_an_earlier_job()
        with self._db() as db:
            return list(db.scalars(select(JobRecord).where(and_(JobRecord.status == "queued", JobRecord.queue != "",
                                                                or_(*conds), ~waits))
                                   .order_by(JobRecord.created_at).limit(limit)))

    def prune(self, limit: int = 1000) -> int:
        """Delete up to `limit` finished jobs that ended more than job_retention_s ago (oldest
        first); returns how many.  Their turns stay (a turn keeps its job's id); their event
        streams have expired already (events_ttl_s)."""
        cutoff = datetime.now(UTC) - timedelta(seconds=self.s.job_retention_s)
        with self._write.begin() as db:
            old = select(JobRecord.id).where(JobRecord.status.in_(TERMINAL), JobRecord.finished_at < cutoff) \
                .order_by(JobRecord.finished_at).limit(limit)
            gone = db.execute(delete(JobRecord).where(JobRecord.id.in_(old.scalar_subquery()))
                              .returning(JobRecord.tenant, JobRecord.nbytes)).all()
            freed: dict[str, int] = {}
            for tenant, n in gone:
                freed[tenant] = freed.get(tenant, 0) + n
            for tenant, n in sorted(freed.items()):  # the tenants' usage rows in one order: no deadlock
                quota.release(db, tenant, stored=n)
            return len(gone)

    def queued_queues(self) -> list[str]:
        with self._db() as db:
            return [q for q in db.scalars(select(JobRecord.queue).where(JobRecord.status == "queued").distinct()) if q]

    def _give_up(self, job: JobRecord) -> bool:
        """Fail a job whose attempts are spent: only as it was read (queued, or running under
        an expired lease), never under a holder that renewed its lease meanwhile.  True: failed."""
        live = or_(JobRecord.status == "queued", JobRecord.lease_until < time.time())
        with self._write.begin() as db:
            n = matched(db.execute(update(JobRecord).where(JobRecord.id == job.id, JobRecord.status.in_(("queued", "running")),
                                              JobRecord.attempts == job.attempts, live,
                                              JobRecord.owner.is_(None) if job.owner is None
                                              else JobRecord.owner == job.owner)
                         .values(status="failed", owner=None, finished_at=datetime.now(UTC),
                                 error={"code": "worker_lost",
                                        "message": f"gave up after {job.attempts} attempts (worker lost or time limit)"})))
            if n == 1:
                outbox.enqueue(db, job.id)
        return n == 1
