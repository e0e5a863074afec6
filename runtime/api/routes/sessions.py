"""/v1/sessions: create, read (transcript, KV size, where it is cached), post a turn, infill,
fork at a turn, delete.  A turn and an infill are jobs (202 with the job; follow it by GET
/v1/jobs/{id} or its events); create, fork and delete are immediate."""

from __future__ import annotations

from fastapi import APIRouter, Response

from runtime.api.deps import Limit, SessionId, Svc, Tenant
from runtime.api.models import (
    ERRORS,
    CacheView,
    ForkRequest,
    InfillRequest,
    JobView,
    SessionCreated,
    SessionList,
    SessionView,
    TurnRequest,
    TurnView,
)
from runtime.errors import BadInput, Busy
from runtime.sessions import lifecycle

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


@router.post("", status_code=201, response_model=SessionCreated, responses=ERRORS)
def create_session(who: Tenant, svc: Svc) -> SessionCreated:
    """A new, empty session (its model is bound by its first turn)."""
    svc.limiter.take(who)
    rec = svc.records.create_session(who, "")
    return SessionCreated(id=rec.id, created_at=rec.created_at)


@router.get("", response_model=SessionList, responses=ERRORS)
def list_sessions(who: Tenant, svc: Svc, limit: Limit = 50) -> SessionList:
    return SessionList(sessions=[SessionCreated(id=s.id, created_at=s.created_at)
                                 for s in svc.records.list_sessions(who, limit)])


@router.get("/{session_id}", response_model=SessionView, responses=ERRORS)
def get_session(session_id: SessionId, who: Tenant, svc: Svc) -> SessionView:
    rec = svc.records.get_session(session_id, who)  # NotFound for another tenant's
    turns = []
    rows = svc.records.turns(session_id, who)
    tok = svc.tokenizer(rec.model_fingerprint) if rows else None  # None: no model published (no output text)
    for t in rows:
        meta = t.meta or {}
        holes = meta.get("infill")  # an infill turn: the output is what its holes were filled with
        out_ids = [t.token_ids[i] for i in holes] if holes else t.token_ids[int(meta.get("n_input", len(t.token_ids))):]
        turns.append(TurnView(index=t.index, role=t.role, input=t.text,
                              output=tok.decode(out_ids, skip_special=True) if tok is not None else "",
                              tokens=len(t.token_ids), path=meta.get("path"), job=t.job_id, created_at=t.created_at))
    m = svc.store.read(session_id)
    last = svc.dispatcher.routing.last_worker(session_id)
    kv = CacheView(redis_turns=int(m.state.get("turns", -1)) if m is not None else None,
                   redis_bytes=m.nbytes if m is not None else 0, redis_segments=len(m.segments) if m is not None else 0,
                   slots=m.slots if m is not None else 0, last_worker=last,
                   last_worker_alive=last is not None and svc.dispatcher.routing.alive(last))
    return SessionView(id=rec.id, created_at=rec.created_at, turns=turns, kv=kv,
                       unfinished_jobs=svc.records.unfinished_jobs(session_id))


@router.post("/{session_id}/turns", status_code=202, response_model=JobView, responses=ERRORS)
def post_turn(session_id: SessionId, req: TurnRequest, who: Tenant, svc: Svc) -> JobView:
    """Queue a turn: the input (text or token ids) is appended and decoded with the given
    parameters; the session's jobs run one at a time, in submission order."""
    spec = req.model_dump(exclude={"priority"}, exclude_unset=True)  # what was sent: an explicit null (tau) too
    return JobView.of(svc.submit("turn", who, spec, session_id, req.priority))


@router.post("/{session_id}/infill", status_code=202, response_model=JobView, responses=ERRORS)
def post_infill(session_id: SessionId, req: InfillRequest, who: Tenant, svc: Svc) -> JobView:
    """Queue an infill: the text is appended with each `<hole>` decoded in place."""
    spec = req.model_dump(exclude={"priority"}, exclude_unset=True)  # what was sent: an explicit null (tau) too
    return JobView.of(svc.submit("infill", who, spec, session_id, req.priority))


@router.post("/{session_id}/fork", status_code=201, response_model=SessionCreated, responses=ERRORS)
def fork_session(session_id: SessionId, req: ForkRequest, who: Tenant, svc: Svc) -> SessionCreated:
    """A new session holding this one's turns 0..turn; its next turn continues from there (the
    parent is unchanged)."""
    svc.records.get_session(session_id, who)  # NotFound before a rate-limit token is spent
    n = svc.records.turn_count(session_id, who)
    if not 0 <= req.turn < n:
        raise BadInput(f"turn must be in [0, {n}) for session {session_id}, got {req.turn}")
    svc.limiter.take(who)
    rec = lifecycle.fork_session(svc.store, svc.records, session_id, who, req.turn)  # shares the parent's K/V in Redis
    return SessionCreated(id=rec.id, created_at=rec.created_at)


@router.delete("/{session_id}", status_code=204, responses=ERRORS)
def delete_session(session_id: SessionId, who: Tenant, svc: Svc) -> Response:
    """Delete the session: its turns, its jobs (their event streams too) and its Redis state.
    409 while a job of it is queued or running (cancel those first), or while a turn holds it.
    The session part is lifecycle.delete_session's, under the session's lease (no turn runs
    meanwhile); its SQL delete checks for unfinished jobs in its own transaction, so a
    submission at the same moment either comes first (409) or finds no session (404).  The
    delete stands when Redis fails after it (SQL is the truth; what is left expires)."""
    svc.records.get_session(session_id, who)
    if svc.records.unfinished_jobs(session_id):
        raise Busy(f"session {session_id} has unfinished jobs; cancel them first")
    svc.limiter.take(who)
    delete_whole(svc, session_id, who)
    return Response(status_code=204)


def delete_whole(svc: Svc, session_id: str, who: str) -> None:
    """lifecycle.delete_session (Busy while a turn runs), then what the API keeps of the session
    in Redis: its affinity, and its jobs' streams (out of the tenant's account at once)."""
    jobs = lifecycle.delete_session(svc.store, svc.records, session_id, who, idle_only=True)
    svc.dispatcher.forget_session(session_id, who, jobs)
