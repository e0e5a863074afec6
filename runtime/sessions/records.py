"""Sessions and turns in SQL: one short transaction per call.  Every operation checks its input
first and raises a named error without writing anything.  What a tenant holds (its sessions, its
turns' bytes) is counted against its quota in the same transactions (runtime/sessions/quota.py)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Collection
from datetime import UTC, datetime
from typing import NamedTuple

from sqlalchemy import Engine, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from runtime.db import writer
from runtime.errors import BadInput, Busy, ClaimLost, StaleWrite
from runtime.sessions import quota
from runtime.sessions.quota import Quota
from runtime.settings import Settings
from runtime.tables import TERMINAL, ConversationRecord, JobRecord, SessionRecord, TurnRecord, listing, owned

ROLES = ("user", "assistant", "tool")
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class JobStep(NamedTuple):
    """A job's step that writes a turn: which job, which step, under which claim."""

    job_id: str
    step: int
    owner: str  # the claim token: the turn is written only while the job is still this holder's


class Records:
    """Sessions and turns.  One short transaction per call.  settings: the tenants' quotas
    (tenant_max_sessions, tenant_max_turn_bytes); None: none (what is held is counted all the
    same)."""

    def __init__(self, engine: Engine, settings: Settings | None = None) -> None:
        self.engine = engine
        self.quota = Quota.of(settings)
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)

    def create_session(self, tenant: str, fingerprint: str, session_id: str | None = None,
                       model: tuple[str, str] | None = None) -> SessionRecord:
        """model: (name, numerics) the session is bound to; None: bound by its first job or turn.
        OverBudget where the tenant holds tenant_max_sessions already."""
        if not tenant or len(tenant) > 128:
            raise BadInput("tenant must be 1..128 characters")
        if session_id is not None and not _SESSION_ID.fullmatch(session_id):
            raise BadInput("a session id is 1..64 characters of letters, digits, '-' and '_'")
        if session_id is not None and self._exists(session_id):
            raise BadInput(f"session {session_id!r} exists already")
        name, numerics = model or ("", "")
        rec = SessionRecord(id=session_id or secrets.token_hex(12), tenant=tenant, model_fingerprint=fingerprint,
                            model=name, numerics=numerics)
        with self._write.begin() as db:
            db.add(rec)
            quota.charge(db, tenant, self.quota, sessions=1)
        return rec

    def fork(self, session_id: str, tenant: str, turn: int, new_id: str | None = None) -> SessionRecord:
        """A new session of the same tenant and model whose turns are copies of turns 0..turn of
        `session_id` (role, text, token ids, ledger, meta; not the job step that wrote them: a
        (job, step) pair names one turn).  Its ledger is the parent's up to that turn, so its
        first turn, recomputed from SQL, decodes what the parent's would have after that turn.
        One transaction.  NotFound for an unknown or another tenant's session; BadInput for a
        turn outside 0..turn_count-1 or a bad or taken new_id; OverBudget where the new session,
        or its copies' bytes, would pass the tenant's quota (a fork counts as a session of its
        own, its copies as turns of their own)."""
        if new_id is not None and not _SESSION_ID.fullmatch(new_id):
            raise BadInput("a session id is 1..64 characters of letters, digits, '-' and '_'")
        if not isinstance(turn, int) or isinstance(turn, bool):
            raise BadInput(f"turn must be an integer, got {turn!r}")
        try:
            with self._write.begin() as db:
                parent = _owned(db, session_id, tenant)
                n = _count(db, session_id)
                if not 0 <= turn < n:
                    raise BadInput(f"session {session_id} has turns 0..{n - 1}, cannot fork at turn {turn}")
                if new_id is not None and db.get(SessionRecord, new_id) is not None:
                    raise BadInput(f"session {new_id!r} exists already")
                child = SessionRecord(id=new_id or secrets.token_hex(12), tenant=tenant,
                                      model_fingerprint=parent.model_fingerprint, model=parent.model,
                                      numerics=parent.numerics)
                db.add(child)
                # the rows are immutable once written: those read here are the parent's for good
                copied = 0
                for t in db.scalars(select(TurnRecord).where(TurnRecord.session_id == session_id,
                                                             TurnRecord.index <= turn).order_by(TurnRecord.index)):
                    db.add(TurnRecord(session_id=child.id, index=t.index, role=t.role, text=t.text,
                                      token_ids=list(t.token_ids), ledger=[list(e) for e in t.ledger],
                                      meta=dict(t.meta), bytes=t.bytes))
                    copied += t.bytes
                quota.charge(db, tenant, self.quota, sessions=1, nbytes=copied)
        except IntegrityError as e:  # another writer took new_id between the check and the insert
            raise BadInput(f"session {new_id!r} exists already") from e
        return child

    def delete_session(self, session_id: str, tenant: str, idle_only: bool = False,
                       before: datetime | None = None) -> list[str]:
        """Delete the session, its turns and its jobs (the foreign keys cascade: PostgreSQL
        always, SQLite with PRAGMA foreign_keys on, which make_engine sets); returns the deleted
        jobs' ids.  NotFound for an unknown or another tenant's session.  idle_only: Busy when a
        job of it is queued or running, checked in the same transaction, with the session's row
        locked against a submission at the same moment (Jobs.create locks it too; SQLite's
        writers are serialised anyway).  before: Busy when it was updated since (a turn, a job
        submitted), checked the same way (the retention's).  Its Redis state is
        SessionStore.drop's.  Its tenant's usage gives back the session, its turns' bytes, its jobs'
        and its conversation's unread items'."""
        with self._write.begin() as db:
            owner = owned(db.get(SessionRecord, session_id, with_for_update=True), tenant, f"session {session_id!r}")
            if before is not None and _aware(owner.updated_at) >= before:
                raise Busy(f"session {session_id} was used since {before.isoformat()}")
            jobs = db.execute(select(JobRecord.id, JobRecord.status).where(JobRecord.session_id == session_id)).all()
            if idle_only and any(status not in TERMINAL for _, status in jobs):
                raise Busy(f"session {session_id} has unfinished jobs; cancel them first")
            stored = int(db.scalar(select(func.coalesce(func.sum(TurnRecord.bytes), 0))
                                   .where(TurnRecord.session_id == session_id)) or 0)
            kept = int(db.scalar(select(func.coalesce(func.sum(JobRecord.nbytes), 0))
                                 .where(JobRecord.session_id == session_id)) or 0)
            unread = db.scalar(select(ConversationRecord.pending).where(ConversationRecord.session_id == session_id))
            quota.release(db, tenant, sessions=1, nbytes=stored, stored=kept + (quota.size(unread) if unread else 0))
            # a bulk DELETE, not db.delete(): the ORM would first set the turns' session_id to
            # NULL (the relationship has no delete cascade), which the schema refuses
            db.execute(delete(SessionRecord).where(SessionRecord.id == session_id))
        return [job_id for job_id, _ in jobs]

    def idle(self, before: datetime, limit: int) -> list[tuple[str, str]]:
        """(session, tenant) of up to `limit` sessions not updated since `before` that have no
        unfinished job, the longest idle first: the retention's, an index range of
        ix_session_updated (never a scan of the table)."""
        busy = select(JobRecord.id).where(JobRecord.session_id == SessionRecord.id,
                                          JobRecord.status.not_in(TERMINAL)).exists()
        with self._sessions() as db:
            return [(s, t) for s, t in db.execute(
                select(SessionRecord.id, SessionRecord.tenant).where(SessionRecord.updated_at < before, ~busy)
                .order_by(SessionRecord.updated_at).limit(limit))]

    def used_since(self, session_id: str, before: datetime) -> bool:
        """Whether the session was updated (a turn, a job submitted) at or after `before`."""
        with self._sessions() as db:
            rec = db.get(SessionRecord, session_id)
            return rec is not None and _aware(rec.updated_at) >= before

    def unfinished_jobs(self, session_id: str) -> int:
        """The session's jobs that are queued or running (a delete that must find it idle asks)."""
        with self._sessions() as db:
            return int(db.scalar(select(func.count()).select_from(JobRecord).where(
                JobRecord.session_id == session_id, JobRecord.status.not_in(TERMINAL))) or 0)

    def _exists(self, session_id: str) -> bool:
        with self._sessions() as db:
            return db.get(SessionRecord, session_id) is not None

    def list_sessions(self, tenant: str, limit: int = 50) -> list[SessionRecord]:
        """The tenant's sessions, newest first."""
        with self._sessions() as db:
            return list(db.scalars(listing(SessionRecord, tenant, limit, newest_first=True)))

    def get_session(self, session_id: str, tenant: str) -> SessionRecord:
        """NotFound for an unknown session and for another tenant's (no existence leak)."""
        with self._sessions() as db:
            return _owned(db, session_id, tenant)

    def append_turn(self, session_id: str, tenant: str, role: str, text: str, token_ids: list[int],
                    ledger: list[tuple[int, int]], meta: dict[str, object] | None = None,
                    index: int | None = None, job: JobStep | None = None,
                    fingerprint: str | None = None, model: tuple[str, str] | None = None) -> TurnRecord:
        """The turn becomes durable when this returns.  index: the turn's place, as the writer
        read it (under the session's lease); a row already there is a StaleWrite, not a second
        turn at the same place.  None: the next free one.  job: the job step that writes it; a
        second turn for the same (job, step) is a StaleWrite, and a job no longer held under
        job.owner (requeued, cancelled, given up) is ClaimLost: in the same transaction, the
        job's step counter moves on with the turn.  fingerprint: binds a session opened without
        a model (by the API) to the writer's model; model: (name, numerics), the same.
        OverBudget where its bytes would pass its tenant's tenant_max_turn_bytes."""
        if role not in ROLES:
            raise BadInput(f"role must be one of {ROLES}, got {role!r}")
        try:
            with self._write.begin() as db:
                owner = _owned(db, session_id, tenant)
                n = _count(db, session_id)
                if index is not None and index != n:
                    raise StaleWrite(f"session {session_id}: turn {index} expected, the database holds {n} turns")
                rec = TurnRecord(session_id=session_id, index=n, role=role, text=text, token_ids=list(token_ids),
                                 ledger=[[int(p), int(t)] for p, t in ledger], meta=dict(meta or {}),
                                 job_id=job.job_id if job else None, job_step=job.step if job else None)
                rec.bytes = quota.turn_bytes(rec.text, rec.token_ids, rec.ledger, rec.meta)
                db.add(rec)
                owner.updated_at = datetime.now(UTC)
                if job is not None:
                    held = db.execute(update(JobRecord).where(
                        JobRecord.id == job.job_id, JobRecord.owner == job.owner, JobRecord.status == "running",
                    ).values(step=job.step + 1))
                    if int(getattr(held, "rowcount", 0)) != 1:
                        raise ClaimLost(f"job {job.job_id} is no longer held by this writer: turn not written")
                if fingerprint and not owner.model_fingerprint:
                    owner.model_fingerprint = fingerprint
                if model is not None and not owner.model:
                    owner.model, owner.numerics = model
                quota.charge(db, tenant, self.quota, nbytes=rec.bytes)  # last: its row is locked till the commit
        except IntegrityError as e:  # two writers at the same index, or the same job step, at once
            raise StaleWrite(f"session {session_id}: turn {index} (job step {job}) was written by another holder"
                             ) from e
        return rec

    def turn_by_job(self, session_id: str, tenant: str, job_id: str, step: int) -> TurnRecord | None:
        """The turn that step `step` of job `job_id` wrote, if it did."""
        with self._sessions() as db:
            _owned(db, session_id, tenant)
            return db.scalar(select(TurnRecord).where(TurnRecord.job_id == job_id, TurnRecord.job_step == step))

    def turn_count(self, session_id: str, tenant: str) -> int:
        with self._sessions() as db:
            _owned(db, session_id, tenant)
            return _count(db, session_id)

    def turns(self, session_id: str, tenant: str) -> list[TurnRecord]:
        with self._sessions() as db:
            _owned(db, session_id, tenant)
            return list(db.scalars(select(TurnRecord).where(TurnRecord.session_id == session_id)
                                   .order_by(TurnRecord.index)))

    def length(self, session_id: str, tenant: str, except_jobs: Collection[str] = ()) -> int:
        """Positions the session holds: its next turn starts here (every position below it is
        in exactly one turn's ledger; a stop's cut drops the positions past it).  except_jobs:
        not counting the turns those jobs wrote (a job's plan counts them already)."""
        q = select(func.coalesce(func.sum(func.json_array_length(TurnRecord.ledger)), 0)).where(
            TurnRecord.session_id == session_id)  # counted in SQL: no ledger read into Python
        if except_jobs:
            q = q.where(or_(TurnRecord.job_id.is_(None), TurnRecord.job_id.not_in(list(except_jobs))))
        with self._sessions() as db:
            _owned(db, session_id, tenant)
            return int(db.scalar(q) or 0)

    def ledger(self, session_id: str, tenant: str) -> list[tuple[int, int]]:
        """The session's whole commit-order ledger: what a recompute prefills, in order."""
        return [(p, t) for turn in self.turns(session_id, tenant) for p, t in turn.ledger]


def _owned(db: Session, session_id: str, tenant: str) -> SessionRecord:
    """The session, checked inside the caller's transaction (one round trip, not a second one)."""
    return owned(db.get(SessionRecord, session_id), tenant, f"session {session_id!r}")


def _aware(t: datetime) -> datetime:
    """A time read back from SQLite (naive, stored in UTC) as PostgreSQL gives it."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _count(db: Session, session_id: str) -> int:
    n = db.scalar(select(func.count()).select_from(TurnRecord).where(TurnRecord.session_id == session_id))
    return int(n or 0)
