"""workers/watch.py: one reaper pass, as the reaper thread runs it, on a real Redis and a SQLite
file: the jobs' pass, then the K/V segments no manifest names (by the worker that took the pass);
a failing gc is logged, never fatal."""

from __future__ import annotations

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
    """A segment written and never named, longer ago than gc's grace period (2 lease periods)."""
    (sid,) = store.put_segments([b"\x00" * 64])
    client.pexpire(store.k.segment(sid), store.s.session_ttl_s * 1000 - 2 * store.s.lease_ms - 1000)
    return sid


def test_a_reaper_pass_deletes_old_unnamed_segments(client: redis.Redis, settings: Settings, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    s = settings.model_copy(update={"data_dir": tmp_path})
    store = SessionStore(client, s)
    dispatcher = Dispatcher(client, Jobs(make_engine(s), s), lambda job_id, queue: None)
    old, fresh = _old_segment(store, client), store.put_segments([b"\x00" * 64])[0]
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

    def down(grace_ms: int | None = None) -> int:
        raise redis.ConnectionError("Redis went away")

    store.gc = down  # type: ignore[method-assign]
    assert "segments_freed" not in reap_pass(dispatcher, store)
    assert "segment gc failed" in caplog.text
