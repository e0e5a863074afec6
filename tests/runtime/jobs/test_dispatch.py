"""runtime/jobs/dispatch.py, fairness.py (its rate limit), routing.py and schemas.py, and
workers/reaper.py (its jobs passes), on a real Redis and a real database.  The transport is a
list here (what would be sent, to which queue); the real Celery path is tested in tests/workers/."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis
from pydantic import BaseModel
from sqlalchemy import update

from runtime.db import make_engine
from runtime.errors import BadInput, NotFound, RateLimited
from runtime.jobs.dispatch import Admission, Dispatcher
from runtime.jobs.fairness import RateLimiter
from runtime.jobs.routing import Routing, consumed_by
from runtime.jobs.rows import Jobs
from runtime.jobs.specs import TurnSpec
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from runtime.tables import JobRecord
from tests.conftest import pg_schema
from workers.reaper import Reaper

SPEC = {"text": "hello", "params": {"max_new_tokens": 8}}


def reap(d: Dispatcher) -> dict[str, int]:
    """The reaper's jobs passes, as a worker's pass runs them."""
    return Reaper(d, SessionStore(d.r, d.s)).reap_jobs()


class Sent(list[tuple[str, str]]):
    def __call__(self, job_id: str, queue: str, priority: str = "interactive") -> None:
        self.append((job_id, queue))


@pytest.fixture
def env(client: redis.Redis, settings: Settings, tmp_path: Path) -> tuple[Dispatcher, Sent, str]:
    s = settings.model_copy(update={"data_dir": tmp_path, "tenant_burst": 5, "tenant_rate_per_s": 10.0,
                                    "worker_heartbeat_s": 0.2, "job_lease_s": 0.05, "reaper_interval_s": 0.01})
    sql = make_engine(s)
    sent = Sent()
    d = Dispatcher(client, Jobs(sql, s), sent)
    return d, sent, Records(sql).create_session("acme", "").id


def test_submit_routes_by_affinity_and_liveness(env: tuple[Dispatcher, Sent, str]) -> None:
    d, sent, sid = env
    p = d.s.key_prefix
    j1 = d.submit("turn", "acme", SPEC, sid)
    assert sent == [(j1.id, f"{p}.interactive")]  # no last worker yet: the shared queue
    d.routing.touch(sid, "w1")
    d.jobs.cancel(j1.id, "acme")
    d.submit("turn", "acme", SPEC, sid)
    assert sent[-1][1] == f"{p}.interactive"  # w1 is not alive
    d.routing.beat("w1")
    j3 = d.submit("turn", "acme", SPEC, sid)
    assert j3.id not in [j for j, _ in sent]  # j2 is unfinished: j3 waits for it
    d.jobs.cancel(sent[-1][0], "acme")
    d.routing.beat("w1")  # alive now, as a worker beating every 0.2 s is (a loaded machine took > 3 beats above)
    d.dispatch_next(sid)
    assert sent[-1] == (j3.id, f"{p}.w.w1")  # w1 is alive and was the session's last worker
    assert d.jobs.get(j3.id).queue == f"{p}.w.w1"
    assert consumed_by(d.s, "w1") == [f"{p}.w.w1", f"{p}.interactive", f"{p}.batch"]
    d.routing.gone("w1")
    assert d.routing.route(sid, "batch") == f"{p}.batch"


def test_bad_submissions_change_nothing(env: tuple[Dispatcher, Sent, str], client: redis.Redis) -> None:
    d, sent, sid = env
    bad = [("nope", SPEC, sid), ("turn", SPEC, None), ("turn", {"text": "a", "input_ids": [1]}, sid),
           ("turn", {"text": "a", "params": {"window": 0}}, sid), ("turn", {"text": "a", "extra": 1}, sid),
           ("turn", ["not", "a", "dict"], sid)]
    for kind, spec, session in bad:
        with pytest.raises(BadInput) as e:
            d.submit(kind, "acme", spec, session)  # type: ignore[arg-type]
        assert e.value.code == "bad_input"
    with pytest.raises(NotFound):
        d.submit("turn", "other", SPEC, sid)
    assert sent == [] and d.jobs.next_queued(sid) is None
    assert not client.exists(d.k.bucket("acme"))  # no rate-limit token taken either


def test_rate_limit_is_shared_and_says_when(env: tuple[Dispatcher, Sent, str], client: redis.Redis) -> None:
    d, sent, sid = env
    other = RateLimiter(client, d.s)  # a second API process
    for i in range(5):
        (d.limiter if i % 2 else other).take("acme")
    with pytest.raises(RateLimited) as e:
        d.submit("turn", "acme", SPEC, sid)
    assert e.value.code == "rate_limited" and 0 < e.value.retry_after_s <= 0.1 + 1e-9
    assert sent == []  # refused: no job row, nothing sent
    other.take("globex")  # tenants have their own buckets
    time.sleep(e.value.retry_after_s + 0.02)
    d.submit("turn", "acme", SPEC, sid)
    assert len(sent) == 1


def test_reaper_requeues_expired_and_resends_stranded(env: tuple[Dispatcher, Sent, str]) -> None:
    d, sent, sid = env
    job = d.submit("turn", "acme", SPEC, sid)
    claim = d.jobs.claim(job.id, "w1")
    assert claim.owner is not None
    time.sleep(0.1)  # the holder died: its 0.05 s lease runs out
    assert reap(d) == {"requeued": 1, "gave_up": 0, "resent": 0, "admitted": 0, "expired": 0, "pruned": 0}
    assert d.jobs.get(job.id).status == "queued" and sent[-1] == (job.id, f"{d.s.key_prefix}.interactive")
    # a queued job sent to a worker that died before taking it goes back to the shared queue
    d.jobs.mark_dispatched(job.id, f"{d.s.key_prefix}.w.gone")
    time.sleep(0.02)
    assert reap(d)["resent"] == 1 and sent[-1] == (job.id, f"{d.s.key_prefix}.interactive")
    events = [e["status"] for _, e in d.events.read(job.id) if e["type"] == "status"]
    assert events == ["queued", "queued"]


def test_cancel_queued_job_publishes_and_unblocks(env: tuple[Dispatcher, Sent, str]) -> None:
    d, sent, sid = env
    a = d.submit("turn", "acme", SPEC, sid)
    b = d.submit("turn", "acme", SPEC, sid)
    assert [j for j, _ in sent] == [a.id]
    assert d.cancel(a.id, "acme").status == "cancelled"
    assert [j for j, _ in sent] == [a.id, b.id]  # b's turn has come
    assert d.wait(a.id, 1.0).status == "cancelled"


def test_routing_liveness_expires(client: redis.Redis, settings: Settings) -> None:
    r = Routing(client, settings.model_copy(update={"worker_heartbeat_s": 0.05}))
    r.beat("w9")
    assert r.alive("w9")
    time.sleep(0.2)  # three missed beats
    assert not r.alive("w9")
    assert r.worker_of(r.own("w9")) == "w9" and r.worker_of(r.shared("batch")) is None


def test_cancelling_a_requeued_job_publishes_and_unblocks(env: tuple[Dispatcher, Sent, str]) -> None:
    d, sent, sid = env
    a = d.submit("turn", "acme", SPEC, sid)
    b = d.submit("turn", "acme", SPEC, sid)
    assert d.jobs.claim(a.id, "w1").owner is not None
    time.sleep(0.1)  # its worker died
    reap(d)
    requeued = d.jobs.get(a.id)
    assert requeued.status == "queued" and requeued.started_at is not None
    assert d.cancel(a.id, "acme").status == "cancelled"
    assert sent[-1] == (b.id, f"{d.s.key_prefix}.interactive")  # b's turn has come
    assert d.wait(a.id, 1.0).status == "cancelled"
    before = list(sent)
    d.cancel(a.id, "acme")  # cancelling again changes nothing, sends nothing
    assert sent == before


def test_a_failed_send_is_accepted_and_sent_by_the_reaper(env: tuple[Dispatcher, Sent, str]) -> None:
    d, sent, sid = env

    def broker_down(job_id: str, queue: str, priority: str) -> None:
        raise ConnectionError("broker away")

    d.send = broker_down
    job = d.submit("turn", "acme", SPEC, sid)  # accepted: the row is written
    assert d.jobs.get(job.id).dispatched_at == 0.0
    d.send = sent
    assert reap(d)["admitted"] == 1 and sent == [(job.id, f"{d.s.key_prefix}.interactive")]


def test_bad_priority_or_oversized_input_spends_no_token(env: tuple[Dispatcher, Sent, str],
                                                         client: redis.Redis) -> None:
    d, sent, sid = env
    for kwargs in [{"priority": "urgent"}, {"spec": {"input_ids": [5] * (d.s.max_input_tokens + 1)}},
                   {"spec": {"text": "x" * (4 * d.s.max_input_tokens + 1)}}]:
        with pytest.raises(BadInput):
            d.submit("turn", "acme", kwargs.get("spec", SPEC), sid, priority=kwargs.get("priority", "interactive"))
    assert not client.exists(d.k.bucket("acme")) and sent == []


def test_wait_reads_sql_when_the_final_event_is_lost(env: tuple[Dispatcher, Sent, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    d, sent, sid = env
    job = d.submit("turn", "acme", SPEC, sid)
    claim = d.jobs.claim(job.id, "w1")
    d.jobs.finish(job.id, claim.owner or "", "succeeded", result={"ok": 1})  # no status event published

    def no_events(*args: object, **kwargs: object) -> None:
        raise AssertionError("waited for an event that will never come")

    monkeypatch.setattr(d.events, "read", no_events)
    assert d.wait(job.id, 30).status == "succeeded"  # from SQL, not after the timeout


def test_admit_gets_the_parsed_spec_once_and_its_refusal_writes_nothing(env: tuple[Dispatcher, Sent, str],
                                                                       client: redis.Redis) -> None:
    d, sent, sid = env
    seen: list[object] = []

    def refuse(spec: BaseModel) -> None:
        seen.append(spec)
        raise BadInput("does not fit")

    with pytest.raises(BadInput):
        d.submit("turn", "acme", SPEC, sid, admit=refuse)
    assert len(seen) == 1 and isinstance(seen[0], TurnSpec) and seen[0].params.max_new_tokens == 8
    assert sent == [] and d.jobs.next_queued(sid) is None
    # the caller's checks are the costly ones: they run after the token, so a refused request has paid
    assert float(client.hget(d.k.bucket("acme"), "tokens") or 0) <= d.s.tenant_burst - 1
    with pytest.raises(BadInput):
        d.submit("turn", "acme", {"text": "a", "extra": 1}, sid, admit=refuse)  # a bad spec never reaches it
    assert len(seen) == 1
    job = d.submit("turn", "acme", SPEC, sid, admit=seen.append)
    assert len(seen) == 2 and sent == [(job.id, f"{d.s.key_prefix}.interactive")]
    planned = d.submit("turn", "acme", SPEC, sid, admit=lambda spec: Admission(positions=42))
    assert sorted(d.jobs.planned(sid), key=str) == sorted([(job.id, None), (planned.id, 42)], key=str)  # kept with it


def test_the_reaper_resends_only_what_is_lost_and_a_blocked_backlog_never_starves_it(
        env: tuple[Dispatcher, Sent, str], client: redis.Redis) -> None:
    d, sent, sid = env
    d.s = d.jobs.s = d.s.model_copy(update={"job_requeue_after_s": 10.0, "tenant_burst": 10_000,
                                            "tenant_rate_per_s": 10_000.0, "job_lease_s": 60})
    d.limiter.s = d.s
    head = d.submit("turn", "acme", SPEC, sid)  # the session's first job: it runs on, holding the rest
    assert d.jobs.claim(head.id, "w1").owner is not None
    blocked = [d.submit("turn", "acme", SPEC, sid) for _ in range(120)]  # more than a page of the reaper's
    other = Records(d.jobs.engine).create_session("acme", "").id
    lost = d.submit("turn", "acme", SPEC, other)  # its message is lost (the queue is empty)
    waiting = d.submit("turn", "acme", SPEC, Records(d.jobs.engine).create_session("acme", "").id)
    q = d.routing.shared("batch")  # a shared queue with a backlog: its jobs wait their turn
    d.jobs.mark_dispatched(waiting.id, q)
    client.rpush(d.k.broker + q, b"someone else's message")  # a shared queue with a backlog in front of it
    stranded = d.submit("turn", "acme", SPEC, Records(d.jobs.engine).create_session("acme", "").id)
    d.routing.beat("w9")  # alive, but not consuming: what its own queue holds is stranded
    own = d.routing.own("w9")
    d.jobs.mark_dispatched(stranded.id, own)
    client.rpush(d.k.broker + own, b"its message")
    with d.jobs.engine.begin() as db:  # every send 15 s ago: past job_requeue_after_s, not past 3 x (a busy queue's)
        db.execute(update(JobRecord).where(JobRecord.dispatched_at > 0)
                   .values(dispatched_at=JobRecord.dispatched_at - 15.0))
    d.routing.beat("w9")
    sent.clear()
    client.delete(d.k.reaper)
    out = reap(d)
    assert sorted(j for j, _ in sent) == sorted([lost.id, stranded.id]) and out["resent"] == 2, \
        "not the blocked ones, not the one in a shared backlog"
    assert all(d.jobs.get(b.id).status == "queued" for b in blocked)
    client.delete(d.k.broker + q, d.k.broker + own)


def test_by_default_a_tenants_jobs_in_the_broker_are_one_per_live_worker_slot(
        env: tuple[Dispatcher, Sent, str]) -> None:
    d, sent, _ = env
    d.s = d.jobs.s = d.s.model_copy(update={"tenant_burst": 10_000, "tenant_rate_per_s": 10_000.0,
                                            "worker_heartbeat_s": 5.0})
    d.limiter.s = d.routing.s = d.s
    assert d.s.tenant_max_waiting is None and d.waiting_cap() == 1  # no worker alive: one at a time
    d.routing.beat("w1", 3)  # a batching worker: 3 jobs at once
    d.routing.beat("w2")  # one at a time
    assert d.waiting_cap() == 4
    records = Records(d.jobs.engine)
    backlog = [d.submit("turn", "acme", SPEC, records.create_session("acme", "").id) for _ in range(10)]
    assert [j for j, _ in sent] == [j.id for j in backlog[:4]], "one per slot goes; the rest wait in SQL"
    other = d.submit("turn", "globex", SPEC, records.create_session("globex", "").id)
    assert sent[-1][0] == other.id  # behind at most one of acme's jobs per slot
    d.routing.gone("w1")
    assert d.waiting_cap() == 1
    d.routing.gone("w2")


def test_a_tenant_over_its_share_of_the_workers_goes_its_share_at_a_time_and_a_light_one_goes_ahead(
        env: tuple[Dispatcher, Sent, str]) -> None:
    """runtime/jobs/fairness.py: one worker of 2 slots, 2 active tenants (a share of 1 at least).
    The heavy one (its jobs kept 3 slots busy lately, the other none) is sent one job at a time,
    the next as one ends; the light one's go at once, up to the slots' worth waiting, as before.
    Alone, a tenant is never held."""
    d, sent, _ = env
    d.s = d.jobs.s = d.s.model_copy(update={"tenant_burst": 10_000, "tenant_rate_per_s": 10_000.0,
                                            "worker_heartbeat_s": 5.0})
    d.limiter.s = d.routing.s = d.fairness.s = d.s
    records = Records(d.jobs.engine)
    d.routing.beat("w1", 2)
    d.fairness.charge("abuser", 30.0)  # 3 slots busy over the 10 s window
    alone = [d.submit("turn", "abuser", SPEC, records.create_session("abuser", "").id) for _ in range(3)]
    assert [j for j, _ in sent] == [j.id for j in alone[:2]], "alone: the slots' worth, as without shares"
    assert not d.held("abuser"), "alone: never held"
    for j in alone:
        d.cancel(j.id, "abuser")
    sent.clear()
    first = d.submit("turn", "normal", SPEC, records.create_session("normal", "").id)  # normal is active now
    assert d.fairness.cap("abuser", 2) == 1 and d.fairness.cap("normal", 2) is None
    assert d.held("abuser") and not d.held("normal"), "its turns sit out a batch's steps (the batcher's held class)"
    heavy = [d.submit("turn", "abuser", SPEC, records.create_session("abuser", "").id) for _ in range(4)]
    assert [j for j, _ in sent] == [first.id, heavy[0].id], "the heavy tenant: its share (1) at a time"
    light = [d.submit("turn", "normal", SPEC, records.create_session("normal", "").id) for _ in range(2)]
    assert [j for j, _ in sent][2:] == [light[0].id], "the light one: the slots' worth waiting (2), ahead of the backlog"
    claim = d.jobs.claim(heavy[0].id, "w1")
    assert claim.owner is not None and d.admit("abuser") == 0, "running counts: still its share"
    assert d.admit("normal") == 0 and d.jobs.claim(first.id, "w1").owner is not None and d.admit("normal") == 1
    assert sent[-1][0] == light[1].id  # a light tenant's running jobs do not hold it back
    d.jobs.finish(heavy[0].id, claim.owner, "succeeded", result={})
    assert d.admit("abuser") == 1 and sent[-1][0] == heavy[1].id, "a slot freed: its next goes"
    d.cancel(heavy[1].id, "abuser")  # cancelled in the broker: its place frees
    assert d.jobs.get(heavy[2].id).queue != "" and d.jobs.get(heavy[3].id).queue == ""
    d.routing.gone("w1")


def test_admissions_at_once_send_a_held_tenant_its_share_and_no_more(client: redis.Redis, settings: Settings) -> None:
    """Its submissions and its jobs' ends admit a tenant from several processes at once: held to
    its share (1), it has one job sent or running after 8 admissions race, round after round
    (on PostgreSQL, where they read and write at once; SQLite has one writer at a time)."""
    with pg_schema() as url:
        s = settings.model_copy(update={"database_url": url, "tenant_burst": 10_000, "tenant_rate_per_s": 10_000.0,
                                        "worker_heartbeat_s": 5.0})
        engine = make_engine(s)
        try:
            _race_admissions(Dispatcher(client, Jobs(engine, s), Sent()), Records(engine))
        finally:
            engine.dispose()


def _race_admissions(d: Dispatcher, records: Records) -> None:
    d.routing.beat("w1", 8)
    d.fairness.charge("abuser", 30.0)
    d.submit("turn", "normal", SPEC, records.create_session("normal", "").id)
    jobs = {d.submit("turn", "abuser", SPEC, records.create_session("abuser", "").id).id for _ in range(12)}

    def in_flight() -> list[JobRecord]:
        return [j for j in map(d.jobs.get, jobs) if j.status == "running" or (j.status == "queued" and j.queue)]

    for _ in range(5):
        (job,) = in_flight()
        claim = d.jobs.claim(job.id, "w1")
        assert claim.owner is not None
        d.jobs.finish(job.id, claim.owner, "succeeded", result={})
        go = threading.Barrier(8)

        def admit(go: threading.Barrier = go) -> None:
            go.wait()
            d.admit("abuser")

        threads = [threading.Thread(target=admit) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(in_flight()) == 1
    d.routing.gone("w1")


def test_the_shares_weigh_each_tenants_use_decayed_over_the_window_against_the_others(
        env: tuple[Dispatcher, Sent, str], client: redis.Redis) -> None:
    d, _, _ = env
    f, k = d.fairness, d.k
    f.charge("a", 9.0)  # 0.9 slots busy, on average, over the 10 s window
    f.charge("b", 1.0)
    assert f.cap("a", 2) == 1 and f.cap("b", 2) is None, "2 workers, 2 active: a share of 1; a took 9x b's"
    assert f.cap("a", 4) is None, "4 workers: a share of 2, and 0.9 is under half of it"
    f.charge("b", 7.0)
    assert f.cap("a", 2) is None and f.cap("b", 2) is None, "9 against 8: within LEAD, nobody held"
    sec, us = client.time()
    now = sec + us / 1e6
    client.hset(k.fair_use, mapping={"a": f"30.0 {now - 10.0}", "b": f"10.0 {now}"})  # a: 30 / e = 11.04 now
    client.set(k.fair_total, f"21.04 {now}")
    assert f.cap("a", 2) is None, "11.04 against 10: decayed, a is within LEAD of b"
    client.hset(k.fair_use, "a", f"30.0 {now}")
    client.set(k.fair_total, f"40.0 {now}")
    assert f.cap("a", 2) == 1, "30 against 10"
    client.zadd(k.fair_active, {"b": now - 11.0})  # b's last admission is past the window: a is alone
    assert f.cap("a", 2) is None and client.zscore(k.fair_active, "b") is None and client.hget(k.fair_use, "b") is None
    assert float(client.get(k.fair_total).split()[0]) == pytest.approx(30.0, abs=0.3), "b's use left the total"
    f.charge("b", 0.1)
    assert f.cap("a", 2) == 1, "b is active again (its job left a worker)"
    f.s = f.s.model_copy(update={"tenant_fair_window_s": 0.0})
    assert f.cap("a", 2) is None, "0: no shares"


def test_affinity_falls_back_to_the_shared_queue_when_the_last_worker_is_busy(
        env: tuple[Dispatcher, Sent, str], client: redis.Redis) -> None:
    d, sent, sid = env
    p, r = d.s.key_prefix, d.routing
    r.touch(sid, "w1")
    r.beat("w1")
    assert r.route(sid, "interactive") == f"{p}.w.w1"  # alive, nothing waiting: affinity
    own = d.k.broker + f"{p}.w.w1"
    client.rpush(own, *[b"waiting"] * d.s.affinity_max_waiting)  # a backlog in its own queue
    assert r.route(sid, "interactive") == f"{p}.interactive" and r.route(sid, "batch") == f"{p}.batch"
    client.delete(own)
    assert r.route(sid, "interactive") == f"{p}.w.w1"


def test_one_tenants_backlog_waits_in_sql_and_another_tenants_job_goes_at_once(
        env: tuple[Dispatcher, Sent, str]) -> None:
    d, sent, _ = env
    d.s = d.jobs.s = d.s.model_copy(update={"tenant_burst": 10_000, "tenant_rate_per_s": 10_000.0,
                                            "tenant_max_waiting": 16})
    d.limiter.s = d.s
    cap = 16
    records = Records(d.jobs.engine)
    backlog = [d.submit("turn", "acme", SPEC, records.create_session("acme", "").id) for _ in range(3 * cap)]
    assert [j for j, _ in sent] == [j.id for j in backlog[:cap]], "the first ones go; the rest wait in SQL"
    assert all(d.jobs.get(j.id).queue == "" for j in backlog[cap:])
    other = d.submit("turn", "globex", SPEC, records.create_session("globex", "").id)
    assert sent[-1][0] == other.id, "another tenant's job is not behind the backlog"
    urgent = d.submit("turn", "acme", SPEC, records.create_session("acme", "").id)  # interactive, held too
    late_batch = d.submit("turn", "acme", SPEC, records.create_session("acme", "").id, priority="batch")
    assert d.jobs.claim(backlog[0].id, "w1").owner is not None  # one leaves the broker: one more may go
    assert d.admit("acme") == 1 and sent[-1][0] == backlog[cap].id
    d.jobs.cancel(backlog[1].id, "acme")
    d.cancel(backlog[2].id, "acme")  # a queued one cancelled through the dispatcher frees its place too
    assert d.jobs.get(late_batch.id).queue == "" and urgent.id not in [j for j, _ in sent[:cap + 2]]
    waiting = [j for j in backlog + [urgent, late_batch] if d.jobs.get(j.id).status == "queued" and d.jobs.get(j.id).queue]
    assert len(waiting) <= cap


def test_a_batch_writes_what_submit_would_and_returns_the_specs_refused_for_good(
        env: tuple[Dispatcher, Sent, str], client: redis.Redis) -> None:
    """submit_batch (a schedule pass's jobs of one tenant): a spec the API refuses is returned
    with its reason and written nowhere; the others queued, each on a new session, with their
    status event, a token each taken at once, and admitted (one sent: the tenant's room in the
    broker with no live worker); over the tenant's rate, nothing is written and no token taken."""
    d, sent, _ = env
    # a refill too slow to matter between the calls: at the fixture's 10/s, 0.1 s of a loaded
    # machine gave back the token the last call is refused for (CI, 2026-12-07)
    d.s = d.jobs.s = d.s.model_copy(update={"tenant_rate_per_s": 1e-6})
    d.limiter.s = d.s
    tick = ("sch_a", 60.0)
    good, bad = {"text": "hi", "params": {"max_new_tokens": 8}}, {"text": "hi", "params": {"window": "4"}}
    ids = [f"{i:024x}" for i in range(4)]
    refused = d.submit_batch("acme", [("turn", good, ids[0], tick), ("turn", bad, ids[1], tick),
                                      ("turn", good, ids[2], tick)])
    assert list(refused) == [ids[1]] and "window" in refused[ids[1]]
    assert d.jobs.existing(ids) == {ids[0], ids[2]}
    for i in (0, 2):
        job = d.jobs.get(ids[i], "acme")
        assert (job.status, job.seq, job.priority, job.schedule_id) == ("queued", 1, "batch", "sch_a")
        assert [e["status"] for _, e in d.events.read(ids[i])] == ["queued"]
    assert len(sent) == 1 and d.events.tenant_bytes("acme") > 0
    left = int(float(client.hget(f"{d.s.key_prefix}:rl:acme", "tokens") or 0))
    assert left == d.s.tenant_burst - 2
    with pytest.raises(RateLimited):  # 4 more than the 3 left: as a whole
        d.submit_batch("acme", [("turn", good, ids[3], tick)] * 4)
    assert int(float(client.hget(f"{d.s.key_prefix}:rl:acme", "tokens") or 0)) == left
    assert not d.jobs.existing([ids[3]])


def test_a_job_with_no_warm_worker_is_placed_on_a_worker_of_its_tenant_or_an_idle_one(
        env: tuple[Dispatcher, Sent, str], client: redis.Redis) -> None:
    """Routing.place: a job whose session has no warm worker goes to the own queue of a live
    worker with nothing waiting: an idle one while its tenant runs on fewer workers than its
    share (workers / tenants active), else one running only its tenant's jobs; not to the
    shared queue, where a worker running another tenant's jobs may take it.  None such, or one
    worker alive: the shared queue, as before.  A session's warm worker still comes first."""
    d, sent, sid = env
    p, r = d.s.key_prefix, d.routing
    r.beat("w1", 6)
    assert r.route(None, "interactive", "", "acme") == f"{p}.interactive", "one worker alive: the shared queue"
    r.beat("w2", 6)
    r.running("w1", {"globex": 1})  # w1 runs another tenant's job: w2 is the idle one
    assert {r.route(None, "interactive", "", "acme", active=2) for _ in range(10)} == {f"{p}.w.w2"}
    assert r.route(None, "batch", "", "acme", active=2) == f"{p}.w.w2"
    assert r.route(None, "interactive", "", "acme", active=1) == f"{p}.interactive", \
        "a tenant alone is not placed (nobody to keep apart from): the shared queue, as before"
    d.fairness.charge("globex", 0.1)  # globex active too: submit's placement counts 2 tenants
    job = d.submit("turn", "acme", SPEC, sid)
    assert sent[-1] == (job.id, f"{p}.w.w2") and d.jobs.get(job.id).queue == f"{p}.w.w2"
    r.sent("w2", "j0", "globex")  # another tenant's job on its way to w2: w2 is neither idle nor acme's
    assert r.route(None, "interactive", "", "acme", active=2) == f"{p}.interactive"
    r.taken("w2", "j0", "globex")
    r.taken("w2", job.id, "acme")
    assert not client.exists(d.k.onway("w2"))
    # two tenants active: a share of 1 worker each
    r.running("w2", {"acme": 2})
    assert r.route(None, "interactive", "", "acme", active=2) == f"{p}.w.w2", "its own worker, not globex's"
    assert r.route(None, "interactive", "", "globex", active=2) == f"{p}.w.w1"
    assert r.route(None, "interactive", "", "initech", active=3) == f"{p}.interactive", "none idle, none its own"
    r.running("w1", {})
    assert not client.exists(d.k.busy("w1"))
    assert r.route(None, "interactive", "", "acme", active=2) == f"{p}.w.w2", "at its share: its own worker first"
    assert r.route(None, "interactive", "", "globex", active=2) == f"{p}.w.w1"
    r.running("w1", {"acme": 3})
    assert {r.route(None, "interactive", "", "acme", active=2) for _ in range(10)} == {f"{p}.w.w2"}, \
        "of its own workers, the least busy (w2 runs 2)"
    r.running("w1", {"globex": 1, "acme": 1})  # both tenants on w1: its own for neither
    assert r.route(None, "interactive", "", "globex", active=2) == f"{p}.interactive"
    r.touch(sid, "w1")
    assert r.route(sid, "interactive", "", "acme") == f"{p}.w.w1", "a warm worker comes first, busy or not"
    r.running("w1", {})
    r.running("w2", {})
    assert r.route(None, "interactive", "other.cpu-float32", "acme", active=2) == f"{p}.h.other.cpu-float32.interactive", \
        "an idle worker that does not host the job's model is not one"
    r.gone("w2")
    assert r.route(None, "interactive", "", "acme", active=2) == f"{p}.interactive", "one worker alive again"
    r.gone("w1")


def test_a_burst_placed_before_its_jobs_start_fills_each_workers_slots_and_no_more(
        env: tuple[Dispatcher, Sent, str], client: redis.Redis) -> None:
    """Jobs placed faster than workers start them (their running counts still empty) count on
    their way (Routing.sent) until their worker takes them: four on two 2-slot workers go two
    and two, the fifth to the shared queue (the RabbitMQ interactive-first test caught three on
    one worker, the third waiting behind the two while the other worker had a slot free)."""
    d, sent, _ = env
    d.s = d.jobs.s = d.routing.s = d.s.model_copy(update={"worker_heartbeat_s": 60.0})  # alive throughout: at the
    # fixture's 0.2 s a loaded machine let the workers die between their beat and the placing
    p, r = d.s.key_prefix, d.routing
    r.beat("w1", 2)
    r.beat("w2", 2)
    d.fairness.charge("globex", 0.1)  # another tenant active: acme's jobs are placed
    jobs = [d.submit("turn", "acme", SPEC, open_session=True) for _ in range(4)]
    queues = [d.jobs.get(j.id).queue for j in jobs]
    assert sorted(queues) == [f"{p}.w.w1"] * 2 + [f"{p}.w.w2"] * 2, queues
    assert client.zcard(d.k.onway("w1")) == client.zcard(d.k.onway("w2")) == 2
    assert r.route(None, "interactive", "", "acme", active=2) == f"{p}.interactive", "every slot has its job"
    first = next(j for j, q in zip(jobs, queues, strict=True) if q == f"{p}.w.w1")
    r.running("w1", {"acme": 1})  # w1 starts one: running first, then taken (never neither)
    r.taken("w1", first.id, "acme")
    assert r.route(None, "interactive", "", "acme", active=2) == f"{p}.interactive"
    r.running("w1", {})  # and ends it: a slot free on w1 (its other job still on its way)
    assert r.route(None, "interactive", "", "acme", active=2) == f"{p}.w.w1"
    # one sent longer ago than job_requeue_after_s (the reaper's by now) is not counted
    client.zadd(d.k.onway("w1"), {json.dumps(["old", "acme"]): time.time() - d.s.job_requeue_after_s - 1})
    assert r.route(None, "interactive", "", "acme", active=2) == f"{p}.w.w1"
    r.gone("w1")
    r.gone("w2")
