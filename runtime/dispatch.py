"""Submitting, routing, cancelling and reaping jobs: what the API (and tests, benchmarks) call.

    submit: check the spec -> take a rate-limit token -> SQL job row (queued) -> status event
            -> send the job id to its queue (unless an earlier job of its session is unfinished:
               the one finishing sends it, so a session's jobs run in submission order)
    reap:   requeue running jobs whose lease expired (their worker died) to the shared queue;
            send again queued jobs that sat on a dead worker's queue or were never delivered

Tasks are sent by name through `send(job_id, queue)` (workers/celery_app.py provides one over
Celery), so this module imports no Celery, no torch, and no workflow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from runtime.errors import NotFound
from runtime.events import JobEvents
from runtime.jobs import Jobs
from runtime.keys import Keys
from runtime.ratelimit import RateLimiter
from runtime.records import JobRecord
from runtime.routing import Routing
from runtime.schemas import check_spec

Send = Callable[[str, str], None]  # (job id, queue)


class Dispatcher:
    def __init__(self, client: redis.Redis, jobs: Jobs, send: Send) -> None:
        self.r = client
        self.jobs = jobs
        self.s = jobs.s
        self.k = Keys(self.s.key_prefix)
        self.routing = Routing(client, self.s)
        self.events = JobEvents(client, self.s)
        self.limiter = RateLimiter(client, self.s)
        self.send = send

    def submit(self, kind: str, tenant: str, spec: dict[str, Any], session: str | None = None,
               priority: str = "interactive") -> JobRecord:
        """BadInput, NotFound or RateLimited before anything is written."""
        check_spec(kind, spec, session)
        if session is not None:
            self.jobs.check_session(session, tenant)
        self.limiter.take(tenant)
        queue = self.routing.route(session, priority)
        job = self.jobs.create(kind, tenant, spec, session, priority, queue)
        self.events.publish(job.id, {"type": "status", "status": "queued", "seq": job.seq})
        if self.jobs.blocked(job):  # the job before it sends it when it ends
            self.jobs.mark_dispatched(job.id, "")
            return self.jobs.get(job.id)
        self.send(job.id, queue)
        return job

    def send_job(self, job: JobRecord, shared: bool = False) -> str:
        queue = self.routing.shared(job.priority) if shared else self.routing.route(job.session_id, job.priority)
        self.jobs.mark_dispatched(job.id, queue)  # before the send: a fast worker must not see it unsent
        self.send(job.id, queue)
        return queue

    def dispatch_next(self, session: str | None) -> JobRecord | None:
        """Send the session's next queued job, if its turn has come."""
        nxt = self.jobs.next_queued(session) if session is not None else None
        if nxt is not None:
            self.send_job(nxt)
        return nxt

    def cancel(self, job_id: str, tenant: str) -> JobRecord:
        job = self.jobs.cancel(job_id, tenant)
        if job.status == "running":
            self.events.request_cancel(job.id)  # the holder stops at its next step
        elif job.status == "cancelled" and job.started_at is None:
            self.events.publish(job.id, {"type": "status", "status": "cancelled"})
            self.dispatch_next(job.session_id)
        return job

    def wait(self, job_id: str, timeout_s: float) -> JobRecord:
        """The job once finished (its final status event), or as it is at the timeout."""
        self.events.wait(job_id, timeout_s)
        return self.jobs.get(job_id)

    # ---- the reaper -------------------------------------------------------------------------

    def reap(self) -> dict[str, int]:
        """One pass; several workers run it, one at a time (a Redis lock for the interval)."""
        if not self.r.set(self.k.reaper, 1, nx=True, px=max(1, int(self.s.reaper_interval_s * 900))):
            return {}
        out = {"requeued": 0, "gave_up": 0, "resent": 0}
        for job in self.jobs.expired():
            if self.jobs.requeue(job):
                out["requeued"] += 1
                self.events.publish(job.id, {"type": "status", "status": "queued",
                                             "reason": f"worker {job.worker} lost its lease"})
                if not self.jobs.blocked(job):
                    self.send_job(job, shared=True)  # its worker may still look alive for a few beats
            else:
                try:
                    final = self.jobs.get(job.id)
                except NotFound:
                    continue
                if final.status == "failed":
                    out["gave_up"] += 1
                    self.events.publish(job.id, {"type": "status", "status": "failed", "error": final.error})
                    self.dispatch_next(job.session_id)
        dead = [q for q in self.jobs.queued_queues()
                if (w := self.routing.worker_of(q)) is not None and not self.routing.alive(w)]
        for job in self.jobs.stale(dead):
            if not self.jobs.blocked(job):
                out["resent"] += 1
                self.send_job(job, shared=True)
        return out
