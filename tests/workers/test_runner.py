"""workers/runner.py in this process (a real Redis and a SQLite file, no Celery): a narrative job
whose output its checker refutes, also after the greedy AR retry, fails with "unverified" and the
checker's problems in its error, and /metrics' counter says so; with `allow_unverified` the same
job succeeds, flagged."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from domain import narrative as corpus
from domain.payload import Rendered
from model import shipped
from runtime.db import make_engine
from runtime.embedded import EmbeddedRedis
from runtime.jobs.dispatch import Dispatcher
from runtime.jobs.payload import PayloadSpec
from runtime.jobs.rows import Jobs
from runtime.keys import Keys
from runtime.sessions.engine import Engine
from runtime.sessions.metrics import TurnMetrics
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from tests.workflows.test_narrative import PAYLOAD
from workers import runner
from workers.runner import Runtime


def refuted(r: Rendered, text: str) -> corpus.Check:
    """The checker reading the model's slot-form text back against the payload's rendering, refuting it."""
    return corpus.Check(0, 3, ["revenue: numbers ['1250'] != ['1240']"])


def test_a_narrative_its_checker_refutes_fails_unverified_or_succeeds_flagged(
        client: redis.Redis, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = shipped.load()
    s = settings.model_copy(update={"data_dir": tmp_path})
    sql = make_engine(s)
    records, jobs = Records(sql), Jobs(sql, s)
    engine = Engine(model, SessionStore(client, s), records, s)
    rt = Runtime(s, "w1", engine, tok, jobs, Dispatcher(client, jobs, lambda job_id, queue, priority="interactive": None))
    monkeypatch.setattr(corpus, "read_back", refuted)  # every narrative reads wrong: the first and the retry
    spec = {"payload": PayloadSpec.of(PAYLOAD).model_dump(exclude_none=True)}

    sid = records.create_session("acme", "").id
    job, _ = jobs.create("narrative", "acme", spec, sid)
    assert runner.run(rt, job.id).what == "failed"
    done = jobs.get(job.id)
    assert done.result is None and done.error is not None and done.error["code"] == "unverified"
    assert done.error["problems"] == ["revenue: numbers ['1250'] != ['1240']"]
    assert "after the greedy AR retry" in done.error["message"]
    assert [t.job_step for t in records.turns(sid, "acme")] == [0, 1]  # the first decode and its retry

    job, _ = jobs.create("narrative", "acme", {**spec, "allow_unverified": True}, records.create_session("acme", "").id)
    assert runner.run(rt, job.id).what == "succeeded"
    r = jobs.get(job.id).result
    assert r is not None and r["verified"] is False and r["attempt"] == "ar_retry" and r["problems"]
    assert TurnMetrics(client, s).read()["checked"] == {"narrative": {"unverified": 1, "flagged": 1}}
    sql.dispose()


def test_a_job_waits_out_a_full_redis_and_its_ended_stream_keeps_its_final_events(tmp_path: Path) -> None:
    """Issue 31: at maxmemory a turn's lease cannot be taken (OOM), which failed every job
    `internal`.  It is transient now: retried from the last committed step until memory frees.
    The ended job's stream is then compacted by the reaper's pass to its final events."""
    with tempfile.TemporaryDirectory(prefix="sfr") as d, EmbeddedRedis(d) as server:
        client = redis.Redis.from_url(server.url)
        s = Settings(key_prefix="sf", data_dir=tmp_path, events_compact_after_s=0, job_retry_s=30)
        model, tok = shipped.load()
        sql = make_engine(s)
        records, jobs = Records(sql), Jobs(sql, s)
        dispatcher = Dispatcher(client, jobs, lambda job_id, queue, priority="interactive": None)
        rt = Runtime(s, "w1", Engine(model, SessionStore(client, s), records, s), tok, jobs, dispatcher)
        job, _ = jobs.create("turn", "acme", {"text": "Hello there.", "params": {"max_new_tokens": 8}},
                             records.create_session("acme", "").id)
        client.config_set("maxmemory", max(1, int(client.info("memory")["used_memory"]) // 2))
        freed = threading.Timer(1.0, client.config_set, ("maxmemory", 0))
        freed.start()
        assert runner.run(rt, job.id).what == "succeeded"
        freed.join()
        steps = [e for _, e in dispatcher.events.read(job.id, count=100_000) if e["type"] == "step"]
        assert steps, "the retried turn streamed its steps"
        assert dispatcher.events.compact_due() == {"event_streams_compacted": 1}
        left = [e for _, e in dispatcher.events.read(job.id, count=100_000)]
        assert {e["type"] for e in left} <= {"status", "progress"} and left[-1]["status"] == "succeeded"
        assert len([e for e in left if e["type"] == "progress"]) <= 1
        sql.dispose()
        client.close()


def test_a_worker_says_the_jobs_it_runs_per_tenant_while_they_run(
        client: redis.Redis, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Routing.running, from the runner: a job's tenant counts on its worker from its claim to its
    end (where the next job with no warm worker goes reads it: Routing.place), and is gone after;
    a job sent to the worker's own queue is on its way there until it runs (Routing.sent), and a
    late copy of a finished job is taken off too."""
    model, tok = shipped.load()
    s = settings.model_copy(update={"data_dir": tmp_path})
    sql = make_engine(s)
    records, jobs = Records(sql), Jobs(sql, s)
    dispatcher = Dispatcher(client, jobs, lambda job_id, queue, priority="interactive": None)
    rt = Runtime(s, "w1", Engine(model, SessionStore(client, s), records, s), tok, jobs, dispatcher)
    busy, onway = Keys(s.key_prefix).busy("w1"), Keys(s.key_prefix).onway("w1")
    seen: list[tuple[dict[Any, Any], int]] = []
    real = runner._run_claimed

    def spy(*args: Any) -> runner.Outcome:
        seen.append((client.hgetall(busy), client.zcard(onway)))
        return real(*args)

    monkeypatch.setattr(runner, "_run_claimed", spy)
    job, _ = jobs.create("turn", "acme", {"text": "Hello there.", "params": {"max_new_tokens": 4}},
                         records.create_session("acme", "").id)
    dispatcher.routing.sent("w1", job.id, "acme")
    assert client.zcard(onway) == 1
    assert runner.run(rt, job.id).what == "succeeded"
    assert seen == [({b"acme": b"1"}, 0)] and not client.exists(busy) and not client.exists(onway)
    dispatcher.routing.sent("w1", job.id, "acme")  # delivered again after it finished
    assert runner.run(rt, job.id).what == "finished" and not client.exists(onway)
    sql.dispose()


def test_the_backoff_doubles_to_five_seconds_within_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """One helper for both retries (a store call, an attempt): 0.25 s doubling to 5 s; None once
    the next try would start past the budget, counted from the backoff's making."""
    now = [100.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: now[0])
    backoff = runner.Backoff(20.0)
    waits = []
    while (delay := backoff.next()) is not None:
        waits.append(delay)
        now[0] += delay
    assert waits == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0] and now[0] == 117.75  # a next 5 s would end at 122.75
    assert runner.Backoff(0.0).next() is None
