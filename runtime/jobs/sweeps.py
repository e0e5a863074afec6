"""The reaper's queries of the jobs table: running jobs whose lease expired (requeued, or failed
once their attempts are spent), queued jobs sent but maybe never delivered, and finished jobs
past their retention."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, delete, or_, select, update

from runtime.jobs.table import JobTable, matched, waits_for_an_earlier_job
from runtime.sessions import quota
from runtime.tables import TERMINAL, JobRecord
from runtime.webhooks import outbox


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

