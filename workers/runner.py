"""Running one job, start to end: claim it, parse its spec into the kind's model, run its
workflow over the job's turns (runtime/jobs/context.py), record the outcome, send the next job
of its session.  Called by the Celery task (workers/tasks.py), and nothing else here knows
Celery.

Outcomes of a delivery:
  - a job of a model or numerics this worker does not host (a stray message): sent on to its
    pool's shared queue, not claimed
  - not claimed (finished already, running under another live lease, waiting for an earlier job
    of its session): a no-op; a redelivered or duplicated task lands here
  - the workflow returns: succeeded, with its result
  - a transient error (Redis or the database unreachable, Redis at its maxmemory, the session
    busy or its lease lost):
    retried in this process with exponential backoff (0.25 s doubling to 5 s) for up to
    job_retry_s, each time from the job's last committed step, then failed with "unavailable"
  - bad input, an unknown session, a decode error, any other error: failed at once, no retry
  - output that failed its checker after the AR retry (workflows/checked.py): failed with
    "unverified", the checker's problems in the error
  - cancelled: the turn in flight is abandoned (the session stays at its last committed turn)
  - the soft time limit: failed with "time_limit"
  - its claim lost (the reaper requeued it): this holder stops and writes nothing more
  - at a call of a tool its client runs (RequiresAction): requires_action, with the calls; the
    claim and lease are let go, and nothing of its session is sent (the job still holds its
    place); its client's outputs queue it again (Dispatcher.answer)
The job's outcome is written to SQL (retried while the database is away); the events and the
admission of its tenant's next jobs after it are best effort (the reaper admits them anyway).
The time it held this worker's slot is charged to its tenant's use (runtime/jobs/fairness.py).
The jobs this process runs are told to routing at each start and end, per tenant
(Routing.running: where the next job with no warm worker goes reads them, Routing.place).
An ended job's stream is due for compaction (JobEvents.ended: the reaper keeps its final events).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import redis
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import OperationalError

from model.params import DecodeError
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.errors import Busy, Cancelled, ClaimLost, LeaseLost, RequiresAction, SetflowError, StaleWrite, Unverified
from runtime.jobs.context import JobContext, JobServices
from runtime.jobs.dispatch import Dispatcher
from runtime.jobs.hosts import Host
from runtime.jobs.kinds import check_spec
from runtime.jobs.rows import Claim, Jobs
from runtime.jobs.table import JOB_ID
from runtime.sessions.budget import oom
from runtime.sessions.engine import Engine
from runtime.settings import Settings
from runtime.tables import JobRecord
from workflows import WORKFLOWS, Workflow

log = logging.getLogger("setflow.worker")
T = TypeVar("T")

#: worth another try from the last committed step: the state they leave is consistent (and a
#: Redis at its maxmemory: transient())
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, OperationalError, Busy, LeaseLost, StaleWrite)


def transient(e: BaseException) -> bool:
    """Worth another try: TRANSIENT, or a write Redis refused at its maxmemory (OOM), which may
    pass once idle sessions are evicted, streams compacted or expired (what the reaper does)."""
    return isinstance(e, TRANSIENT) or oom(e)


def check_payload(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The job id a task message names; ValueError with the reason when it names none."""
    if kwargs or len(args) != 1:
        raise ValueError(f"a task takes one job id, got args={list(args)!r} kwargs={kwargs!r}")
    job_id = args[0]
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    return job_id


CLAIM_LOST = "claim lost"  #: the job is another holder's now: this one writes nothing more
RETRY = "retry"  #: a transient failure: try again from the last committed step, after retry_in_s


@dataclass
class Runtime:
    """What running a job needs of its worker process, built once per process (workers/process.py)."""

    settings: Settings
    worker: str
    engine: Engine
    tokenizer: Tokenizer
    jobs: Jobs
    dispatcher: Dispatcher
    profile: Profile | None = None  # the model's (beside its weights); None: its default
    host: Host | None = None  # what it hosts: jobs of another pool are sent on (_sent_on)


@dataclass(frozen=True)
class Outcome:
    """What a delivery, or one attempt of it, came to.  `what`: a job status (succeeded, failed,
    cancelled, requires_action) with its result or error; or why nothing ran or nothing more is
    written ("rerouted", CLAIM_LOST, a Claim's reason); or RETRY."""

    what: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    retry_in_s: float | None = None  #: RETRY: the wait before the next try (Backoff)


class Backoff:
    """The waits between tries of a transient failure: 0.25 s doubling to 5 s, for as long as
    the next try starts within budget_s of this object's making."""

    def __init__(self, budget_s: float) -> None:
        self.deadline, self.delay = time.monotonic() + budget_s, 0.25

    def next(self) -> float | None:
        """The wait before the next try; None: it would start past the budget (give up)."""
        if time.monotonic() + self.delay > self.deadline:
            return None
        delay, self.delay = self.delay, min(self.delay * 2, 5.0)
        return delay


class _Running:
    """The jobs this process runs now, per worker name and tenant (a batching worker runs
    several on its threads), said to routing at each change: a count Redis missed is said again
    at the next."""

    def __init__(self) -> None:
        self.jobs: dict[str, Counter[str]] = {}
        self._lock = threading.Lock()

    def add(self, rt: Runtime, tenant: str, d: int) -> None:
        with self._lock:
            jobs = self.jobs.setdefault(rt.worker, Counter())
            jobs[tenant] += d
            if jobs[tenant] <= 0:
                del jobs[tenant]
            _quietly(lambda: rt.dispatcher.routing.running(rt.worker, jobs))


_running = _Running()


def run(rt: Runtime, job_id: str) -> Outcome:
    """Run the job if this delivery may; returns what happened (for logs and tests)."""
    started = time.monotonic()  # the delivery's time limits count from here (JobContext)
    if rt.host is not None and _sent_on(rt, job_id):
        return Outcome("rerouted")
    claim = _retrying(rt, lambda: rt.jobs.claim(job_id, rt.worker))  # NotFound for an unknown id
    if claim.owner is None:
        _taken(rt, claim.job)
        if claim.reason == "gave up":  # this claim failed it: its end is told as a finish's is
            _ended(rt, claim.job, "failed", claim.job.error)
        return Outcome(claim.reason)
    job, owner = claim.job, claim.owner
    _quietly(lambda: rt.dispatcher.admit(job.tenant))  # it left the broker: its tenant's next may go
    held = time.monotonic()
    _running.add(rt, job.tenant, 1)
    _taken(rt, job)  # after: counted running first, never neither (Routing.place)
    try:
        out = _run_claimed(rt, job, owner, started)
    finally:
        _running.add(rt, job.tenant, -1)
    # the slot its tenant kept busy, before the admissions at its end see the tenant's use
    _quietly(lambda: rt.dispatcher.fairness.charge(job.tenant, time.monotonic() - held))
    if out.what == "requires_action" and out.result is not None:
        return _suspend(rt, job, owner, out.result)
    if out.what == CLAIM_LOST:
        return out
    return _finish(rt, job, owner, out)


def _sent_on(rt: Runtime, job_id: str) -> bool:
    """A job of another model or numerics (a stray message) is sent on to its pool's shared
    queue, not run: True where it was."""
    assert rt.host is not None
    found = _retrying(rt, lambda: rt.jobs.get(job_id))  # NotFound for an unknown id
    if found.pool and found.pool != rt.host.pool and found.status == "queued":
        _taken(rt, found)
        rt.dispatcher.send_job(found, shared=True)
        return True
    return False


def _taken(rt: Runtime, job: JobRecord) -> None:
    """The job is no longer on its way to this worker (had it been sent to its own queue)."""
    _quietly(lambda: rt.dispatcher.routing.taken(rt.worker, job.id, job.tenant))


def _run_claimed(rt: Runtime, job: JobRecord, owner: str, started: float) -> Outcome:
    """The claimed job's attempts, as an outcome to write (or CLAIM_LOST); its result says
    whether its session's last turn ran on this worker (affinity)."""
    if job.cancel_requested:  # asked while it waited to be requeued (the Redis flag may be gone)
        return Outcome("cancelled", error=_err("cancelled", "cancelled before this attempt started"))
    session = job.session_id
    affinity = _quietly(lambda: rt.dispatcher.routing.last_worker(session)) if session is not None else None
    _quietly(lambda: rt.dispatcher.events.publish(job.tenant, job.id, {
        "type": "status", "status": "running", "worker": rt.worker, "attempt": job.attempts}))
    try:
        out = _attempts(rt, job.id, owner, started)
    except SoftTimeLimitExceeded:  # fired outside the workflow (a retry's wait, a close)
        out = Outcome("failed", error=_time_limit(rt))
    if out.what == CLAIM_LOST or out.result is None:
        return out
    return replace(out, result={**out.result, "affinity": "none" if affinity is None else (
        "hit" if affinity == rt.worker else "miss")})


def _suspend(rt: Runtime, job: JobRecord, owner: str, result: dict[str, Any]) -> Outcome:
    """The job waits for its client's tool outputs (requires_action): nothing of its session is
    sent (it still holds its place).  A cancellation asked while it ran ends it waiting."""
    calls, wait_s = result["calls"], result["wait_s"]
    try:
        _retrying(rt, lambda: rt.jobs.suspend(job.id, owner, calls, wait_s))
    except ClaimLost:
        return Outcome(CLAIM_LOST)
    _quietly(lambda: rt.dispatcher.events.publish(job.tenant, job.id, {
        "type": "status", "status": "requires_action", "calls": calls, "deadline": time.time() + wait_s}))
    if _retrying(rt, lambda: rt.jobs.get(job.id)).cancel_requested:
        _quietly(lambda: rt.dispatcher.cancel(job.id, job.tenant))
    _quietly(lambda: rt.dispatcher.admit(job.tenant))  # its slot is free (fairness: its tenant's next may go)
    return Outcome("requires_action", result)


def _finish(rt: Runtime, job: JobRecord, owner: str, out: Outcome) -> Outcome:
    """Write the job's outcome (retried while the database is away), then tell its end."""
    final, result, error = out.what, out.result, out.error
    try:
        try:
            _retrying(rt, lambda: rt.jobs.finish(job.id, owner, final, result=result, error=error))
        except SoftTimeLimitExceeded:  # it fires once: the job ends as timed out
            final, result, error = "failed", None, _time_limit(rt)
            _retrying(rt, lambda: rt.jobs.finish(job.id, owner, final, result=result, error=error))
    except ClaimLost:
        return Outcome(CLAIM_LOST)
    _ended(rt, job, final, error)
    return Outcome(final, result, error)


def _ended(rt: Runtime, job: JobRecord, status: str, error: dict[str, Any] | None) -> None:
    """The job's end is durable; the rest helps watchers and its tenant's next jobs (the
    reaper admits them anyway if this fails)."""
    events = rt.dispatcher.events
    _quietly(lambda: events.publish(job.tenant, job.id, {"type": "status", "status": status, "error": error}))
    _quietly(lambda: events.ended(job.tenant, job.id, job.kind))
    # its slot is free: its tenant's next job may go (its session's next among them), which
    # a tenant held to its share (runtime/jobs/fairness.py) waits for
    _quietly(lambda: rt.dispatcher.admit(job.tenant))


def _retrying(rt: Runtime, fn: Callable[[], T]) -> T:
    """fn, retried with backoff while it fails transiently (for up to job_retry_s)."""
    backoff = Backoff(rt.settings.job_retry_s)
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, OperationalError) as e:
            delay = backoff.next() if transient(e) else None
            if delay is None:
                raise
            log.warning("transient %r; retrying in %.2f s", e, delay)
            time.sleep(delay)


def _quietly(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - best effort: logged, never fatal
        log.warning("best-effort step failed", exc_info=True)
        return None


def _attempts(rt: Runtime, job_id: str, owner: str, started: float) -> Outcome:
    """Attempts of the claimed job until one comes to an outcome: a transient failure is tried
    again from its last committed step, after Backoff's wait (failed "unavailable" past it)."""
    backoff = Backoff(rt.settings.job_retry_s)
    services = JobServices(rt.worker, rt.engine, rt.tokenizer, rt.jobs, rt.dispatcher.events, rt.dispatcher.routing,
                           rt.profile, held=rt.dispatcher.held if rt.engine.batcher is not None else None)
    while True:
        job = _retrying(rt, lambda: rt.jobs.get(job_id))
        if job.cancel_requested:  # asked while this attempt waited to retry
            return Outcome("cancelled", error=_err("cancelled", "cancelled between two tries"))
        workflow = WORKFLOWS.get(job.kind)
        if workflow is None:
            return Outcome("failed", error=_err("bad_input", f"unknown job kind {job.kind!r}"))
        ctx = JobContext(Claim(job, owner), services, started)
        try:
            out = _attempt(rt, ctx, workflow, backoff)
            if out.what != RETRY:
                return out
            # the channel's thread keeps the lease meanwhile; a cancellation ends the wait
            if ctx.channel.cancelled.wait(out.retry_in_s):
                return Outcome("cancelled", error={**_err("cancelled", "cancelled while retrying"),
                                                   "seen_at": ctx.channel.seen_at})
            if ctx.channel.lost.is_set():
                return Outcome(CLAIM_LOST)
        finally:
            ctx.close()


def _attempt(rt: Runtime, ctx: JobContext, workflow: Workflow, backoff: Backoff) -> Outcome:
    """One run of the job's workflow, from its last committed step: its outcome, or RETRY."""
    job = ctx.job
    try:
        spec = check_spec(job.kind, job.spec, job.session_id)  # parsed once; a stored payload is not trusted
        return Outcome("succeeded", {**workflow(ctx, spec), "worker": rt.worker})
    except ClaimLost:
        return Outcome(CLAIM_LOST)
    except RequiresAction as e:  # its client runs the tool: the job waits for the output
        wait_s = getattr(spec, "tool_timeout_s", None) or rt.settings.tool_wait_s
        return Outcome("requires_action", {"calls": e.calls, "wait_s": wait_s})
    except Cancelled as e:
        return Outcome("cancelled", error={**_err(e.code, e.message), "seen_at": ctx.channel.seen_at})
    except SoftTimeLimitExceeded:
        return Outcome("failed", error=_time_limit(rt))
    except (*TRANSIENT, redis.ResponseError) as e:
        if not transient(e):  # a Redis error no retry mends: a bug, as below
            log.error("job %s failed:\n%s", job.id, traceback.format_exc())
            return Outcome("failed", error=_err("internal", f"{type(e).__name__}: {e}"))
        delay = backoff.next()
        if delay is None:
            return Outcome("failed", error=_err("unavailable", f"gave up after {rt.settings.job_retry_s:g} s of "
                                                               f"transient errors; last: {e!r}"))
        log.warning("job %s: transient %r; retrying in %.2f s", job.id, e, delay)
        return Outcome(RETRY, retry_in_s=delay)
    except Unverified as e:  # the checker's problems go with it
        return Outcome("failed", error={**_err(e.code, e.message), "problems": e.problems})
    except SetflowError as e:
        return Outcome("failed", error=_err(e.code, e.message))
    except DecodeError as e:
        return Outcome("failed", error=_err("bad_input", str(e)))
    except Exception as e:  # noqa: BLE001 - a bug must fail the job, not loop it
        log.error("job %s failed:\n%s", job.id, traceback.format_exc())
        return Outcome("failed", error=_err("internal", f"{type(e).__name__}: {e}"))


def _time_limit(rt: Runtime) -> dict[str, Any]:
    return _err("time_limit", f"the job ran past {rt.settings.task_soft_time_limit_s} s")


def _err(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}
