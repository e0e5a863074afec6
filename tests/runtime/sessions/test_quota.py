"""runtime/sessions/quota.py through its writers (Records, Jobs, Conversations) on a SQLite file
and on PostgreSQL: each tenant's count of sessions and turn bytes equals what its rows hold,
through creates, turns, forks and deletes; a change past a ceiling is OverBudget and writes
nothing; a tenant looping forks, one at a time or many at once, stops at its quota."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import Engine, func, select

from runtime.errors import OverBudget
from runtime.jobs.conversations import Conversations
from runtime.jobs.rows import Jobs
from runtime.sessions import quota
from runtime.sessions.records import Records
from runtime.settings import Settings
from runtime.tables import SessionRecord, TenantUsageRecord, TurnRecord

FP = "6cfff3ff2058a6b3"
LEDGER = [(i, 100 + i) for i in range(40)]


def held(engine: Engine) -> dict[str, tuple[int, int]]:
    """tenant -> (sessions, turn bytes) as the rows say them, recounted."""
    with engine.connect() as c:
        sessions = dict(c.execute(select(SessionRecord.tenant, func.count()).group_by(SessionRecord.tenant)).all())
        stored = dict(c.execute(select(SessionRecord.tenant, func.sum(TurnRecord.bytes)).join(
            TurnRecord, TurnRecord.session_id == SessionRecord.id).group_by(SessionRecord.tenant)).all())
    return {t: (int(n), int(stored.get(t) or 0)) for t, n in sessions.items()}


def counted(engine: Engine) -> dict[str, tuple[int, int]]:
    """tenant -> (sessions, turn bytes) as tenant_usage counts them (tenants holding nothing left out)."""
    with engine.connect() as c:
        rows = c.execute(select(TenantUsageRecord.tenant, TenantUsageRecord.sessions, TenantUsageRecord.turn_bytes))
        return {t: (int(n), int(b)) for t, n, b in rows if n or b}


def _turn(db: Records, sid: str, tenant: str = "acme", text: str = "hello") -> int:
    """Append a turn; its stored size."""
    rec = db.append_turn(sid, tenant, "assistant", text, [t for _, t in LEDGER], LEDGER, meta={"path": "new"})
    assert rec.bytes == quota.turn_bytes(text, [t for _, t in LEDGER], [list(e) for e in LEDGER], {"path": "new"})
    return rec.bytes


def test_the_counts_follow_creates_turns_forks_and_deletes(db_engine: Engine) -> None:
    db, jobs = Records(db_engine), Jobs(db_engine, Settings())
    a = db.create_session("acme", FP).id
    size = _turn(db, a) + _turn(db, a, text="Grüße, 東京")  # bytes, not characters
    job, _ = jobs.create("narrative", "acme", {}, open_session=True)  # a job's own session counts
    Conversations(db_engine).create("globex", {}, [])
    child = db.fork(a, "acme", 1).id  # its copies count as turns of its own
    db.fork(a, "acme", 0)
    assert counted(db_engine) == held(db_engine)
    assert counted(db_engine)["acme"][0] == 4 and counted(db_engine)["acme"][1] > 2 * size
    db.delete_session(a, "acme")
    db.delete_session(child, "acme")
    assert counted(db_engine) == held(db_engine) and counted(db_engine)["globex"] == (1, 0)


def test_a_fork_loop_stops_at_the_turn_bytes_quota_and_the_refusal_writes_nothing(db_engine: Engine) -> None:
    probe = Records(db_engine)
    sid = probe.create_session("acme", FP).id
    size = _turn(probe, sid)
    cap = 5 * size + size // 2  # the parent's turn and four copies fit; not a fifth
    db = Records(db_engine, Settings(tenant_max_turn_bytes=cap))
    forks = []
    with pytest.raises(OverBudget, match="tenant_max_turn_bytes"):
        for _ in range(100):
            forks.append(db.fork(sid, "acme", 0).id)
    assert len(forks) == 4
    before = held(db_engine)
    assert before["acme"] == (5, 5 * size) == counted(db_engine)["acme"]
    with pytest.raises(OverBudget):
        _turn(db, forks[0])
    with pytest.raises(OverBudget):
        db.fork(sid, "acme", 0, new_id="refused")
    assert held(db_engine) == before and counted(db_engine)["acme"] == before["acme"], "nothing written"
    assert db.turn_count(forks[0], "acme") == 1
    db.delete_session(forks[0], "acme")  # a delete gives its bytes back: a fork fits again
    db.fork(sid, "acme", 0)
    assert counted(db_engine) == held(db_engine)
    assert db.create_session("globex", FP).id  # another tenant's quota is its own


def test_a_tenant_holds_at_most_its_sessions_however_they_are_made(db_engine: Engine) -> None:
    s = Settings(tenant_max_sessions=3)
    db, jobs, convs = Records(db_engine, s), Jobs(db_engine, s), Conversations(db_engine, s)
    sid = db.create_session("acme", FP).id
    _turn(db, sid)
    db.fork(sid, "acme", 0)
    jobs.create("narrative", "acme", {}, open_session=True)
    before = held(db_engine)
    refusals = [lambda: db.create_session("acme", FP), lambda: db.fork(sid, "acme", 0),
                lambda: jobs.create("narrative", "acme", {}, open_session=True),
                lambda: convs.create("acme", {}, [])]
    for refused in refusals:
        with pytest.raises(OverBudget, match="tenant_max_sessions"):
            refused()
    assert held(db_engine) == before == counted(db_engine)
    assert len(jobs.listing("acme")) == 1, "a refused job writes no row"
    jobs.create("turn", "acme", {"text": "x"}, sid)  # a job on a session it holds is no new session


def test_a_tenant_whose_turns_fill_its_quota_submits_no_more_jobs(db_engine: Engine) -> None:
    probe = Records(db_engine)
    sid = probe.create_session("acme", FP).id
    size = _turn(probe, sid)
    s = Settings(tenant_max_turn_bytes=size)
    jobs = Jobs(db_engine, s)
    with pytest.raises(OverBudget, match="tenant_max_turn_bytes"):
        jobs.create("turn", "acme", {"text": "x"}, sid)
    assert jobs.listing("acme") == []
    jobs.create("turn", "globex", {"text": "x"}, open_session=True)


def test_forks_at_once_cannot_pass_the_quota_together(db_engine: Engine) -> None:
    """Many forks at the same moment, each its own transaction: the tenant's row admits them one
    at a time, so the quota holds exactly (PostgreSQL: row locks; SQLite: one writer)."""
    probe = Records(db_engine)
    sid = probe.create_session("acme", FP).id
    _turn(probe, sid)
    db = Records(db_engine, Settings(tenant_max_sessions=10))

    def fork(_: int) -> bool:
        try:
            db.fork(sid, "acme", 0)
            return True
        except OverBudget:
            return False

    with ThreadPoolExecutor(8) as pool:
        made = sum(pool.map(fork, range(40)))
    assert made == 9 and held(db_engine)["acme"][0] == 10
    assert counted(db_engine) == held(db_engine)
