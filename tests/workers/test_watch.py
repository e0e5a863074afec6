"""workers/watch.py: one reaper pass, as the reaper thread runs it, on a real Redis and a SQLite
file: the jobs' pass, then the sessions' sweep (a crashed writer's segments past their deadline),
by the worker that took the pass; a failing sweep is logged, never fatal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from runtime.db import make_engine
from runtime.jobs.dispatch import Dispatcher
from runtime.jobs.rows import Jobs
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from workers.watch import reap_pass


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
    done = reap_pass(dispatcher, store)
    assert done["segments_freed"] == 1 and done["requeued"] == 0
    assert not client.exists(store.k.segment(old)) and client.exists(store.k.segment(fresh)), "a writer's grace"
    again = _old_segment(store, client)
    assert reap_pass(dispatcher, store) == {}, "another worker took this interval's pass"
    assert client.exists(store.k.segment(again))
    client.delete(store.k.reaper)
    assert "segments_freed" not in reap_pass(dispatcher, store, collect=False), "gc_interval_s not passed yet"
    assert client.exists(store.k.segment(again))
    client.delete(store.k.reaper)

    def down(batch: int = 0) -> dict[str, int]:
        raise redis.ConnectionError("Redis went away")

    store.sweep = down  # type: ignore[method-assign]
    assert "segments_freed" not in reap_pass(dispatcher, store)
    assert "session sweep failed" in caplog.text
