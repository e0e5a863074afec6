"""Conversations of the Responses API in SQL: a conversation is a session (its K/V in Redis, its
turns in SQL) with a row of its own for its metadata and the items a client added that no
response has read yet.  Its responses are the session's `response` jobs, in submission order."""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from runtime.db import writer
from runtime.errors import BadInput, NotFound
from runtime.sessions import quota
from runtime.sessions.quota import Quota
from runtime.settings import Settings
from runtime.tables import ConversationRecord, JobRecord, SessionRecord, owned

MAX_PENDING = 256  # items a conversation holds unread at most


class Conversations:
    def __init__(self, engine: Engine, settings: Settings | None = None) -> None:
        """settings: the tenants' quotas (a conversation is a session); None: none."""
        self.quota = Quota.of(settings)
        self._db = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)

    def create(self, tenant: str, meta: dict[str, str], items: list[dict[str, Any]]) -> ConversationRecord:
        """A new conversation on a new session, in one transaction (OverBudget past the
        tenant's tenant_max_sessions)."""
        with self._write.begin() as db:
            session = secrets.token_hex(16)
            db.add(SessionRecord(id=session, tenant=tenant, model_fingerprint=""))
            db.flush()
            quota.charge(db, tenant, self.quota, sessions=1)
            rec = ConversationRecord(session_id=session, tenant=tenant, meta=meta, pending=None, added=len(items))
            self._pend(db, rec, _named(session, 0, items))
            db.add(rec)
        return self.get(session, tenant)

    def get(self, session: str, tenant: str) -> ConversationRecord:
        with self._db() as db:
            return owned(db.get(ConversationRecord, session), tenant, f"conversation conv_{session}")

    def add(self, session: str, tenant: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Items added (each named by its number in the conversation), read by its next response."""
        with self._write.begin() as db:
            rec = owned(db.get(ConversationRecord, session, with_for_update=True), tenant, f"conversation conv_{session}")
            if len(rec.pending) + len(items) > MAX_PENDING:
                raise BadInput(f"a conversation holds at most {MAX_PENDING} items no response has read")
            named = _named(session, rec.added, items)
            self._pend(db, rec, [*rec.pending, *named])
            rec.added += len(items)
        return named

    def take(self, session: str, tenant: str, expect: list[dict[str, Any]]) -> None:
        """The pending items `expect` were read by a response: out of the pending list (what was
        added meanwhile stays)."""
        ids = {x["id"] for x in expect}
        with self._write.begin() as db:
            rec = db.get(ConversationRecord, session, with_for_update=True)
            if rec is not None and rec.tenant == tenant:
                self._pend(db, rec, [x for x in rec.pending if x["id"] not in ids])

    def remove(self, session: str, tenant: str, item: str) -> None:
        """Take an item no response has read out of the conversation (NotFound: no such item
        unread; the route says why where a response read it)."""
        with self._write.begin() as db:
            rec = owned(db.get(ConversationRecord, session, with_for_update=True), tenant, f"conversation conv_{session}")
            if item not in [x["id"] for x in rec.pending]:
                raise NotFound(f"no unread item {item!r} in conversation conv_{session}")
            self._pend(db, rec, [x for x in rec.pending if x["id"] != item])

    def _pend(self, db: Session, rec: ConversationRecord, pending: list[dict[str, Any]]) -> None:
        """The unread items become `pending`, the change in their bytes counted to the tenant
        (OverBudget past tenant_max_stored_bytes: nothing changed)."""
        grow = quota.size(pending) - (quota.size(rec.pending) if rec.pending is not None else 0)
        if grow > 0:
            quota.charge(db, rec.tenant, self.quota, stored=grow)
        elif grow < 0:
            quota.release(db, rec.tenant, stored=-grow)
        rec.pending = pending

    def set_meta(self, session: str, tenant: str, meta: dict[str, str]) -> None:
        with self._write.begin() as db:
            rec = owned(db.get(ConversationRecord, session, with_for_update=True), tenant, f"conversation conv_{session}")
            rec.meta = meta

    def responses(self, session: str) -> list[JobRecord]:
        """The session's responses, in submission order."""
        with self._db() as db:
            return [r[0] for r in db.execute(select(JobRecord).where(
                JobRecord.session_id == session, JobRecord.kind == "response").order_by(JobRecord.seq))]

    def is_conversation(self, session: str) -> bool:
        with self._db() as db:
            return db.scalar(select(ConversationRecord.session_id).where(
                ConversationRecord.session_id == session)) is not None


def _named(session: str, first: int, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**x, "id": f"item_{session}_{first + i}"} for i, x in enumerate(items)]
