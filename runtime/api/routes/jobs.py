"""/v1/jobs: create (narrative, agent, report; also turn and infill on a session), get, list,
cancel, and the job's events as server-sent events (a finished narrative's or report's exports:
routes/exports.py)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import ExitStack, aclosing
from typing import Annotated

from anyio.to_thread import run_sync
from fastapi import APIRouter, Header, Query
from fastapi.responses import Response, StreamingResponse

from runtime.api.deps import JobId, Limit, Svc, Tenant
from runtime.api.models import ERRORS, ID, JobList, JobRequest, JobView
from runtime.api.services import Services, close_fully
from runtime.errors import BadInput, RateLimited
from runtime.jobs.kinds import SPECS
from runtime.jobs.specs import ToolOutputs
from runtime.tables import STATUSES, TERMINAL, JobRecord

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing a quiet stream
MAX_STREAM_S = 3600.0  # a stream ends after this; the client reconnects with Last-Event-ID


@router.post("", status_code=202, response_model=JobView, responses=ERRORS)
def create_job(req: JobRequest, who: Tenant, svc: Svc) -> JobView:
    """Queue a job; without a session it runs on a new one (the job names it), bound to `model`
    (and `numerics`), or to the deployment's default model.  A job that cannot fit the session's
    context (the model's max_seq_len) is refused with 422; one submitted before any worker has
    published its model, with 503 no_model; one whose model (and numerics) no live worker
    hosts, with 409 model_not_hosted."""
    return JobView.of(svc.submit(req.kind, who, req.spec, req.session, req.priority, open_session=True,
                                 model=req.model, numerics=req.numerics))


@router.get("", response_model=JobList, responses=ERRORS)
def list_jobs(who: Tenant, svc: Svc,
              status: Annotated[str | None, Query(pattern="^(" + "|".join(STATUSES) + ")$")] = None,
              kind: Annotated[str | None, Query(pattern="^(" + "|".join(SPECS) + ")$")] = None,
              session: Annotated[str | None, Query(pattern=ID)] = None,
              limit: Limit = 50) -> JobList:
    """The tenant's jobs, newest first."""
    return JobList(jobs=[JobView.of(j) for j in svc.jobs.listing(who, status, kind, session, limit)])


@router.get("/{job_id}", response_model=JobView, responses=ERRORS)
def get_job(job_id: JobId, who: Tenant, svc: Svc) -> JobView:
    return JobView.of(svc.jobs.get(job_id, who))


@router.post("/{job_id}/cancel", response_model=JobView, responses=ERRORS)
def cancel_job(job_id: JobId, who: Tenant, svc: Svc) -> JobView:
    """Cancel: a queued job, or one waiting for its tool outputs, ends at once (its session
    takes its next job); a running one stops at its next decode step (the turn it was decoding
    is not written).  A finished job is returned unchanged.  A cancel takes a rate-limit token
    as a submission does (after the 404)."""
    svc.jobs.get(job_id, who)  # NotFound before a rate-limit token is spent
    svc.limiter.take(who)
    return JobView.of(svc.dispatcher.cancel(job_id, who))


@router.post("/{job_id}/tool_outputs", status_code=202, response_model=JobView, responses=ERRORS)
def tool_outputs(job_id: JobId, body: ToolOutputs, who: Tenant, svc: Svc) -> JobView:
    """Answer calls a waiting job (requires_action) made to tools its client runs: each output a
    number as the tools write it or "error: <reason>".  Once every pending call has its output
    the job is queued and resumes on any worker, its session restored from where it stopped.
    Refused, changing nothing: 404 (no such job for the tenant; unknown_call: no such call
    waiting), 409 already_answered (that call has its output), not_waiting (the job waits for
    none), deadline_passed (its wait expired), 422 (a malformed output)."""
    return JobView.of(svc.dispatcher.answer(job_id, who, {o.call_id: o.output for o in body.tool_outputs}))


@router.get("/{job_id}/events", responses={**ERRORS, 200: {"content": {"text/event-stream": {}},
                                                           "description": "server-sent events"}})
async def job_events(job_id: JobId, who: Tenant, svc: Svc,
                     last_event_id: Annotated[str | None, Header(pattern=r"^[0-9]{1,20}-[0-9]{1,20}$")] = None,
                     after: Annotated[str | None, Query(pattern=r"^[0-9]{1,20}-[0-9]{1,20}$")] = None) -> Response:
    """The job's events, from its start (or after `Last-Event-ID` / `after`), as server-sent
    events: `status` (queued, running, succeeded, ...), `step` (each committed set: its
    positions, token ids and their text), `progress`, and last `result` (the job as GET
    returns it), after which the stream ends.  An EventSource that reconnects (Last-Event-ID)
    to a finished job whose events it has all read gets 204 No Content, which tells it to stop
    reconnecting.  A stream opened takes a rate-limit token as a submission does; a tenant
    holds at most max_streams_per_tenant streams at once per API process, and all tenants
    together max_streams (429 beyond)."""
    start = last_event_id or after or "0"
    if start != "0" and any(int(x) >= 2**64 for x in start.split("-")):
        raise BadInput(f"an event id is two numbers below 2**64, got {start!r}")
    job = await run_sync(svc.jobs.get, job_id, who)  # 404 before the stream starts
    if last_event_id is not None and job.status in TERMINAL and \
            not await run_sync(svc.client.xrange, svc.keys.events(job_id), f"({last_event_id}", "+", 1):
        return Response(status_code=204)
    svc.stream_room(who)
    await run_sync(svc.limiter.take, who)
    return StreamingResponse(_stream(svc, who, job_id, start), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse(event: str, data: object, eid: str | None = None) -> str:
    head = f"id: {eid}\n" if eid else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


async def _stream(svc: Services, who: str, job_id: str, after: str) -> AsyncIterator[str]:
    """The job's events (JobEvents.follow) as server-sent events, then its row as `result`."""
    start = time.monotonic()
    with ExitStack() as held:
        try:  # counted while it runs (a stream never started holds nothing)
            held.enter_context(svc.stream_slot(who))
        except RateLimited as e:  # streams that passed the route's check together: this one is over the cap
            yield _sse("error", {"code": "rate_limited", "message": str(e)})
            return
        r = svc.aclient()
        waiting_said = False  # a requires_action status said since the job last ran
        try:
            yield "retry: 1000\n\n"
            async with aclosing(svc.dispatcher.events.follow(r, job_id, lambda: run_sync(svc.jobs.get, job_id), after,
                                                             keepalive_s=KEEPALIVE_S)) as followed:
                async for got in followed:
                    if got is None:
                        yield ": keep-alive\n\n"
                    elif isinstance(got, JobRecord):
                        if got.status in TERMINAL:
                            yield _sse("result", JobView.of(got).model_dump(mode="json"))
                            return
                        if got.status == "requires_action" and not waiting_said and got.action:
                            # its event was lost or expired (a wait may outlast the stream's TTL): said from SQL
                            waiting_said = True
                            yield _sse("status", {"type": "status", "status": "requires_action", "from": "sql",
                                                  "calls": got.action.get("calls", []), "deadline": got.wait_until})
                        if time.monotonic() - start >= MAX_STREAM_S:
                            return
                    else:
                        eid, ev = got
                        yield _sse(str(ev.get("type", "message")), ev, eid)
                        if ev.get("type") == "status":
                            waiting_said = ev.get("status") == "requires_action"
        finally:
            await close_fully(r)
