"""/v1/responses: OpenAI's Responses API over setflow's sessions, its HTTP routes.  The request:
request.py, its job's spec: mapping.py, the session it goes on in: chain.py; the response object:
view.py; the stream: stream.py.  A response is a `response` job; a conversation, or a chain of
previous_response_id, is a session whose K/V lives in Redis, so the next response restores it on
any worker instead of reading the history again.  A response that ends at a function call holds
no worker: the next one carries the output.

    POST   /v1/responses                      create (wait for it; `stream`: its events; `background`)
    GET    /v1/responses/{id}                 the response (`stream=true&starting_after=N`: its events again)
    POST   /v1/responses/{id}/cancel          cancel
    DELETE /v1/responses/{id}                 delete
    GET    /v1/responses/{id}/input_items     its input items
    POST   /v1/responses/compact              compact a history: one opaque `compaction` item (compaction.py)
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import ExitStack, aclosing
from typing import Annotated, Any

import redis
from anyio.to_thread import run_sync
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from runtime.api import scope
from runtime.api.deps import Svc, Tenant
from runtime.api.models import ERRORS
from runtime.api.openai import chain, compaction, ids, view
from runtime.api.openai.forget import abandon, forget
from runtime.api.openai.request import CompactRequest, CreateResponse
from runtime.api.openai.stream import events
from runtime.api.services import Services, close_fully
from runtime.errors import BadInput, Busy, RateLimited
from runtime.jobs.conversations import Conversations
from runtime.settings import deployment_key
from runtime.tables import TERMINAL, JobRecord

router = APIRouter(prefix="/v1/responses", tags=["responses"])
ResponseId = Annotated[str, Path(max_length=256)]  # any form: one that names no response is a 404 (ids.job_of)


@router.post("/compact", responses=ERRORS)
def compact_response(req: CompactRequest, who: Tenant, svc: Svc) -> JSONResponse:
    """The history (the previous response's chain, then the input) compacted into one opaque
    `compaction` item, which the client sends as the input of its next request, with its new
    question after it (compaction.py says what is kept).  No model runs: its usage is
    zero.  BadInput where the history holds no message."""
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        prev = chain.response(svc, ids.job_of(req.previous_response_id), who)
        if prev.status != "succeeded":
            raise BadInput(f"previous response {req.previous_response_id} is {view.status(prev)}: "
                           "only a completed one is compacted")
        history = chain.history(svc, who, prev)
    history += chain.referenced(svc, who, req.items())
    kept = compaction.kept(history)
    if not kept:
        raise BadInput("the history holds no message to keep: compact a history of messages (input, or "
                       "previous_response_id)")
    item = compaction.item(kept, who, deployment_key(svc.settings))
    return JSONResponse({"id": item["id"], "object": "response.compaction", "output": [item],
                         "created_at": int(time.time()),
                         "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                                   "input_tokens_details": {"cached_tokens": 0},
                                   "output_tokens_details": {"reasoning_tokens": 0}}})


@router.post("", responses=ERRORS)
async def create_response(req: CreateResponse, request: Request, who: Tenant, svc: Svc) -> Response:
    """Create a response: it runs as a job on its conversation's session (a new one without a
    conversation or a previous response).  Without `background` or `stream` the call waits for it
    (up to response_wait_s, holding no thread: _ended; then it answers with the response as it
    is, in progress)."""
    if not req.background:  # a stream or a wait: refused before its job
        svc.stream_room(who)
    job = await run_sync(chain.submit, svc, who, req)
    limits = await run_sync(_limits, svc, who)
    if req.stream:
        try:
            out = _streaming(svc, who, job, -1, drop=not req.store, created=True)
        except RateLimited:  # another request took the last place meanwhile
            await _unmade(svc, who, job, drop=not req.store)
            raise
        out.headers.update(limits)
        return out
    if not req.background:
        scope.release_turn(request.scope)  # the wait holds no thread: nor the tenant's turn (gate.Turns)
        with ExitStack() as held:
            try:  # a wait holds what a stream holds (a Redis read): counted as one
                held.enter_context(svc.stream_slot(who))
            except RateLimited:  # another request took the last place meanwhile
                await _unmade(svc, who, job, drop=not req.store)
                raise
            job = await _ended(svc, job, svc.settings.response_wait_s, gone=request.is_disconnected)
        if not req.store and await request.is_disconnected():  # its client left: nobody can read it now
            abandon(svc, job)
            # "retry later" for an Idempotency-Key: its key is freed, a retry runs anew
            return Response(status_code=499, headers={"Retry-After": "1"})
        # (a stored one's client that left gets the response as it is, as at the timeout: what an
        # Idempotency-Key keeps for its retry, which reads it by its id)
    body = view.view(job)
    if not req.store and job.status in TERMINAL:
        await run_sync(forget, svc, job)
    return JSONResponse(body, headers=limits)


async def _ended(svc: Services, job: JobRecord, timeout_s: float,
                 gone: Callable[[], Awaitable[bool]] | None = None) -> JobRecord:
    """The job once it has ended, or as it is at the timeout or when `gone` says its client
    left, each asked at every read of its row (JobEvents.follow: no thread held while it waits)."""
    r, deadline = svc.aclient(), time.monotonic() + timeout_s
    try:
        async with aclosing(svc.dispatcher.events.follow(r, job.id, lambda: run_sync(svc.jobs.get, job.id))) as followed:
            async for got in followed:
                if isinstance(got, JobRecord):
                    job = got
                    if job.status in TERMINAL or time.monotonic() >= deadline or (gone is not None and await gone()):
                        return job
        return job
    finally:
        await close_fully(r)


async def _unmade(svc: Services, who: str, job: JobRecord, drop: bool) -> None:
    """A response refused after its job was made leaves nothing running: the job cancelled,
    and forgotten where it is not stored (`drop`), as a 429 before it would have left it."""
    await run_sync(svc.dispatcher.cancel, job.id, who)
    if drop:
        abandon(svc, job)


def _limits(svc: Services, who: str) -> dict[str, str]:
    """The tenant's rate limit as OpenAI's headers (none where Redis cannot say: the response stands)."""
    try:
        return svc.limiter.headers(who)
    except redis.RedisError:
        return {}


@router.get("/{response_id}", responses=ERRORS)
async def get_response(response_id: ResponseId, who: Tenant, svc: Svc, stream: bool = False,
                       starting_after: Annotated[int | None, Query(ge=-1, lt=2**31)] = None) -> Response:
    """The response; `stream=true`: its events from the start, or after `starting_after` (the
    sequence_number of the last event a client has), at any time the job's event stream is kept
    (events_ttl_s after its last event: a response's stream is never compacted, so a replay
    numbers its events as the first read did).  A stream opened takes a rate-limit token."""
    job = await run_sync(chain.response, svc, ids.job_of(response_id), who)
    if stream:
        svc.stream_room(who)
        await run_sync(svc.limiter.take, who)
        return _streaming(svc, who, job, -1 if starting_after is None else starting_after, drop=False)
    return JSONResponse(view.view(job))


@router.post("/{response_id}/cancel", responses=ERRORS)
def cancel_response(response_id: ResponseId, who: Tenant, svc: Svc) -> JSONResponse:
    """Cancel: a queued response ends at once, one in progress at its next decode step; one that
    has ended is returned as it is.  A cancel takes a rate-limit token (after the 404)."""
    job = chain.response(svc, ids.job_of(response_id), who)
    svc.limiter.take(who)
    return JSONResponse(view.view(svc.dispatcher.cancel(job.id, who)))


@router.delete("/{response_id}", responses=ERRORS)
def delete_response(response_id: ResponseId, who: Tenant, svc: Svc) -> JSONResponse:
    """Delete a response that has ended (409 busy before: cancel it first).  A response on a
    session of its own takes the session with it (turns, K/V); one of a conversation, or one
    another response went on from, leaves the session's turns to them."""
    job = chain.response(svc, ids.job_of(response_id), who)
    if job.status not in TERMINAL:
        raise Busy(f"response {response_id} has not ended: cancel it first")
    assert job.session_id is not None
    convs = Conversations(svc.sql, svc.settings)
    others = svc.jobs.unfinished_jobs(job.session_id) or [j for j in convs.responses(job.session_id) if j.id != job.id]
    if others or convs.is_conversation(job.session_id):
        svc.jobs.delete(job.id, who)
    else:
        forget(svc, job)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


@router.get("/{response_id}/input_items", responses=ERRORS)
def input_items(response_id: ResponseId, who: Tenant, svc: Svc,
                limit: Annotated[int, Query(ge=1, le=100)] = 20, order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
                after: Annotated[str | None, Query(max_length=128)] = None) -> JSONResponse:
    job = chain.response(svc, ids.job_of(response_id), who)
    return JSONResponse(view.page(view.input_items(job), limit, order, after))


# ---- the stream --------------------------------------------------------------------------------

def _streaming(svc: Services, who: str, job: JobRecord, after: int, drop: bool, created: bool = False) -> Response:
    svc.stream_room(who)
    return StreamingResponse(_events(svc, who, job, after, drop, created), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                      scope.STREAMED: ids.response_id(job.id)})  # what an Idempotency-Key keeps of it


def _sse(ev: dict[str, Any]) -> str:
    return f"id: {ev['sequence_number']}\nevent: {ev['type']}\ndata: {json.dumps(ev, separators=(',', ':'))}\n\n"


async def _events(svc: Services, who: str, job: JobRecord, after: int, drop: bool,
                  created: bool) -> AsyncIterator[str]:
    """The response's events (events) as server-sent events, in one of the tenant's stream slots."""
    with ExitStack() as held:
        try:  # counted while it runs (a stream never started holds nothing)
            held.enter_context(svc.stream_slot(who))
        except RateLimited as e:  # streams that passed the route's check together: this one is over the cap
            yield _sse({"type": "error", "code": "rate_limited", "message": str(e), "param": None, "sequence_number": 0})
            if created:
                await _unmade(svc, who, job, drop)
            return
        async with aclosing(events(svc, job, after, drop)) as evs:
            async for ev in evs:
                yield ": keep-alive\n\n" if ev is None else _sse(ev)
