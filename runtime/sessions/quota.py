"""What a tenant holds in SQL, and its ceilings: its sessions, its turns' bytes and the other
bytes it stores (job specs and results, idempotency answers, conversation items no response has
read), counted in one row per tenant (tenant_usage) by the transaction that changes them: a
session's creation (Records, Jobs.create, Conversations) and fork, a turn's insert, a job's
creation, end and delete, an answer kept, an item added or read, a session's delete.  A change
past a ceiling raises OverBudget before its transaction commits, so a refused one writes
nothing, and concurrent ones cannot pass the ceiling together: the count moves by a
conditional UPDATE of the tenant's row, which PostgreSQL and SQLite apply one at a time.  Knows
nothing of Redis (the KV budgets are runtime/sessions/budget.py's)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Executable, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from runtime.errors import OverBudget
from runtime.settings import Settings
from runtime.tables import TenantUsageRecord as Usage


@dataclass(frozen=True)
class Quota:
    """A tenant's ceilings; None: none (counted all the same)."""

    sessions: int | None = None
    turn_bytes: int | None = None
    stored_bytes: int | None = None

    @classmethod
    def of(cls, settings: Settings | None) -> Quota:
        if settings is None:
            return cls()
        return cls(settings.tenant_max_sessions, settings.tenant_max_turn_bytes, settings.tenant_max_stored_bytes)


#: a Quota whose ceilings are none: what is counted but never refused (a job's result: its work is done)
COUNTED = Quota()


def turn_bytes(text: str, token_ids: Sequence[int], ledger: Sequence[Sequence[int]], meta: object) -> int:
    """What a turn stores: its text (UTF-8) and its token ids, ledger and meta as JSON."""
    return len(text.encode("utf-8", "surrogatepass")) + sum(len(json.dumps(x)) for x in (token_ids, ledger, meta))


def size(*docs: object) -> int:
    """What JSON documents (a job's spec and result, a kept answer, conversation items) store:
    their bytes as compact UTF-8 JSON (None stores nothing)."""
    return sum(len(json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
               for d in docs if d is not None)


def charge(db: Session, tenant: str, quota: Quota, sessions: int = 0, nbytes: int = 0, stored: int = 0) -> None:
    """Count `sessions` more sessions, `nbytes` more bytes of turns and `stored` more bytes of
    the rest for the tenant, in the caller's transaction; OverBudget where one would pass its
    ceiling (nothing counted: the caller's transaction rolls back with the error)."""
    conds = []
    if sessions > 0 and quota.sessions is not None:
        conds.append(Usage.sessions + sessions <= quota.sessions)
    if nbytes > 0 and quota.turn_bytes is not None:
        conds.append(Usage.turn_bytes + nbytes <= quota.turn_bytes)
    if stored > 0 and quota.stored_bytes is not None:
        conds.append(Usage.stored_bytes + stored <= quota.stored_bytes)
    stmt = update(Usage).where(Usage.tenant == tenant, *conds).values(
        sessions=Usage.sessions + sessions, turn_bytes=Usage.turn_bytes + nbytes, stored_bytes=Usage.stored_bytes + stored)
    if _rows(db.execute(stmt, execution_options={"synchronize_session": False})) == 1:
        return
    have = db.execute(select(Usage.sessions, Usage.turn_bytes, Usage.stored_bytes).where(Usage.tenant == tenant)).first()
    if have is None:  # the tenant's first: its row (another transaction may make it first: then that one's)
        db.execute(_insert_new(db, tenant))
        if _rows(db.execute(stmt, execution_options={"synchronize_session": False})) == 1:
            return
        have = db.execute(select(Usage.sessions, Usage.turn_bytes, Usage.stored_bytes).where(Usage.tenant == tenant)).one()
    held, turns, kept = have
    if quota.sessions is not None and sessions > 0 and held + sessions > quota.sessions:
        raise OverBudget(f"tenant {tenant!r} holds {held} sessions, the most it may (tenant_max_sessions): "
                         "delete some, or wait for idle ones to expire (session_retention_s)")
    if quota.stored_bytes is not None and stored > 0 and kept + stored > quota.stored_bytes:
        raise OverBudget(f"tenant {tenant!r} stores {kept} bytes of jobs, answers and items; {stored} more would "
                         f"pass its {quota.stored_bytes} (tenant_max_stored_bytes): delete jobs or sessions, or wait "
                         "for ended jobs to expire (job_retention_s)")
    raise OverBudget(f"tenant {tenant!r} stores {turns} bytes of turns; {nbytes} more would pass its "
                     f"{quota.turn_bytes} (tenant_max_turn_bytes): delete sessions, or wait for idle ones to "
                     "expire (session_retention_s)")


def check_room(db: Session, tenant: str, quota: Quota) -> None:
    """OverBudget where the tenant's turns fill its ceiling already (a job's turns could not be
    stored: refused at its submission rather than failed when it writes)."""
    if quota.turn_bytes is None:
        return
    stored = db.scalar(select(Usage.turn_bytes).where(Usage.tenant == tenant)) or 0
    if stored >= quota.turn_bytes:
        raise OverBudget(f"tenant {tenant!r} stores {stored} bytes of turns, the most it may "
                         "(tenant_max_turn_bytes): delete sessions, or wait for idle ones to expire "
                         "(session_retention_s)")


def release(db: Session, tenant: str, sessions: int = 0, nbytes: int = 0, stored: int = 0) -> None:
    """Take out what a delete removes, in its transaction."""
    db.execute(update(Usage).where(Usage.tenant == tenant).values(
        sessions=Usage.sessions - sessions, turn_bytes=Usage.turn_bytes - nbytes, stored_bytes=Usage.stored_bytes - stored),
        execution_options={"synchronize_session": False})


def _insert_new(db: Session, tenant: str) -> Executable:
    """INSERT the tenant's row unless it is there (ON CONFLICT DO NOTHING)."""
    values = {"tenant": tenant, "sessions": 0, "turn_bytes": 0, "stored_bytes": 0}
    name = db.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(Usage).values(**values).on_conflict_do_nothing(index_elements=["tenant"])
    if name == "sqlite":
        return sqlite.insert(Usage).values(**values).on_conflict_do_nothing(index_elements=["tenant"])
    return insert(Usage).values(**values)


def _rows(result: object) -> int:
    return int(getattr(result, "rowcount", 0))
