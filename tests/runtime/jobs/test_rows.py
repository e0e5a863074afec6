"""runtime/jobs/rows.py on a real database (SQLite file; PostgreSQL where one answers): claims are
exclusive and fenced, a session's jobs run in submission order, expired claims are requeued,
and a job whose worker keeps dying gives up."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, func, select, update

from runtime.errors import BadInput, ClaimLost, Duplicate, NotFound, OverBudget, RateLimited
from runtime.jobs.rows import Jobs
from runtime.sessions.records import JobStep, Records
from runtime.settings import Settings
from runtime.tables import JobRecord, SessionRecord, TenantUsageRecord

SPEC = {"text": "hello"}


@pytest.fixture
def jobs(db_engine: Engine) -> Jobs:
    return Jobs(db_engine, Settings(job_lease_s=60, job_max_attempts=2))


@pytest.fixture
def session(db_engine: Engine) -> str:
    return Records(db_engine).create_session("acme", "").id


def test_claim_is_exclusive_and_fenced(jobs: Jobs, session: str) -> None:
    job, _ = jobs.create("turn", "acme", SPEC, session)
    first = jobs.claim(job.id, "w1")
    second = jobs.claim(job.id, "w2")
    assert first.owner and first.reason == "claimed" and first.job.status == "running" and first.job.attempts == 1
    assert second.owner is None and second.reason == "running elsewhere"
    with pytest.raises(ClaimLost):
        jobs.step_done(job.id, "not-the-owner", 1, {})
    jobs.step_done(job.id, first.owner, 1, {"steps": 1})
    jobs.finish(job.id, first.owner, "succeeded", result={"ok": True})
    done = jobs.get(job.id, "acme")
    assert (done.status, done.step, done.result, done.owner) == ("succeeded", 1, {"ok": True}, None)
    assert jobs.claim(job.id, "w2").reason == "finished"
    with pytest.raises(ClaimLost):  # a finished job takes no more writes from its old holder
        jobs.finish(job.id, first.owner, "failed")


def test_session_jobs_run_in_submission_order(jobs: Jobs, session: str) -> None:
    a, _ = jobs.create("turn", "acme", SPEC, session)
    b, _ = jobs.create("turn", "acme", SPEC, session)
    assert (a.seq, b.seq) == (1, 2)
    assert not jobs.blocked(a) and jobs.blocked(b)
    assert jobs.claim(b.id, "w1").reason == "waiting"  # b stays queued until a is done
    assert jobs.get(b.id).status == "queued"
    claim = jobs.claim(a.id, "w1")
    assert jobs.next_queued(session) is None  # a is running: nothing to send yet
    assert claim.owner is not None
    jobs.finish(a.id, claim.owner, "failed", error={"code": "x", "message": "y"})  # any end unblocks b
    nxt = jobs.next_queued(session)
    assert nxt is not None and nxt.id == b.id and not jobs.blocked(b)


def test_cancel_queued_and_running(jobs: Jobs, session: str) -> None:
    a, _ = jobs.create("turn", "acme", SPEC, session)
    b, _ = jobs.create("turn", "acme", SPEC, session)
    claim = jobs.claim(a.id, "w1")
    assert claim.owner is not None
    cancelled, ended = jobs.cancel(b.id, "acme")
    assert cancelled.status == "cancelled" and ended
    assert jobs.cancel(b.id, "acme")[1] is False  # ended once only
    running, ended = jobs.cancel(a.id, "acme")
    assert running.status == "running" and running.cancel_requested and not ended
    assert jobs.heartbeat(a.id, claim.owner) is True  # the holder learns it at its next heartbeat
    with pytest.raises(NotFound):
        jobs.cancel(a.id, "other-tenant")


def test_expired_claim_is_requeued_then_gives_up(db_engine: Engine, session: str) -> None:
    jobs = Jobs(db_engine, Settings(job_lease_s=0.05, job_max_attempts=2))
    job, _ = jobs.create("turn", "acme", SPEC, session)
    c1 = jobs.claim(job.id, "w1")
    time.sleep(0.1)
    [expired] = jobs.expired()
    assert expired.id == job.id and jobs.requeue(expired)
    assert jobs.get(job.id).status == "queued"
    with pytest.raises(ClaimLost):  # the old holder, back from the dead, can change nothing
        jobs.heartbeat(job.id, c1.owner or "")
    c2 = jobs.claim(job.id, "w2")
    assert c2.owner and c2.job.attempts == 2
    time.sleep(0.1)
    [expired] = jobs.expired()
    assert not jobs.requeue(expired)  # attempts exhausted
    failed = jobs.get(job.id)
    assert failed.status == "failed" and failed.error and failed.error["code"] == "worker_lost"


def test_bad_input_writes_nothing(jobs: Jobs, session: str) -> None:
    with pytest.raises(BadInput):
        jobs.create("turn", "acme", SPEC, session, priority="urgent")
    with pytest.raises(NotFound):
        jobs.create("turn", "other-tenant", SPEC, session)
    with pytest.raises(NotFound):
        jobs.get("not-a-job-id")
    assert jobs.next_queued(session) is None


def test_stale_queued_jobs(jobs: Jobs, session: str) -> None:
    job, _ = jobs.create("turn", "acme", SPEC, session)
    jobs.mark_dispatched(job.id, "sf.w.dead")
    assert [j.id for j in jobs.stale(["sf.w.dead"])] == [job.id]
    assert jobs.stale([]) == []  # sent just now, to a live queue
    assert jobs.queued_queues() == ["sf.w.dead"]


def test_a_claim_never_takes_a_lease_renewed_since_it_was_read(db_engine: Engine, session: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = Jobs(db_engine, Settings(job_lease_s=0.05, job_max_attempts=2))
    job, _ = jobs.create("turn", "acme", SPEC, session)
    holder = jobs.claim(job.id, "w1")
    time.sleep(0.1)
    stale = jobs.get(job.id)  # expired, as a second delivery reads it ...
    jobs.s = Settings(job_lease_s=60, job_max_attempts=2)
    jobs.heartbeat(job.id, holder.owner or "")  # ... then the holder renews before the takeover
    monkeypatch.setattr(jobs, "get", lambda job_id, tenant=None: stale)
    assert jobs.claim(job.id, "w2").owner is None
    assert not jobs.requeue(stale)  # nor does the reaper requeue it
    jobs.s = Settings(job_lease_s=60, job_max_attempts=1)  # its one attempt is spent, as read ...
    assert jobs.claim(job.id, "w2").reason == "running elsewhere"  # ... but it is alive: no give-up
    assert not jobs.requeue(stale)
    monkeypatch.undo()
    now = jobs.get(job.id)
    assert (now.status, now.owner, now.worker) == ("running", holder.owner, "w1")


def test_a_turn_is_written_only_while_its_job_is_held(db_engine: Engine, session: str) -> None:
    jobs = Jobs(db_engine, Settings(job_lease_s=0.05))
    records = Records(db_engine)
    job, _ = jobs.create("turn", "acme", SPEC, session)
    late = jobs.claim(job.id, "w1")
    time.sleep(0.1)
    [expired] = jobs.expired()
    assert jobs.requeue(expired)  # the reaper gave the job away; its old holder decodes on ...
    jobs.cancel(job.id, "acme")  # ... and the user cancels it meanwhile
    with pytest.raises(ClaimLost):
        records.append_turn(session, "acme", "assistant", "", [1, 2], [(0, 1), (1, 2)],
                            index=0, job=JobStep(job.id, 0, late.owner or ""))
    assert records.turns(session, "acme") == []  # nothing written
    again, _ = jobs.create("turn", "acme", SPEC, session)
    holder = jobs.claim(again.id, "w2")
    records.append_turn(session, "acme", "assistant", "", [1, 2], [(0, 1), (1, 2)], index=0,
                        job=JobStep(again.id, 0, holder.owner or ""))
    assert jobs.get(again.id).step == 1  # the step counter moved with the turn, in one transaction


def test_finished_jobs_are_pruned_after_the_retention_and_the_rest_stay(db_engine: Engine, session: str) -> None:
    jobs = Jobs(db_engine, Settings(job_retention_s=60))
    done, _ = jobs.create("turn", "acme", SPEC, session)
    jobs.cancel(done.id, "acme")  # finished
    running, _ = jobs.create("turn", "acme", SPEC, session)
    assert jobs.claim(running.id, "w1").owner is not None
    queued, _ = jobs.create("turn", "acme", SPEC, session)
    assert jobs.prune() == 0, "inside the retention"
    with db_engine.begin() as db:  # it ended 61 s ago: a state, whatever the machine's pace (0.2 s and a sleep failed under load)
        db.execute(update(JobRecord).where(JobRecord.id == done.id)
                   .values(finished_at=datetime.now(UTC) - timedelta(seconds=61)))
    assert jobs.prune() == 1
    with pytest.raises(NotFound):
        jobs.get(done.id)
    assert jobs.get(running.id).status == "running" and jobs.get(queued.id).status == "queued"
    later, _ = jobs.create("turn", "acme", SPEC, session)  # the session's order goes on
    assert later.seq > queued.seq


def test_a_tenant_over_its_unfinished_jobs_cap_is_refused_and_others_are_not(db_engine: Engine, session: str) -> None:
    jobs = Jobs(db_engine, Settings(tenant_max_unfinished=2))
    first, _ = jobs.create("turn", "acme", SPEC, session)
    jobs.create("turn", "acme", SPEC, None)
    with pytest.raises(RateLimited, match="2 unfinished jobs") as e:
        jobs.create("turn", "acme", SPEC, session)
    assert e.value.code == "rate_limited" and e.value.retry_after_s > 0
    other = Records(db_engine).create_session("globex", "").id
    jobs.create("turn", "globex", SPEC, other)  # another tenant's cap is its own
    jobs.cancel(first.id, "acme")  # one ends: room for one more
    jobs.create("turn", "acme", SPEC, session)


def test_a_job_in_a_busy_shared_queue_is_stale_only_past_three_times_the_bound(db_engine: Engine, session: str) -> None:
    jobs = Jobs(db_engine, Settings(job_requeue_after_s=60))
    job, _ = jobs.create("turn", "acme", SPEC, session)
    jobs.mark_dispatched(job.id, "sf.interactive")

    def sent_ago(s: float) -> None:  # the dispatch moved back in time (a state, whatever the machine's pace)
        with db_engine.begin() as db:
            db.execute(update(JobRecord).where(JobRecord.id == job.id).values(dispatched_at=time.time() - s))

    sent_ago(90)  # past the bound, within 3 times it
    assert [j.id for j in jobs.stale([])] == [job.id]
    assert jobs.stale([], ["sf.interactive"]) == [], "it waits its turn in a backlog every worker serves"
    sent_ago(200)
    assert [j.id for j in jobs.stale([], ["sf.interactive"])] == [job.id], "lost after all: resent"


def _counts(engine: Engine, tenant: str) -> tuple[int, int, int]:
    """(jobs, sessions, sessions in its quota's account) of the tenant."""
    with engine.connect() as c:
        return (int(c.scalar(select(func.count()).select_from(JobRecord).where(JobRecord.tenant == tenant)) or 0),
                int(c.scalar(select(func.count()).select_from(SessionRecord).where(SessionRecord.tenant == tenant)) or 0),
                int(c.scalar(select(TenantUsageRecord.sessions).where(TenantUsageRecord.tenant == tenant)) or 0))


def _id(i: int) -> str:
    return f"{i:024x}"  # a job id, as the schedules' are (templates.job_id)


def test_a_batch_writes_each_job_on_a_new_session_all_or_nothing(db_engine: Engine) -> None:
    """create_batch (a schedule pass's jobs of one tenant): each job queued, the first on a
    session of its own, charged to the tenant's session quota, as create(open_session=True)
    writes one; past the unfinished-jobs cap or the session quota, or with an id taken,
    nothing is written."""
    jobs = Jobs(db_engine, Settings(tenant_max_unfinished=5, tenant_max_sessions=6))
    tick = ("sch_a", 60.0)
    jobs.create_batch("acme", [("narrative", SPEC, _id(i), tick) for i in range(3)])
    assert _counts(db_engine, "acme") == (3, 3, 3)
    for i in range(3):
        job = jobs.get(_id(i), "acme")
        assert (job.status, job.seq, job.queue, job.priority, job.schedule_id, job.tick_at) == \
            ("queued", 1, "", "batch", "sch_a", 60.0)
        assert job.session_id is not None and not jobs.blocked(job)
    with pytest.raises(RateLimited, match="3 unfinished"):  # 3 + 3 > 5
        jobs.create_batch("acme", [("narrative", SPEC, _id(10 + i), tick) for i in range(3)])
    with pytest.raises(Duplicate):
        jobs.create_batch("acme", [("narrative", SPEC, _id(10), tick), ("narrative", SPEC, _id(1), tick)])
    assert _counts(db_engine, "acme") == (3, 3, 3)
    jobs.create_batch("acme", [("narrative", SPEC, _id(10), tick), ("narrative", SPEC, _id(11), tick)])
    jobs.cancel(_id(0), "acme")
    jobs.cancel(_id(1), "acme")  # 3 unfinished: room for 2 more jobs, but not for their 2 sessions
    with pytest.raises(OverBudget, match="tenant_max_sessions"):  # 5 sessions + 2 > 6
        jobs.create_batch("acme", [("narrative", SPEC, _id(20 + i), tick) for i in range(2)])
    assert _counts(db_engine, "acme") == (5, 5, 5)
