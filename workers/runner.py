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
sending of the session's next job after it are best effort (the reaper sends that job anyway).
An ended job's stream is due for compaction (JobEvents.ended: the reaper keeps its final events).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import OperationalError

from model.params import DecodeError
from runtime.errors import Busy, Cancelled, ClaimLost, LeaseLost, RequiresAction, SetflowError, StaleWrite, Unverified
from runtime.jobs.context import JobContext
from runtime.jobs.specs import check_spec
from runtime.jobs.table import JOB_ID
from runtime.sessions.ceilings import oom
from workers.process import Runtime
from workflows import WORKFLOWS

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


def run(rt: Runtime, job_id: str) -> str:
    """Run the job if this delivery may; returns what happened (for logs and tests)."""
    started = time.monotonic()  # the delivery's time limits count from here (JobContext)
    if rt.host is not None:  # a job of another model or numerics (a stray message): sent on, not run
        found = _retrying(rt, lambda: rt.jobs.get(job_id))  # NotFound for an unknown id
        if found.pool and found.pool != rt.host.pool and found.status == "queued":
            rt.dispatcher.send_job(found, shared=True)
            return "rerouted"
    claim = _retrying(rt, lambda: rt.jobs.claim(job_id, rt.worker))  # NotFound for an unknown id
    events = rt.dispatcher.events
    if claim.owner is None:
        if claim.reason == "gave up":
            _quietly(lambda: events.publish(claim.job.tenant, job_id,
                                            {"type": "status", "status": "failed", "error": claim.job.error}))
            _quietly(lambda: events.ended(claim.job.tenant, job_id, claim.job.kind))
            _quietly(lambda: rt.dispatcher.dispatch_next(claim.job.session_id))
        return claim.reason
    job, owner, session = claim.job, claim.owner, claim.job.session_id
    _quietly(lambda: rt.dispatcher.admit(job.tenant))  # it left the broker: its tenant's next may go
    status: str | None
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    if job.cancel_requested:  # asked while it waited to be requeued (the Redis flag may be gone)
        status, result, error = "cancelled", None, _err("cancelled", "cancelled before this attempt started")
    else:
        affinity = _quietly(lambda: rt.dispatcher.routing.last_worker(session)) if session is not None else None
        _quietly(lambda: events.publish(job.tenant, job_id, {"type": "status", "status": "running", "worker": rt.worker,
                                                             "attempt": job.attempts}))
        try:
            status, result, error = _attempts(rt, job_id, owner, started)
        except SoftTimeLimitExceeded:  # fired outside the workflow (a retry's wait, a close)
            status, result, error = "failed", None, _time_limit(rt)
        if status is None:  # the claim was lost: the job is someone else's now
            return "claim lost"
        if result is not None:
            result["affinity"] = "none" if affinity is None else ("hit" if affinity == rt.worker else "miss")
    if status == "requires_action" and result is not None:
        calls, wait_s = result["calls"], result["wait_s"]
        try:
            _retrying(rt, lambda: rt.jobs.suspend(job_id, owner, calls, wait_s))
        except ClaimLost:
            return "claim lost"
        _quietly(lambda: events.publish(job.tenant, job_id, {"type": "status", "status": "requires_action",
                                                             "calls": calls, "deadline": time.time() + wait_s}))
        if _retrying(rt, lambda: rt.jobs.get(job_id)).cancel_requested:  # asked while it ran: it ends waiting
            _quietly(lambda: rt.dispatcher.cancel(job_id, job.tenant))
        return status
    final = status
    try:
        try:
            _retrying(rt, lambda: rt.jobs.finish(job_id, owner, final, result=result, error=error))
        except SoftTimeLimitExceeded:  # it fires once: the job ends as timed out
            final, result, error = "failed", None, _time_limit(rt)
            _retrying(rt, lambda: rt.jobs.finish(job_id, owner, final, result=result, error=error))
    except ClaimLost:
        return "claim lost"
    # the outcome is durable; the rest helps watchers and the session's next job (the reaper
    # sends that one anyway if this fails)
    _quietly(lambda: events.publish(job.tenant, job_id, {"type": "status", "status": final, "error": error}))
    _quietly(lambda: events.ended(job.tenant, job_id, job.kind))
    _quietly(lambda: rt.dispatcher.dispatch_next(session))
    return final


def _retrying(rt: Runtime, fn: Callable[[], T]) -> T:
    """fn, retried with backoff while it fails transiently (for up to job_retry_s)."""
    deadline, delay = time.monotonic() + rt.settings.job_retry_s, 0.25
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, OperationalError) as e:
            if not transient(e) or time.monotonic() + delay > deadline:
                raise
            log.warning("transient %r; retrying in %.2f s", e, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _quietly(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - best effort: logged, never fatal
        log.warning("best-effort step failed", exc_info=True)
        return None


def _attempts(rt: Runtime, job_id: str, owner: str, started: float
              ) -> tuple[str | None, dict[str, Any] | None, dict[str, Any] | None]:
    deadline = time.monotonic() + rt.settings.job_retry_s
    delay = 0.25
    while True:
        job = _retrying(rt, lambda: rt.jobs.get(job_id))
        if job.cancel_requested:  # asked while this attempt waited to retry
            return "cancelled", None, _err("cancelled", "cancelled between two tries")
        workflow = WORKFLOWS.get(job.kind)
        if workflow is None:
            return "failed", None, _err("bad_input", f"unknown job kind {job.kind!r}")
        ctx = JobContext(job, owner, rt.worker, rt.engine, rt.tokenizer, rt.jobs, rt.dispatcher.events,
                         rt.dispatcher.routing, started, profile=rt.profile)
        try:
            spec = check_spec(job.kind, job.spec, job.session_id)  # parsed once; a stored payload is not trusted
            return "succeeded", {**workflow(ctx, spec), "worker": rt.worker}, None
        except ClaimLost:
            return None, None, None
        except RequiresAction as e:  # its client runs the tool: the job waits for the output
            wait_s = getattr(spec, "tool_timeout_s", None) or rt.settings.tool_wait_s
            return "requires_action", {"calls": e.calls, "wait_s": wait_s}, None
        except Cancelled as e:
            return "cancelled", None, {**_err(e.code, e.message), "seen_at": ctx.channel.seen_at}
        except SoftTimeLimitExceeded:
            return "failed", None, _time_limit(rt)
        except (*TRANSIENT, redis.ResponseError) as e:
            if not transient(e):  # a Redis error no retry mends: a bug, as below
                log.error("job %s failed:\n%s", job_id, traceback.format_exc())
                return "failed", None, _err("internal", f"{type(e).__name__}: {e}")
            if time.monotonic() + delay > deadline:
                return "failed", None, _err("unavailable", f"gave up after {rt.settings.job_retry_s:g} s of "
                                                           f"transient errors; last: {e!r}")
            log.warning("job %s: transient %r; retrying in %.2f s", job_id, e, delay)
            # the channel's thread keeps the lease meanwhile; a cancellation ends the wait
            if ctx.channel.cancelled.wait(delay):
                return "cancelled", None, {**_err("cancelled", "cancelled while retrying"),
                                           "seen_at": ctx.channel.seen_at}
            if ctx.channel.lost.is_set():
                return None, None, None
            delay = min(delay * 2, 5.0)
        except Unverified as e:  # the checker's problems go with it
            return "failed", None, {**_err(e.code, e.message), "problems": e.problems}
        except SetflowError as e:
            return "failed", None, _err(e.code, e.message)
        except DecodeError as e:
            return "failed", None, _err("bad_input", str(e))
        except Exception as e:  # noqa: BLE001 - a bug must fail the job, not loop it
            log.error("job %s failed:\n%s", job_id, traceback.format_exc())
            return "failed", None, _err("internal", f"{type(e).__name__}: {e}")
        finally:
            ctx.close()


def _time_limit(rt: Runtime) -> dict[str, Any]:
    return _err("time_limit", f"the job ran past {rt.settings.task_soft_time_limit_s} s")


def _err(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}
