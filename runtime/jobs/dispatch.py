"""Submitting, routing and cancelling jobs: what the API (and tests, benchmarks) call; the
reaper (workers/reaper.py) sends again what this could not.

    submit: check the spec (once: parsed here) -> take a rate-limit token -> the tenant's event
            quota -> the caller's costly checks (`admit` gets the parsed model) -> SQL job row (queued)
            -> status event
            -> send the job id to its queue (unless an earlier job of its session is unfinished:
               the one finishing sends it, so a session's jobs run in submission order)
    submit_batch: the same for a schedule pass's jobs of one tenant, each on a new session: the
            tokens taken at once, the rows in one transaction, one admission (maybe the caller's)
    answer: a waiting job's tool outputs -> queued and sent again once every call has one

Tasks are sent by name through `send(job_id, queue)` (workers/celery_app.py provides one over
Celery), so this module imports no Celery, no torch, and no workflow.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import redis
from pydantic import BaseModel
from redis.exceptions import LockError

from runtime.errors import BadInput, NotFound
from runtime.jobs.events import JobEvents
from runtime.jobs.fairness import Fairness, RateLimiter
from runtime.jobs.hosts import Host
from runtime.jobs.kinds import check_spec, resolved
from runtime.jobs.routing import Routing
from runtime.jobs.rows import Jobs
from runtime.keys import Keys
from runtime.tables import TERMINAL, JobRecord

Send = Callable[[str, str, str], None]  # (job id, queue, priority)


class Admission(NamedTuple):
    """What the caller's admit found: the model and numerics the job binds its session to (None:
    as submit's `host`), and the positions the job appends to its session at most (None: not
    planned), kept with the job."""

    host: Host | None = None
    positions: int | None = None


#: the parsed spec -> raises where the caller refuses it (the API: context, hosts), else what it
#: admitted (None: nothing to add)
Admit = Callable[[BaseModel], Admission | None]
log = logging.getLogger("setflow.dispatch")

ADMIT_LOCK_S = 10  #: an admission of a tenant held to its share holds its lock at most this long (s)
ADMIT_WAIT_S = 2.0  #: and another waits at most this long for it


def check_size(spec: BaseModel, max_tokens: int) -> None:
    """Bounded input: at most max_input_tokens ids, or a text that cannot encode to more
    (a token covers at least one character... or one byte of it); `spec` as parsed (a text its
    spec derives, a response's from its messages, counts as sent)."""
    ids, text = getattr(spec, "input_ids", None), getattr(spec, "text", None)
    if isinstance(ids, list) and len(ids) > max_tokens:
        raise BadInput(f"input is {len(ids)} tokens; at most {max_tokens}")
    if isinstance(text, str) and len(text) > 4 * max_tokens:
        raise BadInput(f"input text is {len(text)} characters; at most {4 * max_tokens}")


class Dispatcher:
    def __init__(self, client: redis.Redis, jobs: Jobs, send: Send) -> None:
        self.r = client
        self.jobs = jobs
        self.s = jobs.s
        self.k = Keys(self.s.key_prefix)
        self.routing = Routing(client, self.s)
        self.events = JobEvents(client, self.s)
        self.limiter = RateLimiter(client, self.s)
        self.fairness = Fairness(client, self.s)
        self.send = send

    def submit(self, kind: str, tenant: str, spec: dict[str, Any], session: str | None = None,
               priority: str = "interactive", open_session: bool = False, admit: Admit | None = None,
               host: Host | None = None, job_id: str | None = None, tick: tuple[str, float] | None = None) -> JobRecord:
        """BadInput, NotFound or RateLimited before anything is written.  Once the job row is
        written the job is accepted: a failed send is left to the reaper (next pass).
        open_session: a job submitted without a session runs on a new one (Jobs.create).
        admit: the caller's own check of the parsed spec, after the spec's, the session's and
        the rate limit's token (the API's: does it fit the model's context?  Costly checks come
        after the token: a request they refuse has paid for them).
        host: binds a session bound to no model yet (a new one) to that model and numerics
        (Jobs.create); the job then goes only to workers that host them.
        job_id, tick: a schedule's tick submits its jobs under ids of their own, each once
        (Duplicate for an id taken: Jobs.create), and says which tick it is."""
        opens = session is None and open_session
        parsed = check_spec(kind, spec, "new" if opens else session)
        self.jobs.check(tenant, priority)
        check_size(parsed, self.s.max_input_tokens)
        if session is not None:
            self.jobs.check_session(session, tenant)  # a look-up by key: a 404 takes no token
        self.limiter.take(tenant)
        self.events.check_quota(tenant)  # its streams at tenant_max_event_bytes: refused, nothing written
        admitted = (admit(parsed) if admit is not None else None) or Admission()
        job, _ = self.jobs.create(kind, tenant, resolved(parsed, spec), session, priority, open_session=opens,
                                  host=admitted.host or host, positions=admitted.positions, job_id=job_id,
                                  tick=tick)  # queued, not sent
        self.publish(job, {"type": "status", "status": "queued", "seq": job.seq})
        self.admit_quietly(tenant)  # sent now if it may go (its session's turn, its tenant's share)
        return self.jobs.get(job.id)

    def submit_batch(self, tenant: str, batch: list[tuple[str, dict[str, Any], str, tuple[str, float]]],
                     priority: str = "batch", admit: bool = True) -> dict[str, str]:
        """A schedule's pass: jobs of one tenant (kind, spec, job id, tick), each on a new session,
        as submit() takes them one at a time, but their rate-limit tokens taken at once, their
        rows written in one transaction (Jobs.create_batch) and the tenant's admission run once
        (admit False: the caller runs it, admit_quietly, once it has recorded what it submitted).
        Returns those refused for good (job id -> why: its spec, its size), the others written;
        raises where submit() would for all of them (the tenant's rate, its quotas, a job id
        taken, Redis or the database away): nothing written, nothing taken but the tokens of a
        refusal after the rate's (as submit's)."""
        refused: dict[str, str] = {}
        ok: list[tuple[str, dict[str, Any], str, tuple[str, float]]] = []
        for kind, spec, job_id, tick in batch:
            try:
                parsed = check_spec(kind, spec, "new")
                check_size(parsed, self.s.max_input_tokens)
                ok.append((kind, resolved(parsed, spec), job_id, tick))
            except (BadInput, NotFound) as e:
                refused[job_id] = e.message
        if not ok:
            return refused
        self.jobs.check(tenant, priority)
        self.limiter.take(tenant, cost=len(ok))
        self.events.check_quota(tenant)
        self.jobs.create_batch(tenant, ok, priority)  # queued, not sent; each its session's first (seq 1)
        try:
            self.events.publish_many(tenant, [(job_id, {"type": "status", "status": "queued", "seq": 1})
                                              for _, _, job_id, _ in ok])
        except redis.RedisError:  # best effort, as _event
            log.warning("%d jobs of tenant %s: their queued events not published", len(ok), tenant)
        if admit:
            self.admit_quietly(tenant)
        return refused

    def admit_quietly(self, tenant: str) -> None:
        """admit() where its failure must not fail what is done already (a job accepted, a
        cancel committed): the reaper admits what this could not."""
        try:
            self.admit(tenant)
        except Exception:  # noqa: BLE001 - Redis, the broker or the database away
            log.warning("tenant %s: admission failed; the reaper admits its jobs", tenant, exc_info=True)

    def admit(self, tenant: str) -> int:
        """Send the tenant's queued jobs that may go now (Jobs.admissible: not waiting for an
        earlier job of their session; interactive, then oldest, first) while fewer than
        waiting_cap() of its jobs sit in the broker, sent and not started: one tenant's
        backlog waits in SQL, and another tenant's job goes behind at most that many of its
        messages in a shared queue.  A tenant taking more of the workers than the others while
        they are active (runtime/jobs/fairness.py) is sent while fewer than its share of the
        worker processes are sent or running.  Each job is sent once (Jobs.mark_sending).
        Called at a submission, when a job starts (a place frees up) or ends (a slot frees up,
        its session's next may go), and by the reaper.  Returns the jobs sent."""
        workers, slots = self._live()
        try:
            share = self.fairness.cap(tenant, workers)
        except redis.RedisError:  # the shares unknown: as before them (the reaper admits again)
            share = None
        if share is None:
            return self._send(self.jobs.admissible(tenant, self.waiting_cap(slots)))
        # held to its share: one admission of the tenant at a time, or two at once (its
        # submissions, its jobs' ends) would each see room for the same place.  One that waits
        # past ADMIT_WAIT_S leaves its jobs to the next (each job that ends admits its tenant)
        lock = self.r.lock(self.k.admitting(tenant), timeout=ADMIT_LOCK_S, blocking_timeout=ADMIT_WAIT_S)
        if not lock.acquire():
            return 0
        try:
            return self._send(self.jobs.admissible(tenant, self.waiting_cap(slots), share))
        finally:
            with contextlib.suppress(LockError):  # it expired: nothing to give back
                lock.release()

    def held(self, tenant: str) -> bool:
        """The tenant is held to its share of the workers now (runtime/jobs/fairness.py): its
        turns sit out a batching worker's steps while another tenant's run (the batcher's
        "held" turns).  False where Redis cannot tell."""
        try:
            return self.fairness.cap(tenant, self._live()[0]) is not None
        except redis.RedisError:
            return False

    def _send(self, jobs: list[JobRecord]) -> int:
        """Send each of `jobs` (Jobs.admissible's) that no other admission took; a failed send
        is left to the reaper, with the rest.  Returns the jobs sent."""
        sent, active = 0, None
        for job in jobs:
            try:
                active = self.fairness.active() if active is None else active  # once a call
                queue = self.routing.route(job.session_id, job.priority, job.pool, job.tenant, active)
            except redis.RedisError:  # affinity unknown: any worker of its pool can restore the session
                queue = self.routing.shared(job.priority, job.pool)
            if not self.jobs.mark_sending(job.id, queue):  # another admission took it
                continue
            try:
                self._post(job, queue)
                sent += 1
            except Exception:  # noqa: BLE001 - the broker is away: accepted all the same; the rest waits too
                log.warning("job %s: send to %s failed; the reaper sends it", job.id, queue, exc_info=True)
                self.jobs.mark_dispatched(job.id, queue, sent=False)
                break
        return sent

    def waiting_cap(self, slots: int | None = None) -> int:
        """A tenant's jobs in the broker, sent and not started, at most: tenant_max_waiting, or
        by default the live workers' slots together (one job per slot: another tenant's job
        waits behind at most one of its per slot; at least 1)."""
        if self.s.tenant_max_waiting is not None:
            return self.s.tenant_max_waiting
        return self._live()[1] if slots is None else slots

    def _live(self) -> tuple[int, int]:
        """(the live workers, their slots together): what the fair shares and the waiting cap
        divide, each at least 1."""
        try:
            workers, slots = self.routing.live()
        except redis.RedisError:
            return 1, 1
        return max(1, workers), max(1, slots)

    def send_job(self, job: JobRecord, shared: bool = False) -> str:
        queue = (self.routing.shared(job.priority, job.pool) if shared
                 else self.routing.route(job.session_id, job.priority, job.pool, job.tenant, self.fairness.active()))
        self.jobs.mark_dispatched(job.id, queue)  # before the send: a fast worker must not see it unsent
        self._post(job, queue)
        return queue

    def _post(self, job: JobRecord, queue: str) -> None:
        """Send the job's message; to a worker's own queue, on its way there first (what
        placement counts until the worker takes it: Routing.sent)."""
        worker = self.routing.worker_of(queue)
        if worker is not None:
            try:
                self.routing.sent(worker, job.id, job.tenant)
            except redis.RedisError:  # not counted: placement may send that worker one job too many
                log.warning("job %s: not counted on its way to %s", job.id, worker, exc_info=True)
        self.send(job.id, queue, job.priority)

    def dispatch_next(self, session: str | None) -> JobRecord | None:
        """After a job of the session ended: its next queued job may go (within its tenant's
        share: admit)."""
        nxt = self.jobs.next_queued(session) if session is not None else None
        if nxt is not None:
            self.admit(nxt.tenant)
        return nxt

    def forget_session(self, session: str, tenant: str, jobs: list[str]) -> None:
        """After a session was deleted (lifecycle.delete_session: its K/V and its SQL rows), what
        the jobs side keeps of it in Redis: its affinity and its jobs' event streams (bounded
        batches, out of the tenant's account at once).  Best effort: a Redis failure is logged,
        and what is left expires by itself (affinity_ttl_s, events_ttl_s)."""
        try:
            self.r.delete(self.k.affinity(session))
            self.events.drop(tenant, jobs)
        except redis.RedisError as e:
            log.warning("session %s deleted; its jobs' Redis keys were not (%s)", session, e)

    def cancel(self, job_id: str, tenant: str) -> JobRecord:
        job, ended = self.jobs.cancel(job_id, tenant)
        if job.status == "running":
            self.events.request_cancel(job.tenant, job.id)  # the holder stops at its next step
        elif ended:  # it was queued: nobody runs it now; the session's next job, or its tenant's, may go
            self.publish(job, {"type": "status", "status": "cancelled", "error": job.error})
            if job.attempts == 0:
                try:
                    self.events.never_ran(job.tenant, job.id, job.kind)
                except redis.RedisError:
                    log.warning("job %s: its stream keeps its TTL (%s)", job.id, "Redis away")
            self.admit_quietly(job.tenant)
        return job

    def answer(self, job_id: str, tenant: str, outputs: dict[str, str]) -> JobRecord:
        """The client's outputs of calls the job waits for (Jobs.answer: refused, nothing
        written, for a call unknown, answered already, or past its deadline); once every
        pending call has one, the job is queued and sent (to its session's last worker while
        that one is alive and free: the session is warm there)."""
        job, resumed = self.jobs.answer(job_id, tenant, outputs)
        if resumed:
            self.publish(job, {"type": "status", "status": "queued", "reason": "tool outputs received"})
            self.admit_quietly(job.tenant)
        return self.jobs.get(job.id)

    def publish(self, job: JobRecord, event: dict[str, Any]) -> None:
        """Publish (best effort); a status that ends the job makes its stream due for compaction."""
        try:
            self.events.publish(job.tenant, job.id, event)
            if event.get("type") == "status" and event.get("status") in TERMINAL:
                self.events.ended(job.tenant, job.id, job.kind)
        except redis.RedisError:
            log.warning("job %s: event not published: %s", job.id, event)

    def wait(self, job_id: str, timeout_s: float) -> JobRecord:
        """The job once finished or waiting for its client (requires_action), or as it is at the
        timeout.  Woken by its status events; SQL is read too (before, and after every quiet
        second), since events are best effort."""
        deadline, after, checked = time.monotonic() + timeout_s, "0", 0.0
        stops = (*TERMINAL, "requires_action")
        while True:
            now = time.monotonic()
            if now - checked >= 1.0 or now >= deadline:  # not at every batch of step events
                job, checked = self.jobs.get(job_id), now
                if job.status in stops or now >= deadline:
                    return job
            left = deadline - now
            try:
                for eid, ev in self.events.read(job_id, after, block_ms=max(1, int(min(left, 1.0) * 1000))):
                    after = eid
                    if ev.get("type") == "status" and ev.get("status") in stops:
                        job = self.jobs.get(job_id)
                        if job.status in stops:  # not an earlier wait of a job that runs on
                            return job
            except redis.RedisError:
                time.sleep(min(0.2, max(0.0, left)))
