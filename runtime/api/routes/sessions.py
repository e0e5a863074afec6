"""/v1/sessions: create, read (transcript, KV size, where it is cached), post a turn, infill,
fork at a turn, delete.  A turn and an infill are jobs (202 with the job; follow it by GET
/v1/jobs/{id} or its events); create, fork and delete are immediate."""

from __future__ import annotations

import logging
from typing import Annotated

import redis

from fastapi import APIRouter, Depends, Path, Query, Response

from runtime.api.auth import services, tenant
from runtime.api.models import (ERRORS, ID, ForkRequest, InfillRequest, JobView, SessionCreated, SessionList,
                                SessionView, TurnRequest, TurnView, CacheView)
from runtime.api.services import Services
from runtime.errors import BadInput, Busy, SetflowError

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
log = logging.getLogger("setflow.api")
Tenant = Annotated[str, Depends(tenant)]
Svc = Annotated[Services, Depends(services)]
SessionId = Annotated[str, Path(pattern=ID)]


@router.post("", status_code=201, response_model=SessionCreated, responses=ERRORS)
def create_session(who: Tenant, svc: Svc) -> SessionCreated:
    """A new, empty session (its model is bound by its first turn)."""
    svc.limiter.take(who)
    rec = svc.records.create_session(who, "")
    return SessionCreated(id=rec.id, created_at=rec.created_at)


@router.get("", response_model=SessionList, responses=ERRORS)
def list_sessions(who: Tenant, svc: Svc, limit: Annotated[int, Query(ge=1, le=200)] = 50) -> SessionList:
    return SessionList(sessions=[SessionCreated(id=s.id, created_at=s.created_at)
                                 for s in svc.records.list_sessions(who, limit)])


@router.get("/{session_id}", response_model=SessionView, responses=ERRORS)
def get_session(session_id: SessionId, who: Tenant, svc: Svc) -> SessionView:
    rec = svc.records.get_session(session_id, who)  # NotFound for another tenant's
    turns = []
    for t in svc.records.turns(session_id, who):
        meta = t.meta or {}
        holes = meta.get("infill")  # an infill turn: the output is what its holes were filled with
        out_ids = [t.token_ids[i] for i in holes] if holes else t.token_ids[int(meta.get("n_input", len(t.token_ids))):]
        turns.append(TurnView(index=t.index, role=t.role, input=t.text,
                              output=svc.tokenizer.decode(out_ids, skip_special=True), tokens=len(t.token_ids),
                              path=(t.meta or {}).get("path"), job=t.job_id, created_at=t.created_at))
    m = svc.store.read(session_id)
    last = svc.dispatcher.routing.last_worker(session_id)
    kv = CacheView(redis_turns=int(m.state.get("turns", -1)) if m is not None else None,
                   redis_bytes=m.nbytes if m is not None else 0, redis_segments=len(m.segments) if m is not None else 0,
                   slots=m.slots if m is not None else 0, last_worker=last,
                   last_worker_alive=last is not None and svc.dispatcher.routing.alive(last))
    return SessionView(id=rec.id, created_at=rec.created_at, turns=turns, kv=kv,
                       unfinished_jobs=svc.jobs.unfinished(session_id))


@router.post("/{session_id}/turns", status_code=202, response_model=JobView, responses=ERRORS)
def post_turn(session_id: SessionId, req: TurnRequest, who: Tenant, svc: Svc) -> JobView:
    """Queue a turn: the input (text or token ids) is appended and decoded with the given
    parameters; the session's jobs run one at a time, in submission order."""
    spec = req.model_dump(exclude={"priority"}, exclude_none=True)
    svc.check_fits("turn", spec, session_id, who)
    return JobView.of(svc.dispatcher.submit("turn", who, spec, session_id, req.priority))


@router.post("/{session_id}/infill", status_code=202, response_model=JobView, responses=ERRORS)
def post_infill(session_id: SessionId, req: InfillRequest, who: Tenant, svc: Svc) -> JobView:
    """Queue an infill: the text is appended with each `<hole>` decoded in place."""
    spec = req.model_dump(exclude={"priority"}, exclude_none=True)
    svc.check_fits("infill", spec, session_id, who)
    return JobView.of(svc.dispatcher.submit("infill", who, spec, session_id, req.priority))


@router.post("/{session_id}/fork", status_code=201, response_model=SessionCreated, responses=ERRORS)
def fork_session(session_id: SessionId, req: ForkRequest, who: Tenant, svc: Svc) -> SessionCreated:
    """A new session holding this one's turns 0..turn; its next turn continues from there (the
    parent is unchanged)."""
    svc.records.get_session(session_id, who)  # NotFound before a rate-limit token is spent
    n = svc.records.turn_count(session_id, who)
    if not 0 <= req.turn < n:
        raise BadInput(f"turn must be in [0, {n}) for session {session_id}, got {req.turn}")
    svc.limiter.take(who)
    rec = svc.records.fork(session_id, who, req.turn)
    return SessionCreated(id=rec.id, created_at=rec.created_at)


@router.delete("/{session_id}", status_code=204, responses=ERRORS)
def delete_session(session_id: SessionId, who: Tenant, svc: Svc) -> Response:
    """Delete the session: its turns, its jobs (their event streams too) and its Redis state.
    409 while a job of it is queued or running (cancel those first), or while a turn holds it.
    Under the session's lease, so no turn runs meanwhile; the SQL delete checks for unfinished
    jobs in its own transaction, so a submission at the same moment either comes first (409) or
    finds no session (404)."""
    svc.records.get_session(session_id, who)
    if svc.jobs.unfinished(session_id):
        raise Busy(f"session {session_id} has unfinished jobs; cancel them first")
    svc.limiter.take(who)
    lease = svc.store.acquire(session_id)  # Busy while a turn runs
    try:
        jobs = svc.records.delete_session(session_id, who, idle_only=True)
        try:  # the session is gone (SQL is the truth): its Redis state is nobody's now
            svc.store.drop(session_id, who, lease)
            keys = [svc.keys.affinity(session_id)] + [k for j in jobs for k in (svc.keys.events(j), svc.keys.cancel(j))]
            svc.client.delete(*keys)
        except (redis.RedisError, SetflowError) as e:  # the delete stands: SQL is the truth
            log.warning("session %s deleted; its Redis state was not (%s; it expires by itself)", session_id, e)
    finally:
        try:
            svc.store.release(lease)
        except redis.RedisError:
            pass  # the lease expires by itself
    return Response(status_code=204)
