"""A job waiting for its client (requires_action): the holder suspends it at calls its client
runs, the client's outputs are kept and queue it again once every pending call has one, and a
wait that runs out fails it (tool_deadline).  A tool's output the running job keeps (once) is
written here too."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update

from runtime.errors import AlreadyAnswered, ClaimLost, DeadlinePassed, NotFound, NotWaiting, UnknownCall
from runtime.jobs.table import JobTable, matched
from runtime.tables import JobRecord
from runtime.webhooks import outbox


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
