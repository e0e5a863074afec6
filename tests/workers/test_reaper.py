"""workers/reaper.py: one reaper pass, as the reaper thread runs it, on a real Redis and a
SQLite file: the jobs' pass, the sessions idle past their retention, then the sessions' sweep (a
crashed writer's segments past their deadline), by the worker that took the pass; a failing
sweep is logged, never fatal.  The jobs' passes themselves: test_dispatch.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from sqlalchemy import update

from runtime.db import make_engine
from runtime.jobs.dispatch import Dispatcher
from runtime.jobs.rows import Jobs
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from runtime.tables import SessionRecord
from workers.reaper import Reaper


def _old_segment(store: SessionStore, client: redis.Redis) -> str:
    """A segment a writer wrote and never named, its deadline (2 lease periods) passed: the
    writer crashed between its segments and its manifest."""
    (sid,) = store.put_segments("crashed", "acme", [b"\x00" * 64])
    client.zadd(store.k.pending("crashed"), {sid: 0})
    client.zadd(store.k.pending_index, {json.dumps(["acme", "crashed"], separators=(",", ":")): 0})
    return sid


def test_a_reaper_pass_deletes_old_unnamed_segments(client: redis.Redis, settings: Settings, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    s = settings.model_copy(update={"data_dir": tmp_path})
    store = SessionStore(client, s)
    dispatcher = Dispatcher(client, Jobs(make_engine(s), s), lambda job_id, queue, priority: None)
    old, fresh = _old_segment(store, client), store.put_segments("writing", "acme", [b"\x00" * 64])[0]
    done = Reaper(dispatcher, store).run()
    assert done["segments_freed"] == 1 and done["requeued"] == 0
    assert not client.exists(store.k.segment(old)) and client.exists(store.k.segment(fresh)), "a writer's grace"
    again = _old_segment(store, client)
    assert Reaper(dispatcher, store).run() == {}, "another worker took this interval's pass"
    assert client.exists(store.k.segment(again))
    client.delete(store.k.reaper)
    assert "segments_freed" not in Reaper(dispatcher, store).run(collect=False), "gc_interval_s not passed yet"
    assert client.exists(store.k.segment(again))
    client.delete(store.k.reaper)

    def down(batch: int = 0) -> dict[str, int]:
        raise redis.ConnectionError("Redis went away")

    store.sweep = down  # type: ignore[method-assign]
    assert "segments_freed" not in Reaper(dispatcher, store).run()
    assert "session sweep failed" in caplog.text


def test_a_reaper_pass_deletes_sessions_idle_past_their_retention(client: redis.Redis, settings: Settings,
                                                                   tmp_path: Path) -> None:
    s = settings.model_copy(update={"data_dir": tmp_path, "session_retention_s": 3600.0})
    engine = make_engine(s)
    store, records = SessionStore(client, s), Records(engine)
    dispatcher = Dispatcher(client, Jobs(engine, s), lambda job_id, queue, priority: None)
    idle, used = records.create_session("acme", "").id, records.create_session("acme", "").id
    # a finished job of the idle session: its event stream and the session's affinity in Redis
    job, _ = dispatcher.jobs.create("narrative", "acme", {}, idle)
    dispatcher.jobs.finish(job.id, dispatcher.jobs.claim(job.id, "w1").owner or "", "succeeded")
    dispatcher.events.publish("acme", job.id, {"type": "status", "status": "succeeded"})
    client.set(dispatcher.k.affinity(idle), "w1")
    assert dispatcher.events.tenant_bytes("acme") > 0
    with engine.begin() as c:
        c.execute(update(SessionRecord).where(SessionRecord.id == idle)
                  .values(updated_at=datetime.now(UTC) - timedelta(hours=2)))
    assert Reaper(dispatcher, store).run(collect=False)["sessions_deleted"] == 1
    assert [r.id for r in records.list_sessions("acme")] == [used]
    # what the jobs side kept of it went with it, as after a DELETE by its tenant
    assert not client.exists(dispatcher.k.events(job.id)) and not client.exists(dispatcher.k.affinity(idle))
    assert dispatcher.events.tenant_bytes("acme") == 0
