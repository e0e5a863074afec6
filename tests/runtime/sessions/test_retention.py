"""runtime/sessions/retention.py on a real Redis, and a SQLite file or PostgreSQL: a session idle
past session_retention_s is deleted whole (its Redis state, its turns, its jobs, its count in
its tenant's usage), a bounded batch at a time, the longest idle first; one with an unfinished
job, or used since, stays; idle ones are found through the index on updated_at."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from sqlalchemy import Engine, event, text, update

from runtime.jobs.rows import Jobs
from runtime.sessions import retention
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from runtime.tables import SessionRecord
from tests.runtime.sessions.test_lifecycle import _session

DAY = 24 * 3600.0


def _age(engine: Engine, sid: str, days: float) -> None:
    with engine.begin() as c:
        c.execute(update(SessionRecord).where(SessionRecord.id == sid)
                  .values(updated_at=datetime.now(UTC) - timedelta(days=days)))


def test_idle_sessions_are_deleted_whole_oldest_first_in_bounded_batches(
        db_engine: Engine, store: SessionStore, client: redis.Redis) -> None:
    records, jobs = Records(db_engine), Jobs(db_engine, Settings())
    old, m = _session(store, records)  # two turns in SQL, their K/V in Redis
    _age(db_engine, old, 9)
    waiting = records.create_session("acme", "").id  # idle as long, but a job of it is queued
    jobs.create("turn", "acme", {"text": "x"}, waiting)
    _age(db_engine, waiting, 9)
    recent = records.create_session("acme", "").id
    _age(db_engine, recent, 6)
    batch = []
    for i in range(3):
        sid = records.create_session("globex", "").id
        _age(db_engine, sid, 20 - i)  # the longest idle go first
        batch.append(sid)
    assert retention.prune(store, records, 7 * DAY, limit=2) == 2  # bounded
    assert {s.id for s in records.list_sessions("globex")} == {batch[2]}
    assert retention.prune(store, records, 7 * DAY, limit=2) == 2
    assert store.read(old) is None and not any(client.exists(store.k.segment(s)) for s in m.segments)
    assert not records.list_sessions("globex") and {s.id for s in records.list_sessions("acme")} == {waiting, recent}
    with db_engine.connect() as c:
        usage = dict(c.execute(text("SELECT tenant, sessions FROM tenant_usage")).all())
        assert usage == {"acme": 2, "globex": 0}
        assert c.execute(text("SELECT turn_bytes FROM tenant_usage WHERE tenant = 'acme'")).scalar_one() == 0
    assert retention.prune(store, records, 7 * DAY) == 0


def test_a_session_used_after_it_was_found_idle_stays(db_engine: Engine, store: SessionStore) -> None:
    """Found idle, then used (a job submitted and done, a turn written) before its delete: the
    delete, under its lease, sees it and leaves it, Redis state included."""
    records, jobs = Records(db_engine), Jobs(db_engine, Settings())
    sid, _ = _session(store, records)
    _age(db_engine, sid, 9)
    found = records.idle
    assert [s for s, _ in found(datetime.now(UTC) - timedelta(days=7), 10)] == [sid]

    def used_meanwhile(before: datetime, limit: int) -> list[tuple[str, str]]:
        out = found(before, limit)
        job, _ = jobs.create("turn", "acme", {"text": "x"}, sid)  # touches the session
        jobs.cancel(job.id, "acme")
        return out

    records.idle = used_meanwhile  # type: ignore[method-assign]
    assert retention.prune(store, records, 7 * DAY) == 0
    assert records.turn_count(sid, "acme") == 2 and store.read(sid) is not None


def test_idle_sessions_are_found_through_the_index(db_engine: Engine) -> None:
    records = Records(db_engine)
    for _ in range(3):
        records.create_session("acme", "")
    seen: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        seen.append((statement, params))

    event.listen(db_engine, "before_cursor_execute", keep)
    try:
        records.idle(datetime.now(UTC), 100)
    finally:
        event.remove(db_engine, "before_cursor_execute", keep)
    (statement, params), = [(s, p) for s, p in seen if "FROM sessions" in s]
    with db_engine.connect() as c:
        if db_engine.dialect.name == "sqlite":
            plan = " ".join(str(r[-1]) for r in c.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params))
            assert "sessions USING INDEX ix_session_updated (updated_at<?)" in plan, plan
        else:
            c.exec_driver_sql("SET enable_seqscan = off")  # a small table: its plan as on a large one
            plan = " ".join(str(r[0]) for r in c.exec_driver_sql(f"EXPLAIN {statement}", params))
            assert "ix_session_updated" in plan and "Seq Scan on sessions" not in plan, plan
