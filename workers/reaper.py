"""The reaper: what dead workers and silent clients leave behind, a method per pass.  Every
worker runs it (workers/watch.py); a Redis lock lets one pass run per interval.

    run:       reap_jobs -> (this worker took the pass) retain_sessions -> compact_streams
               -> (collect: gc_interval_s passed) sweep_sessions -> sweep_streams
    reap_jobs: requeue_expired -> expire_waits -> resend_stranded -> admit_unsent -> prune

A pass of `run` that fails is logged, never fatal: Redis or the database away, the next pass
tries again.  Knows nothing of Celery (the dispatcher sends)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from runtime.errors import NotFound
from runtime.jobs.dispatch import Dispatcher
from runtime.sessions import retention
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.tables import PRIORITIES

log = logging.getLogger("setflow.worker")


class Reaper:
    def __init__(self, dispatcher: Dispatcher, store: SessionStore) -> None:
        self.d = dispatcher
        self.jobs = dispatcher.jobs
        self.routing = dispatcher.routing
        self.store = store

    def run(self, collect: bool = True) -> dict[str, int]:
        """One reaper pass: the jobs, then, when this worker took the pass (the reaper's lock:
        one worker per interval), the sessions idle past their retention and the ended jobs'
        streams that are due, and when `collect` (gc_interval_s has passed) the sessions' sweep
        and the event streams' sweep.  Returns what the pass did ({} when another worker holds
        the lock)."""
        done: dict[str, int] = {}
        try:
            done = self.reap_jobs()
            if any(done.values()):
                log.warning("reaper: %s", done)
        except Exception:  # noqa: BLE001 - Redis or the database away: keep trying, never die
            log.warning("reaper pass failed", exc_info=True)
        if done:
            _quietly(done, self.retain_sessions, "session retention failed")
            _quietly(done, self.compact_streams, "event stream compaction failed")
        if done and collect:
            _quietly(done, self.sweep_sessions, "session sweep failed")
            _quietly(done, self.sweep_streams, "event stream sweep failed")
        return done

    # ---- the jobs -----------------------------------------------------------------------------

    def reap_jobs(self) -> dict[str, int]:
        """The jobs' passes, where this worker takes the interval's lock ({} where another holds it)."""
        d = self.d
        if not d.r.set(d.k.reaper, 1, nx=True, px=max(1, int(d.s.reaper_interval_s * 900))):
            return {}
        out = {"requeued": 0, "gave_up": 0, "resent": 0, "admitted": 0, "expired": 0}
        out.update(self.requeue_expired())
        out["expired"] = self.expire_waits()
        out["resent"] = self.resend_stranded()
        out["admitted"] = self.admit_unsent()
        out["pruned"] = self.jobs.prune()  # finished jobs past job_retention_s
        return out

    def requeue_expired(self) -> dict[str, int]:
        """Running jobs whose lease expired (their worker died): back to the shared queue, or
        failed where their attempts are spent."""
        out = {"requeued": 0, "gave_up": 0}
        for job in self.jobs.expired():
            if self.jobs.requeue(job):
                out["requeued"] += 1
                if not self.jobs.blocked(job):
                    self.d.send_job(job, shared=True)  # its worker may still look alive for a few beats
                self.d.publish(job, {"type": "status", "status": "queued", "reason": f"worker {job.worker} lost its lease"})
            else:
                try:
                    final = self.jobs.get(job.id)
                except NotFound:
                    continue
                if final.status == "failed":
                    out["gave_up"] += 1
                    self.d.publish(job, {"type": "status", "status": "failed", "error": final.error})
                    self.d.dispatch_next(job.session_id)
        return out

    def expire_waits(self) -> int:
        """Jobs whose client never sent the tool outputs they waited for: failed."""
        n = 0
        for job in self.jobs.expire_waits():
            n += 1
            self.d.publish(job, {"type": "status", "status": "failed", "error": job.error})
            self.d.dispatch_next(job.session_id)
        return n

    def resend_stranded(self) -> int:
        """Queued jobs that sat on a dead worker's queue or were never delivered: sent again to
        the shared queue (none that waits for an earlier job of its session)."""
        queued = self.jobs.queued_queues()
        dead = [q for q in queued if (w := self.routing.worker_of(q)) is not None and not self.routing.alive(w)]
        # a shared queue with a backlog: its jobs wait their turn (every worker of its pool serves
        # it), not lost; a worker's own queue is another matter (alive and not consuming strands them)
        shared = [*(self.routing.shared(p) for p in PRIORITIES), *(q for q in queued if self.routing.worker_of(q) is None)]
        busy = [q for q in dict.fromkeys(shared) if self.routing.depth(q)]
        n = 0
        for job in self.jobs.stale(dead, busy):
            n += 1
            self.d.send_job(job, shared=True)
        return n

    def admit_unsent(self) -> int:
        """The tenants with queued jobs never sent (a failed send, a lost wake-up): admitted."""
        n = 0
        for tenant in self.jobs.tenants_unsent():
            try:
                n += self.d.admit(tenant)
            except Exception:  # noqa: BLE001 - the next pass tries again; the others still go
                log.warning("reaper: admission of tenant %s failed", tenant, exc_info=True)
        return n

    # ---- the sessions and the streams ------------------------------------------------------------

    def retain_sessions(self) -> dict[str, int]:
        """Sessions idle past session_retention_s, a bounded batch a pass (retention.prune)."""
        return {"sessions_deleted": retention.prune(self.store, Records(self.jobs.engine), self.store.s.session_retention_s,
                                                    forget=self.d.forget_session)}

    def compact_streams(self) -> dict[str, int]:
        """Ended jobs' streams down to their final events (JobEvents.compact_due)."""
        return self.d.events.compact_due()

    def sweep_sessions(self) -> dict[str, int]:
        """The sessions' overdue pending writes and expired manifests (SessionStore.sweep)."""
        return self.store.sweep()

    def sweep_streams(self) -> dict[str, int]:
        """Expired event streams out of their tenants' accounts (JobEvents.sweep)."""
        return self.d.events.sweep()


def _quietly(done: dict[str, int], step: Callable[[], dict[str, int]], failed: str) -> None:
    """done += step(); a failure logged, never fatal (Redis or the database away: the next pass)."""
    try:
        done.update(step())
    except Exception:  # noqa: BLE001 - what it would do waits for the next pass
        log.warning(failed, exc_info=True)
