"""A tenant's job event streams are in its byte account: counted at their size after trimming,
taken out by the sweep once they are gone (found from deadlines), and checked with its sessions'
bytes against the tenant budget; a tenant at its event quota is refused; an ended job's stream
is compacted to its final events (a response's is kept whole); a session's jobs' streams go in
bounded batches.  On one Redis server and on a local Redis Cluster."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
import redis

from runtime.embedded import async_from_url
from runtime.errors import OverBudget, RateLimited
from runtime.jobs import events
from runtime.jobs.events import DROP_BATCH, JobEvents
from runtime.sessions.segments import split
from runtime.sessions.store import Manifest, SessionStore
from runtime.settings import Settings
from runtime.tables import JobRecord
from tests.runtime.sessions.stored import FP, META
from tests.runtime.sessions.stored import kv as _kv


@pytest.fixture
def client(any_client: redis.Redis) -> redis.Redis:
    return any_client


def _step(i: int) -> dict[str, object]:
    return {"type": "step", "turn": 0, "step": i, "positions": list(range(8)), "tokens": [100 + i] * 8}


def test_a_stream_is_counted_at_its_size_after_trimming(client: redis.Redis, settings: Settings) -> None:
    ev = JobEvents(client, settings.model_copy(update={"events_maxlen": 50}))
    a, b = "a" * 24, "b" * 24
    ev.publish("acme", a, {"type": "status", "status": "queued"})
    one = ev.tenant_bytes("acme")
    assert one == client.memory_usage(ev.k.events(a)) and one > 0
    for i in range(20):
        ev.send("acme", a, [_step(20 * i + j) for j in range(20)], count_every_s=0)  # 400 events, kept ~50
    held = ev.tenant_bytes("acme")
    assert held == client.memory_usage(ev.k.events(a)), "the stream's size now, not a sum of what was written"
    assert client.xlen(ev.k.events(a)) < 400
    ev.publish("acme", b, {"type": "status", "status": "queued"})
    assert ev.tenant_bytes("acme") == held + client.memory_usage(ev.k.events(b))
    assert ev.tenant_bytes("globex") == 0
    assert ev.all_tenant_bytes() == {"acme": ev.tenant_bytes("acme")}


def test_a_running_jobs_stream_is_counted_once_a_second_and_its_status_at_once(
        client: redis.Redis, settings: Settings) -> None:
    """Step batches (a flush every 30 ms) cost one round trip: the account lags them by up to
    a second; the job's last event, a status, is counted at once."""
    ev, job = JobEvents(client, settings), "f" * 24
    ev.send("acme", job, [_step(0)])
    first = ev.tenant_bytes("acme")
    for i in range(1, 30):
        ev.send("acme", job, [_step(i) for _ in range(5)])
    assert ev.tenant_bytes("acme") == first < client.memory_usage(ev.k.events(job))
    ev.publish("acme", job, {"type": "status", "status": "succeeded"})
    assert ev.tenant_bytes("acme") == client.memory_usage(ev.k.events(job))


def test_the_sweep_takes_out_a_gone_stream_and_looks_again_at_one_written_since(
        client: redis.Redis, settings: Settings) -> None:
    ev = JobEvents(client, settings.model_copy(update={"events_ttl_s": 1}))
    gone, alive = "c" * 24, "d" * 24
    for job in (gone, alive):
        ev.publish("acme", job, {"type": "status", "status": "queued"})
    assert ev.sweep() == {"event_streams_gone": 0}, "nothing is due yet"
    client.expire(ev.k.events(alive), 30)  # as a write would: its stream lives on past its due time
    time.sleep(1.1)  # both due; the other expired
    assert ev.sweep() == {"event_streams_gone": 1}
    assert ev.tenant_bytes("acme") == client.memory_usage(ev.k.events(alive))
    member = f'["acme", "{alive}"]'
    score = client.zscore(ev.k.events_due, member)
    assert score is not None and score > time.time() * 1000 + 20_000, "due again at its new expiry"
    assert not ev._take(keys=[ev.k.events_due], args=[member, str(int(score) - 1)]), "moved since it was read: kept"
    ev.forget("acme", [alive])  # its session was deleted (the API deletes the stream too)
    assert ev.tenant_bytes("acme") == 0 and not client.exists(ev.k.event_bytes("acme"))
    assert client.zcard(ev.k.events_due) == 0


def test_a_stream_written_again_after_its_session_was_deleted_is_swept_out_of_the_account(
        client: redis.Redis, settings: Settings) -> None:
    """The race a soak found: a job is final in SQL, its session is deleted (the stream too, and
    forget()), and only then does the worker publish the final status, which makes the stream
    anew.  The worker's process had put it in events_due less than a minute before, so it did
    not again: the sweep never took it out, and the tenant paid for it for good."""
    s = settings.model_copy(update={"events_ttl_s": 1})
    worker, api, job = JobEvents(client, s), JobEvents(client, s), "e" * 24
    worker.publish("acme", job, {"type": "status", "status": "running"})
    worker.send("acme", job, [_step(i) for i in range(20)], count_every_s=0)
    client.delete(worker.k.events(job))  # DELETE /v1/sessions/{id} (runtime/api/routes/sessions.py)
    api.forget("acme", [job])
    assert worker.tenant_bytes("acme") == 0
    worker.publish("acme", job, {"type": "status", "status": "succeeded"})  # the worker's last word
    assert worker.tenant_bytes("acme") == client.memory_usage(worker.k.events(job)) > 0
    assert client.zcard(worker.k.events_due) == 1, "due at the new stream's expiry"
    time.sleep(1.1)
    assert worker.sweep() == {"event_streams_gone": 1} and worker.tenant_bytes("acme") == 0


def test_the_tenant_budget_counts_its_event_streams(client: redis.Redis, settings: Settings) -> None:
    """A session that fits the budget alone does not fit beside the tenant's event streams, and
    fits again once they are gone."""
    kv = len(_kv())
    s = settings.model_copy(update={"tenant_budget_bytes": kv + 64 * 1024})
    store, ev = SessionStore(client, s), JobEvents(client, s)

    def written(session: str) -> Manifest:
        ids = store.put_segments(session, "acme", split(META, _kv(), s.segment_bytes))
        return Manifest(session, "acme", FP, segments=ids, slots=META.end, state={})

    def commit(m: Manifest) -> None:
        with store.lease(m.session) as held:
            store.commit(m, held.lease)

    commit(written("s1"))  # fits alone
    store.drop("s1", "acme")
    m = written("s2")
    for i in range(40):  # ~100 KiB of step events
        ev.send("acme", "e" * 24, [_step(40 * i + j) for j in range(40)])
    ev.publish("acme", "e" * 24, {"type": "status", "status": "succeeded"})
    assert ev.tenant_bytes("acme") > 64 * 1024
    with pytest.raises(OverBudget, match=r"tenant acme: .* \(\d+ of them its jobs' event streams"):
        commit(m)
    client.delete(ev.k.events("e" * 24))  # expired
    client.zadd(ev.k.events_due, {f'["acme", "{"e" * 24}"]': 0})  # (due now, not in a day)
    assert ev.sweep() == {"event_streams_gone": 1}
    commit(m)  # the streams are gone: it fits again


# ---- ceilings (issue 31): the quota, compaction, deletes in bounded batches -----------------------

def _job(ev: JobEvents, tenant: str, job: str, steps: int = 300) -> list[str]:
    """A job's whole stream as a worker writes it; returns the ids of what compaction keeps."""
    ev.publish(tenant, job, {"type": "status", "status": "queued"})
    ev.publish(tenant, job, {"type": "status", "status": "running", "worker": "w1"})
    for i in range(0, steps, 50):
        ev.send(tenant, job, [_step(i + j) for j in range(50)], count_every_s=0)
    ev.publish(tenant, job, {"type": "progress", "steps": 1})
    ev.publish(tenant, job, {"type": "cancel_requested"})
    for i in range(steps, 2 * steps, 50):
        ev.send(tenant, job, [_step(i + j) for j in range(50)], count_every_s=0)
    ev.publish(tenant, job, {"type": "progress", "steps": 2})
    ev.publish(tenant, job, {"type": "status", "status": "succeeded"})
    return [eid for eid, e in ev.read(job, count=100_000) if e["type"] != "step" and e.get("steps") != 1]


def test_an_ended_jobs_stream_keeps_its_final_events_and_a_responses_stays_whole(
        client: redis.Redis, settings: Settings) -> None:
    """The step events go (and the progress but the last), the rest keep their ids (a client's
    Last-Event-ID still finds its place), the account follows; not before events_compact_after_s;
    a response's stream is never compacted (its replay numbers what it derives from every event)."""
    ev = JobEvents(client, settings.model_copy(update={"events_compact_after_s": 0.3}))
    job, response = "a" * 24, "b" * 24
    kept = _job(ev, "acme", job)
    _job(ev, "acme", response)
    whole = ev.read(response, count=100_000)
    before = ev.tenant_bytes("acme")
    ev.ended("acme", job, "narrative")
    ev.ended("acme", response, "response")
    assert ev.compact_due() == {"event_streams_compacted": 0}, "a watcher a little behind still reads every step"
    time.sleep(0.35)
    assert ev.compact_due() == {"event_streams_compacted": 1}
    left = ev.read(job, count=100_000)
    assert [eid for eid, _ in left] == kept
    assert [(e["type"], e.get("status"), e.get("steps")) for _, e in left] == [
        ("status", "queued", None), ("status", "running", None), ("cancel_requested", None, None),
        ("progress", None, 2), ("status", "succeeded", None)]
    assert ev.read(response, count=100_000) == whole, "a response's stream is kept whole"
    small = client.memory_usage(ev.k.events(job))
    assert small < 16 * 1024 < client.memory_usage(ev.k.events(response))
    assert ev.tenant_bytes("acme") == small + client.memory_usage(ev.k.events(response)) < before
    assert client.zcard(ev.k.events_done) == 0 and ev.compact_due() == {"event_streams_compacted": 0}


def test_a_tenant_at_its_event_quota_is_refused_and_another_is_not(client: redis.Redis, settings: Settings) -> None:
    ev = JobEvents(client, settings.model_copy(update={"tenant_max_event_bytes": 20_000}))
    ev.check_quota("acme")
    n = 0
    while ev.tenant_bytes("acme") < 20_000:
        ev.publish("acme", f"{n:024x}", {"type": "status", "status": "queued"})
        n += 1
    assert n > 2
    with pytest.raises(RateLimited, match=r"tenant 'acme': .*\(tenant_max_event_bytes 20000\)") as e:
        ev.check_quota("acme")
    assert e.value.retry_after_s >= 1
    ev.check_quota("globex")
    ev.forget("acme", [f"{i:024x}" for i in range(n)])  # its session deleted: free again
    ev.check_quota("acme")


def test_a_sessions_jobs_streams_go_in_bounded_batches(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """DELETE /v1/sessions/{id} of a session with 1200 jobs: no DEL of more than DROP_BATCH keys,
    one account script call per DROP_BATCH jobs (not one DEL of 2400 keys and 1200 calls).  On
    one server (a cluster client splits a DEL by slot anyway)."""
    plain = redis.Redis.from_url(redis_url)
    ev = JobEvents(plain, Settings(key_prefix=f"sftest-{uuid.uuid4().hex[:12]}"))
    try:
        _drop_in_batches(plain, ev, monkeypatch)
    finally:
        stale = list(plain.scan_iter(f"{ev.s.key_prefix}:*", count=1000))
        for i in range(0, len(stale), DROP_BATCH):
            plain.delete(*stale[i:i + DROP_BATCH])
        plain.close()


def _drop_in_batches(plain: redis.Redis, ev: JobEvents, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [f"{i:024x}" for i in range(1200)]
    with plain.pipeline(transaction=False) as p:
        for j in jobs:
            p.xadd(ev.k.events(j), {"data": '{"type": "status", "status": "succeeded"}'})
            p.set(ev.k.cancel(j), 1)
            p.hset(ev.k.event_bytes("acme"), j, 100)
            p.zadd(ev.k.events_due, {f'["acme", "{j}"]': 1})
        p.hset(ev.k.event_bytes("acme"), "*", 100 * len(jobs))
        p.execute()
    calls: list[tuple[str, int]] = []
    real = plain.execute_command

    def counted(*args: object, **kw: object) -> object:
        calls.append((str(args[0]).upper(), len(args) - 1))
        return real(*args, **kw)

    monkeypatch.setattr(plain, "execute_command", counted)
    ev.drop("acme", jobs)
    monkeypatch.undo()
    dels = [n for c, n in calls if c == "DEL"]
    scripts = [n for c, n in calls if c == "EVALSHA"]
    assert dels and max(dels) <= DROP_BATCH and len(dels) == 2 * len(jobs) // DROP_BATCH + 1
    assert len(scripts) == -(-len(jobs) // DROP_BATCH)
    assert ev.tenant_bytes("acme") == 0 and plain.zcard(ev.k.events_due) == 0
    assert not any(plain.exists(ev.k.events(j), ev.k.cancel(j)) for j in jobs[::97])


def test_many_new_streams_are_written_and_counted_as_one_at_a_time(client: redis.Redis, settings: Settings) -> None:
    """publish_many (a schedule pass's queued events): each stream as publish() writes it, the
    tenant's account the same bytes, each stream due for the sweep; on a cluster too."""
    one = JobEvents(client, settings)
    many = JobEvents(client, settings.model_copy(update={"key_prefix": settings.key_prefix + "-many"}))
    jobs = [f"{i:024x}" for i in range(7)]
    event = {"type": "status", "status": "queued", "seq": 1}
    for job in jobs:
        one.publish("acme", job, event)
    many.publish_many("acme", [(job, event) for job in jobs])
    for ev in (one, many):  # the same accounts (of keys named otherwise: their own sizes)
        assert ev.tenant_bytes("acme") == sum(client.memory_usage(ev.k.events(job)) for job in jobs) > 0
    for job in jobs:
        assert [e for _, e in many.read(job)] == [event]
        assert client.ttl(many.k.events(job)) > 0
    due = {m for m, _ in client.zrange(many.k.events_due, 0, -1, withscores=True)}
    assert due == {json.dumps(["acme", job]).encode() for job in jobs}
    for ev in (one, many):
        for key in client.scan_iter(f"{ev.s.key_prefix}:*"):
            client.delete(key)


def test_a_job_that_never_ran_leaves_its_stream_soon_not_in_a_day(client: redis.Redis, settings: Settings) -> None:
    """Cancelled while queued: its stream holds status events only (its end is in SQL), so it
    expires events_compact_after_s on, and the sweep then takes it out of the account."""
    ev = JobEvents(client, settings.model_copy(update={"events_compact_after_s": 1.0}))
    job = "e" * 24
    ev.publish("acme", job, {"type": "status", "status": "queued"})
    ev.publish("acme", job, {"type": "status", "status": "cancelled"})
    assert client.ttl(ev.k.events(job)) > 3600
    ev.never_ran("acme", job, "narrative")
    assert 0 < client.ttl(ev.k.events(job)) <= 1
    end = time.monotonic() + 30
    while client.exists(ev.k.events(job)):  # a state, not a moment
        assert time.monotonic() < end
        time.sleep(0.1)
    deadline = time.monotonic() + 30
    while ev.sweep() == {"event_streams_gone": 0}:
        assert time.monotonic() < deadline, "never due"
        time.sleep(0.2)
    assert ev.tenant_bytes("acme") == 0
    kept = "f" * 24  # a response's stream is kept whole (replayed from its start)
    ev.publish("acme", kept, {"type": "status", "status": "cancelled"})
    ev.never_ran("acme", kept, "response")
    assert client.ttl(ev.k.events(kept)) > 3600


def test_a_follower_reads_the_stream_then_ends_with_the_row_that_has_ended(
        client: redis.Redis, settings: Settings, any_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """follow(): each event, the row at a terminal status event, and the end once the row has
    ended; an ended job whose last event was lost ends from its row (SQL is the truth)."""
    monkeypatch.setattr(events, "CHECK_S", 0.2)
    ev = JobEvents(client, settings)
    said, lost = "c" * 24, "d" * 24
    for job in (said, lost):
        ev.publish("acme", job, {"type": "status", "status": "queued"})
        ev.send("acme", job, [_step(0)])
    ev.publish("acme", said, {"type": "status", "status": "succeeded"})
    rows = {said: ["succeeded"], lost: ["running", "succeeded"]}  # each read of the row says the next status

    async def row(job: str) -> JobRecord:
        return JobRecord(id=job, status=rows[job].pop(0) if len(rows[job]) > 1 else rows[job][0])

    async def follow(job: str) -> list[events.Followed]:
        r = async_from_url(any_url, isinstance(client, redis.RedisCluster))
        try:
            return [x async for x in ev.follow(r, job, lambda: row(job))]
        finally:
            await r.aclose()

    for job, said_events, reads in ((said, ["queued", "step", "succeeded"], ["succeeded"]),
                                    (lost, ["queued", "step"], ["running", "succeeded"])):
        got = asyncio.run(follow(job))
        assert [x[1].get("status", x[1]["type"]) for x in got if isinstance(x, tuple)] == said_events
        assert [x.status for x in got if isinstance(x, JobRecord)] == reads
        assert isinstance(got[-1], JobRecord)
