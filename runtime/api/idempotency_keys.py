"""The idempotency_keys rows (runtime/tables.py IdempotencyRecord) under runtime/api/idempotency.py's
middleware: a key is claimed by inserting its row (the primary key (tenant, key) decides a race),
answered with the route's answer (its bytes counted to the tenant), or released.  A row past its
TTL, or in flight past `abandoned_s`, is free again; rows past their TTL are pruned PRUNE at a
time as new keys come, and a tenant holds at most `most` keys within their TTL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from runtime.api.models import aware
from runtime.db import writer
from runtime.errors import OverBudget, RateLimited
from runtime.jobs.table import matched
from runtime.sessions import quota
from runtime.sessions.quota import Quota
from runtime.settings import Settings
from runtime.tables import IdempotencyRecord

PRUNE = 500  # expired rows deleted per new key, at most


class Keys:
    """The idempotency_keys rows (sync: the middleware runs them on a worker thread)."""

    def __init__(self, engine: Any, ttl_s: float, abandoned_s: float, most: int | None = None,
                 settings: Settings | None = None) -> None:
        self._db = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(writer(engine), expire_on_commit=False)
        self.ttl_s = ttl_s
        self.abandoned_s = abandoned_s  # an in-flight row this old is nobody's any more
        self.most = most  # keys a tenant holds within the TTL, at most (None: no ceiling)
        self.quota = Quota.of(settings)

    def claim(self, tenant: str, key: str, route: str, digest: str) -> IdempotencyRecord | None:
        """None: this request holds the key now (run it); else the row another holds or held
        (read first without a write transaction: most duplicates find it live)."""
        now = datetime.now(UTC)
        cutoff = now - timedelta(seconds=self.ttl_s)
        live = self.get(tenant, key)
        if live is not None and aware(live.created_at) >= cutoff and (
                live.status is not None or aware(live.created_at) >= now - timedelta(seconds=self.abandoned_s)):
            return live
        try:
            with self._write.begin() as db:
                old = db.get(IdempotencyRecord, (tenant, key))
                if old is not None and (aware(old.created_at) < cutoff or old.status is None
                                        and aware(old.created_at) < now - timedelta(seconds=self.abandoned_s)):
                    # expired, or abandoned in flight: the key is free again.  Deleted only as it
                    # was read (its created_at): a duplicate that freed it first keeps the row it
                    # wrote since, and the insert below loses on the primary key (PostgreSQL ran
                    # both when the delete named the key alone)
                    db.expunge(old)
                    if matched(db.execute(delete(IdempotencyRecord).where(IdempotencyRecord.tenant == tenant,
                                                                          IdempotencyRecord.key == key,
                                                                          IdempotencyRecord.created_at == old.created_at))):
                        quota.release(db, tenant, stored=quota.size(old.answer))
                    old = None
                if old is not None:
                    return old
                if self.most is not None and (db.scalar(select(func.count()).select_from(IdempotencyRecord).where(
                        IdempotencyRecord.tenant == tenant, IdempotencyRecord.created_at >= cutoff)) or 0) >= self.most:
                    raise RateLimited(f"tenant {tenant!r} holds {self.most} Idempotency-Keys, the most it may "
                                      "(idempotency_max_keys): send this request without one, or wait for keys to "
                                      "expire (idempotency_ttl_s)", retry_after_s=60.0)
                db.add(IdempotencyRecord(tenant=tenant, key=key, route=route, body_hash=digest))
                stale = select(IdempotencyRecord.tenant, IdempotencyRecord.key, IdempotencyRecord.answer).where(
                    IdempotencyRecord.created_at < cutoff).order_by(IdempotencyRecord.tenant).limit(PRUNE)
                for t, k, answer in db.execute(stale).all():
                    if matched(db.execute(delete(IdempotencyRecord).where(IdempotencyRecord.tenant == t,
                                                                          IdempotencyRecord.key == k))):
                        quota.release(db, t, stored=quota.size(answer))
            return None
        except IntegrityError:  # another request inserted it between our read and our insert
            with self._db() as db:
                row = db.get(IdempotencyRecord, (tenant, key))
            return row if row is not None else self.claim(tenant, key, route, digest)

    def get(self, tenant: str, key: str) -> IdempotencyRecord | None:
        with self._db() as db:
            return db.get(IdempotencyRecord, (tenant, key))

    def answer(self, tenant: str, key: str, status: int, answer: dict[str, Any]) -> None:
        """Keep the answer, its bytes counted to the tenant; one past its tenant_max_stored_bytes
        is not kept (the key is released: a retry runs the request again)."""
        try:
            with self._write.begin() as db:
                row = db.get(IdempotencyRecord, (tenant, key))
                if row is not None:
                    quota.charge(db, tenant, self.quota, stored=quota.size(answer))
                    row.status, row.answer = status, answer
        except OverBudget:
            self.release(tenant, key)

    def release(self, tenant: str, key: str) -> None:
        with self._write.begin() as db:
            db.execute(delete(IdempotencyRecord).where(IdempotencyRecord.tenant == tenant,
                                                       IdempotencyRecord.key == key))
