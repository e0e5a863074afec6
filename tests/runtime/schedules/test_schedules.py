"""runtime/schedules/{cron,templates,crud,ticker,claims}.py: a cron's runs in its time zone across DST
changes; a dataset's rows as payloads; the ticker on a real database (SQLite file; PostgreSQL
where one answers) and a real Redis, its time a fake clock: each tick submits its job set once
(also with two leaders, or a claim left by a dead one), missed ticks skip or catch up, pause and
resume, one leader and its failover, and report.ready on a scheduled job's success.  Three
processes racing: test_schedules_race.py."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from sqlalchemy import Engine, select

from runtime.errors import BadInput, NotFound, OverBudget, RateLimited
from runtime.jobs.datasets import Datasets
from runtime.jobs.dispatch import Dispatcher
from runtime.jobs.rows import Jobs
from runtime.schedules import cron, templates
from runtime.schedules.crud import Schedules
from runtime.schedules.templates import DataSource
from runtime.schedules.ticker import MIN_PAUSE_S, RETRY_S, Ticker
from runtime.settings import Settings
from runtime.tables import JobRecord, ScheduleRecord, TickRecord, WebhookMessageRecord
from runtime.webhooks.endpoints import Endpoints
from tests.runtime.schedules.schedule_data import BERLIN, NARRATIVE, PAYLOAD, REGIONS, T0, local, rows

# ---- cron in a time zone ------------------------------------------------------------------------


def test_runs_in_the_time_zone_and_across_both_dst_changes() -> None:
    assert [local(t) for t in cron.runs("0 7 * * 1", BERLIN, T0, 3)] == [
        "2026-03-02T07:00:00+01:00", "2026-03-09T07:00:00+01:00", "2026-03-16T07:00:00+01:00"]
    spring = datetime(2026, 3, 27, 12, tzinfo=ZoneInfo(BERLIN)).timestamp()  # 02:00 -> 03:00 on the 29th
    assert [local(t) for t in cron.runs("30 2 * * *", BERLIN, spring, 3)] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]  # once, after the gap
    assert [local(t) for t in cron.runs("0 7 * * *", BERLIN, spring, 3)] == [
        "2026-03-28T07:00:00+01:00", "2026-03-29T07:00:00+02:00", "2026-03-30T07:00:00+02:00"]  # 07:00 local, 23 h apart
    autumn = datetime(2026, 10, 24, 12, tzinfo=ZoneInfo(BERLIN)).timestamp()  # 03:00 -> 02:00 on the 25th
    daily = cron.runs("30 2 * * *", BERLIN, autumn, 3)
    assert [local(t) for t in daily] == [  # 02:30 happens twice that night: a daily run comes once
        "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00", "2026-10-27T02:30:00+01:00"]
    assert cron.before("30 2 * * *", BERLIN, daily[2], 2) == daily[1::-1]
    night = datetime(2026, 10, 25, 0, 30, tzinfo=ZoneInfo(BERLIN)).timestamp()
    hourly = cron.runs("0 * * * *", BERLIN, night, 4)
    assert [local(t) for t in hourly] == [  # an hourly one at both 02:00s: each is a real hour
        "2026-10-25T01:00:00+02:00", "2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00",
        "2026-10-25T03:00:00+01:00"]
    assert [b - a for a, b in zip(hourly, hourly[1:])] == [3600.0] * 3
    assert cron.runs("0 7 * * 1", "UTC", T0, 1) == [datetime(2026, 3, 2, 7, tzinfo=ZoneInfo("UTC")).timestamp()]


@pytest.mark.parametrize("expr,why", [
    ("", "1..128"), ("* * *", "five fields"), ("61 * * * *", "bad cron"), ("0 0 31 2 *", "bad cron"),
    ("* * * * * *", "five fields"), ("@reboot", "five fields"), ("H 7 * * *", "no H"), ("0 7 * * 1,R", "no H"),
    ("0 25 * * *", "bad cron"), ("*/0 * * * *", "bad cron")])
def test_a_bad_cron_is_refused_naming_why(expr: str, why: str) -> None:
    with pytest.raises(BadInput, match=why):
        cron.check(expr, "UTC")


def test_time_zones_are_iana_names() -> None:
    assert cron.check(" 0  7 * * MON ", BERLIN) == "0 7 * * MON"
    assert cron.check("* * * * * *", "UTC", seconds=True) == "* * * * * *"
    for bad in ("", "Europe/berlin", "../etc/passwd", "localtime", "CET+1"):
        with pytest.raises(BadInput, match="time zone"):
            cron.zone(bad)


# ---- a dataset's rows as payloads ----------------------------------------------------------------


def test_a_dataset_makes_one_payload_per_region_or_one_of_a_region() -> None:
    def read(name: str) -> list[list[str]]:
        if name != "sales":
            raise NotFound(f"no dataset {name!r}")
        return rows()

    per = {"kind": "narrative", "spec": NARRATIVE, "data": {"dataset": "sales", "per": "region"}}
    jobs, problems = templates.specs(per, "acme", read)
    assert problems == [] and [g for g, _ in jobs] == ["AMER", "APAC", "EMEA"]
    assert jobs[2][1] == {**NARRATIVE, "payload": {"tenant": "EMEA", "period": "2026-Q3", "style": "formal", "metrics": [
        {"key": "revenue", "value": "512", "prev": "468"}, {"key": "churn", "value": "2.4", "prev": "2.6"}]}}
    one = {"kind": "report", "spec": {"title": "Review", "outline": [{"title": "Revenue", "metrics": ["revenue"]}]},
           "data": {"dataset": "sales", "region": "APAC", "tenant": "Northwind"}}
    [(group, spec)], _ = templates.specs(one, "acme", read)
    assert group == "" and spec["data"]["tenant"] == "Northwind" and spec["data"]["metrics"][0]["value"] == "301"
    with pytest.raises(BadInput, match="3 regions"):
        templates.specs({**per, "data": {"dataset": "sales"}}, "acme", read)
    with pytest.raises(NotFound):
        templates.specs({**per, "data": {"dataset": "gone", "per": "region"}}, "acme", read)
    with pytest.raises(BadInput, match="leave it out"):
        templates.specs({**per, "spec": {"payload": PAYLOAD}}, "acme", read)
    # a custom metric needs its unit; a section naming a metric the rows lack fails that group only
    custom = rows() + [["trials", "EMEA", "2026-Q2", "40"], ["trials", "EMEA", "2026-Q3", "52"]]
    jobs, problems = templates.specs(per, "acme", lambda _: custom)
    assert [g for g, _ in jobs] == ["AMER", "APAC"] and "'trials' is not built in" in problems[0]
    jobs, problems = templates.specs({**per, "data": {**per["data"], "units": {"trials": "users"}}}, "acme",  # type: ignore[dict-item]
                                     lambda _: custom)
    assert problems == [] and jobs[2][1]["payload"]["metrics"][2] == {"name": "trials", "unit": "users", "value": "52",
                                                                        "prev": "40"}
    assert templates.job_id("sch_x", 60.0, "EMEA") == templates.job_id("sch_x", 60.0, "EMEA") != \
        templates.job_id("sch_x", 60.0, "APAC")


class Counted(list[list[str]]):
    """A dataset's rows that count the passes made over them."""

    passes = 0

    def __iter__(self) -> Iterator[list[str]]:
        self.passes += 1
        return super().__iter__()


def regions(n: int) -> list[list[str]]:
    """A dataset of n regions (revenue in two quarters each): 2n rows."""
    return [["revenue", f"R{i:04d}", p, v] for i in range(n) for p, v in (("2026-Q2", "1"), ("2026-Q3", "2"))]


def test_a_template_is_counted_before_any_job_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    # issue #48: `per: region` over 5000 regions built 5000 payloads (its rows scanned once per
    # region) before the cap refused it: 17.6 s a POST, 5-7.7 s a tick
    built: list[str] = []
    payload = templates.payload

    def counted(rows: list[list[str]], source: DataSource, tenant: str) -> dict[str, Any]:
        built.append(tenant)
        return payload(rows, source, tenant)

    monkeypatch.setattr(templates, "payload", counted)
    big = Counted(regions(5000))
    with pytest.raises(BadInput, match="5000 regions, at most 50 jobs a tick"):
        templates.check("narrative", NARRATIVE, DataSource(dataset="sales", per="region"), "acme", lambda _: big)
    assert built == [] and big.passes == 1  # refused before any payload, its rows read once
    per = {"kind": "narrative", "spec": NARRATIVE, "data": {"dataset": "sales", "per": "region"}}
    jobs, problems = templates.plan("sch_x", T0, per, "acme", lambda _: big)  # a tick: the first MAX_JOBS only
    assert [p.group for p in jobs] == built == [f"R{i:04d}" for i in range(templates.MAX_JOBS)]
    assert problems == ["sales: 5000 regions, at most 50 jobs a tick (the first 50 go)"] and big.passes == 2
    exactly = Counted(regions(templates.MAX_JOBS))
    assert templates.check("narrative", NARRATIVE, DataSource(dataset="sales", per="region"), "acme", lambda _: exactly)


# ---- the ticker in one process, on a fake clock ---------------------------------------------------


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def env(db_engine: Engine, client: redis.Redis, settings: Settings) -> Iterator[Env]:
    yield Env(db_engine, client, settings.model_copy(update={"schedule_lock_s": 0.5}))


class Env:
    """A database, a Redis, a clock at T0, the tenant's dataset `sales`, and tickers."""

    def __init__(self, engine: Engine, client: redis.Redis, settings: Settings) -> None:
        self.engine, self.r, self.s = engine, client, settings
        self.clock = Clock(T0)
        self.jobs = Jobs(engine, settings)
        self.schedules = Schedules(engine, settings, self.clock)
        self.tickers: dict[str, Ticker] = {}
        Datasets(engine).put("acme", "sales", rows())

    def ticker(self, name: str = "t") -> Ticker:
        """The ticker `name` (the same one each time: it holds the lock it took)."""
        if name not in self.tickers:
            self.tickers[name] = Ticker(Dispatcher(self.r, self.jobs, lambda *_: None), self.clock, name=name)
        return self.tickers[name]

    def create(self, cron_expr: str = "0 7 * * *", per: bool = True, **kw: Any) -> ScheduleRecord:
        data = DataSource(dataset="sales", per="region") if per else None
        return self.schedules.create("acme", cron_expr=cron_expr, timezone=BERLIN, kind="narrative",
                                     spec=NARRATIVE if per else {"payload": PAYLOAD}, data=data, **kw)

    def jobs_of(self, sch: str) -> Counter[tuple[float, str]]:
        """(tick, its payload's tenant) -> jobs."""
        with self.engine.connect() as c:
            return Counter((t, spec["payload"]["tenant"]) for t, spec in c.execute(
                select(JobRecord.tick_at, JobRecord.spec).where(JobRecord.schedule_id == sch)))

    def ticks(self, sch: str) -> list[tuple[float, str]]:
        with self.engine.connect() as c:
            return [(t, st) for t, st in c.execute(select(TickRecord.tick_at, TickRecord.status)
                                                   .where(TickRecord.schedule_id == sch).order_by(TickRecord.tick_at))]


def day(n: int) -> float:
    return datetime(2026, 3, 2 + n, 7, tzinfo=ZoneInfo(BERLIN)).timestamp()


def test_each_tick_submits_its_job_set_once_with_its_schedule_and_tick(env: Env) -> None:
    sch = env.create()
    assert sch.next_at == day(0)
    ticker = env.ticker()
    assert ticker.step() == {"pruned": 0}  # nothing due at 06:00
    env.clock.t = day(0) + 0.5
    assert ticker.step()["submitted"] == 1
    assert ticker.step().get("submitted", 0) == 0  # the same moment again: nothing more
    env.clock.t = day(1) + 2
    assert ticker.step()["submitted"] == 1
    assert env.jobs_of(sch.id) == Counter({(day(d), r): 1 for d in (0, 1) for r in REGIONS})
    assert env.ticks(sch.id) == [(day(0), "submitted"), (day(1), "submitted")]
    job = env.jobs.listing("acme", limit=1)[0]
    assert (job.kind, job.priority, job.schedule_id, job.status) == ("narrative", "batch", sch.id, "queued")
    assert job.session_id is not None  # each on a session of its own
    with env.engine.connect() as c:
        tick = c.execute(select(TickRecord).where(TickRecord.tick_at == day(1))).one()
        assert sorted(tick.jobs) == sorted(templates.job_id(sch.id, day(1), r) for r in REGIONS)
        assert tick.late_s == 2.0 and tick.error == ""
        assert c.scalar(select(ScheduleRecord.next_at).where(ScheduleRecord.id == sch.id)) == day(2)


def test_two_leaders_at_once_submit_each_tick_once(env: Env) -> None:
    schs = [env.create() for _ in range(3)] + [env.create(per=False)]
    a, b = env.ticker("a"), env.ticker("b")
    b.lead = lambda: True  # type: ignore[method-assign]  # a split brain: b thinks it leads too
    env.clock.t = day(0)
    stale = b._due(env.clock.t, (-1.0, ""))  # b read the due schedules before a moved them on
    assert a.step()["submitted"] == 4
    assert b.fire(stale, env.clock.t)["taken"] == 4  # every tick claimed already
    assert b.step().get("submitted", 0) == 0
    for sch in schs[:3]:
        assert env.jobs_of(sch.id) == Counter({(day(0), r): 1 for r in REGIONS})
    assert env.jobs_of(schs[3].id) == Counter({(day(0), "Northwind"): 1})


class Killed(BaseException):
    """A process killed mid-tick (no `except Exception` catches it)."""


@pytest.mark.parametrize("where", ["after its batch", "one at a time"])
def test_a_claim_left_by_a_ticker_that_died_mid_tick_is_completed_once(env: Env, where: str) -> None:
    """Killed once its tick's jobs are written as a batch, before it records the tick; or, its
    batch refused as a whole (the tenant's rate, say), while it submits them one at a time."""
    sch = env.create()
    dying = env.ticker("dying")
    submit, submit_batch, calls = dying.d.submit, dying.d.submit_batch, []

    def die_at_the_second(*a: Any, **k: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise Killed()
        return submit(*a, **k)

    def die_after(*a: Any, **k: Any) -> Any:
        submit_batch(*a, **k)
        raise Killed()

    def refused(*a: Any, **k: Any) -> Any:
        raise RateLimited("over its rate", retry_after_s=0.0)

    dying.d.submit = die_at_the_second  # type: ignore[method-assign]
    dying.d.submit_batch = die_after if where == "after its batch" else refused  # type: ignore[method-assign]
    env.clock.t = day(0)
    with pytest.raises(Killed):
        dying.step()
    written = len(REGIONS) if where == "after its batch" else 1
    assert env.ticks(sch.id) == [(day(0), "claimed")] and sum(env.jobs_of(sch.id).values()) == written
    heir = env.ticker("heir")
    heir.lead = lambda: True  # type: ignore[method-assign]  # the dead one's lock would expire first
    assert heir.step().get("submitted", 0) == 0  # a fresh claim: maybe its claimer is still at it
    env.clock.t = day(0) + RETRY_S + 1
    assert heir.step()["submitted"] == 1
    assert heir.step().get("submitted", 0) == 0
    assert env.jobs_of(sch.id) == Counter({(day(0), r): 1 for r in REGIONS})
    assert env.ticks(sch.id) == [(day(0), "submitted")]


def test_missed_ticks_are_skipped_or_the_latest_caught_up(env: Env) -> None:
    skip, catch = env.create(), env.create(per=False, missed="catch_up", max_catch_up=2)
    env.clock.t = day(5) + 30  # down for five days; back 30 s after the sixth tick
    assert env.ticker().step()["skipped"] == 1
    assert [t for t, _ in env.ticks(skip.id)] == [day(5)]  # the missed ones recorded nowhere
    assert [t for t, _ in env.ticks(catch.id)] == [day(3), day(4), day(5)]  # the latest 2 missed, then the one due
    env.clock.t = day(6) + env.s.schedule_grace_s + 1  # found later than the grace: missed
    assert env.ticker().step()["skipped"] == 1
    assert [t for t, _ in env.ticks(skip.id)] == [day(5)]
    assert [t for t, _ in env.ticks(catch.id)][-1] == day(6)


def test_paused_it_ticks_not_and_resumed_from_its_next_run(env: Env) -> None:
    sch = env.create()
    env.schedules.pause("acme", sch.id)
    env.clock.t = day(2)
    ticker = env.ticker()
    assert ticker.step().get("submitted", 0) == 0
    env.clock.t = day(2) + 3600
    assert env.schedules.resume("acme", sch.id).next_at == day(3)
    env.clock.t = day(3)
    assert ticker.step()["submitted"] == 1
    assert [t for t, _ in env.ticks(sch.id)] == [day(3)]
    with pytest.raises(NotFound):
        env.schedules.pause("globex", sch.id)
    env.schedules.delete("acme", sch.id)
    assert env.ticks(sch.id) == [] and sum(env.jobs_of(sch.id).values()) == 3  # its jobs stay


def test_a_tick_whose_rows_no_longer_fit_fails_with_its_reason(env: Env) -> None:
    sch = env.create()
    Datasets(env.engine).put("acme", "sales", rows({"EMEA": ("1", "2")}) + [["trials", "APAC", "2026-Q2", "1"],
                                                                              ["trials", "APAC", "2026-Q3", "2"]])
    env.clock.t = day(0)
    assert env.ticker().step()["submitted"] == 1
    with env.engine.connect() as c:
        tick = c.execute(select(TickRecord)).one()
    assert len(tick.jobs) == 1 and "region 'APAC'" in tick.error and "trials" in tick.error
    Datasets(env.engine).delete("acme", "sales")
    env.clock.t = day(1)
    assert env.ticker().step()["failed"] == 1
    assert env.ticks(sch.id)[-1] == (day(1), "failed")


def test_a_refused_submission_leaves_the_tick_pending_and_completes_it_later(env: Env) -> None:
    env.s = env.s.model_copy(update={"tenant_burst": 2, "tenant_rate_per_s": 0.001})
    env.jobs = Jobs(env.engine, env.s)
    sch = env.create()
    env.clock.t = day(0)
    ticker = env.ticker()
    assert ticker.step()["pending"] == 1  # two of its three jobs: the tenant's bucket is empty
    assert env.ticks(sch.id) == [(day(0), "claimed")] and sum(env.jobs_of(sch.id).values()) == 2
    env.r.delete(f"{env.s.key_prefix}:rl:acme")  # the bucket refilled
    env.clock.t = day(0) + RETRY_S + 1
    assert ticker.step()["submitted"] == 1
    assert env.jobs_of(sch.id) == Counter({(day(0), r): 1 for r in REGIONS})


def test_a_tenant_past_its_share_of_a_pass_is_carried_to_the_next_without_delaying_others(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue #48: one tenant's per-region schedules cost 5-7.7 s a tick, and other tenants' ticks
    # came late and were dropped.  Here each of acme's ticks costs 0.3 s of the ticker's timer
    # (past SHARE_S at once), globex's none: one of acme's a pass, globex's in the first
    acme = [env.create() for _ in range(3)]
    globex = env.schedules.create("globex", cron_expr="0 7 * * *", timezone=BERLIN, kind="narrative",
                                  spec={"payload": PAYLOAD})
    timer, specs = Clock(0.0), templates.specs

    def costly(template: dict[str, Any], tenant: str, read: Any, strict: bool = False) -> Any:
        timer.t += 0.3 if tenant == "acme" else 0.0
        return specs(template, tenant, read, strict)

    monkeypatch.setattr(templates, "specs", costly)
    ticker = Ticker(Dispatcher(env.r, env.jobs, lambda *_: None), env.clock, name="t", timer=timer)
    env.clock.t = day(0) + 1
    assert +Counter(ticker.step()) == {"submitted": 2, "carried": 2}  # acme's first, and globex's
    assert env.ticks(globex.id) == [(day(0), "submitted")]
    assert sorted(len(env.ticks(s.id)) for s in acme) == [0, 0, 1]
    assert ticker.lead() and ticker.pause() == MIN_PAUSE_S  # the carried ones are due: the next pass comes at once
    env.clock.t = day(0) + 2
    assert +Counter(ticker.step()) == {"submitted": 1, "carried": 1}
    assert +Counter(ticker.step()) == {"submitted": 1}
    for s in acme:  # each tick submitted once, late but none dropped
        assert env.ticks(s.id) == [(day(0), "submitted")] and env.jobs_of(s.id) == Counter({(day(0), r): 1 for r in REGIONS})
    assert +Counter(ticker.step()) == {}  # nothing due: nothing carried


def test_a_schedules_ticks_due_together_build_its_template_once(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue #48: a pass built a schedule's template anew for each of its ticks (up to MAX_TICKS
    # and MAX_CATCH_UP of them), its dataset read each time
    sch = env.create(missed="catch_up", max_catch_up=5)
    built: list[str] = []
    payload = templates.payload

    def counted(rows: list[list[str]], source: DataSource, tenant: str) -> dict[str, Any]:
        built.append(tenant)
        return payload(rows, source, tenant)

    monkeypatch.setattr(templates, "payload", counted)
    env.clock.t = day(5) + 30  # five ticks missed, caught up, and the one due
    assert env.ticker().step()["submitted"] == 6
    assert sorted(built) == sorted(REGIONS)  # once for the six ticks
    assert env.jobs_of(sch.id) == Counter({(day(n), r): 1 for n in range(6) for r in REGIONS})


def test_create_refuses_a_bad_schedule_and_writes_nothing(env: Env) -> None:
    bad: list[dict[str, Any]] = [
        {"cron_expr": "0 7 * *"}, {"timezone": "Mars/Olympus"}, {"spec": {"payload": PAYLOAD, "bogus": 1}},
        {"data": DataSource(dataset="nothing", per="region")}, {"data": DataSource(dataset="sales")},
        {"missed": "later"}, {"max_catch_up": 1000}, {"kind": "agent"}]
    for kw in bad:
        args: dict[str, Any] = {"cron_expr": "0 7 * * *", "timezone": BERLIN, "kind": "narrative", "spec": NARRATIVE,
                                "data": DataSource(dataset="sales", per="region"), **kw}
        with pytest.raises(BadInput):
            env.schedules.create("acme", **args)
    assert env.schedules.listing("acme") == []
    small = Schedules(env.engine, env.s.model_copy(update={"tenant_max_schedules": 1}), env.clock)
    small.create("acme", cron_expr="@daily", timezone="UTC", kind="narrative", spec={"payload": PAYLOAD})
    with pytest.raises(OverBudget):
        small.create("acme", cron_expr="@daily", timezone="UTC", kind="narrative", spec={"payload": PAYLOAD})
    assert len(small.listing("acme")) == 1 and small.listing("globex") == []


# ---- the leader ------------------------------------------------------------------------------------


def test_one_leader_and_another_takes_over_within_the_lock_when_it_dies(env: Env) -> None:
    a, b = env.ticker("a"), env.ticker("b")
    assert a.lead() and not b.lead() and a.lead()  # a renews its own lock
    assert b.step() == {}
    time.sleep(env.s.schedule_lock_s + 0.1)  # a died: it renews no more
    assert b.lead() and not a.lead()
    b.release()
    assert a.lead()


def test_the_leader_wakes_when_its_next_tick_is_due_the_others_every_interval(env: Env) -> None:
    # a lock that outlives the test: the leader counts as one while its renewal is fresh (a third
    # of the lock, real time), and at the fixture's 0.5 s a loaded machine outran that between
    # the step and the pause (CI-like run, 2026-12-07)
    env.s = env.jobs.s = env.s.model_copy(update={"schedule_lock_s": 60.0})
    env.create()
    leader, other = env.ticker("a"), env.ticker("b")
    every = env.s.schedule_interval_s
    assert leader.pause() == every  # not the leader yet
    leader.step()
    env.clock.t = day(0) - 0.25
    assert leader.pause() == pytest.approx(0.25) and other.pause() == every
    env.clock.t = day(0) + 5
    assert leader.pause() == MIN_PAUSE_S


def test_run_ticks_on_its_thread_with_the_real_clock_and_lets_go_of_the_lock(env: Env) -> None:
    s = env.s.model_copy(update={"schedule_interval_s": 0.05})
    sch = Schedules(env.engine, s).create("acme", cron_expr="* * * * * *", timezone="UTC", kind="narrative",
                                          spec={"payload": PAYLOAD}, seconds=True)
    ticker = Ticker(Dispatcher(env.r, Jobs(env.engine, s), lambda *_: None))  # what a worker's thread runs
    stop = threading.Event()
    thread = threading.Thread(target=ticker.run, args=(stop,), name="setflow-schedules", daemon=True)
    thread.start()
    deadline = time.time() + 10
    while len(env.ticks(sch.id)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and env.r.get(ticker.key) is None
    ticks = env.ticks(sch.id)
    assert len(ticks) >= 2 and {st for _, st in ticks} == {"submitted"}
    assert all(n == 1 for n in env.jobs_of(sch.id).values())


# ---- delivery ------------------------------------------------------------------------------------------


def test_a_scheduled_job_that_succeeds_sends_report_ready_with_its_links(env: Env) -> None:
    every = Endpoints(env.engine).create("acme", "https://example.com/all")
    ready = Endpoints(env.engine).create("acme", "https://example.com/ready", ["report.ready"])
    sch = env.create(per=False)
    env.clock.t = day(0)
    env.ticker().step()
    job = env.jobs.listing("acme", limit=1)[0]
    owner = env.jobs.claim(job.id, "w1").owner
    assert owner is not None
    env.jobs.finish(job.id, owner, "succeeded", result={"text": "..."})
    with env.engine.connect() as c:
        sent = {(e, t): body for e, t, body in c.execute(select(WebhookMessageRecord.endpoint_id, WebhookMessageRecord.type,
                                                                 WebhookMessageRecord.payload))}
    assert set(sent) == {(every.id, "job.succeeded"), (every.id, "report.ready"), (ready.id, "report.ready")}
    body = sent[(ready.id, "report.ready")]
    assert body["data"] == {"id": job.id, "kind": "narrative", "schedule": sch.id, "tick": "2026-03-02T06:00:00Z",
                            "links": {"job": f"/v1/jobs/{job.id}", "json": f"/v1/jobs/{job.id}/report.json",
                                      "md": f"/v1/jobs/{job.id}/report.md", "html": f"/v1/jobs/{job.id}/report.html",
                                      "pdf": f"/v1/jobs/{job.id}/report.pdf"}}
    failed, _ = env.jobs.create("narrative", "acme", {"payload": PAYLOAD}, open_session=True, tick=(sch.id, day(9)))
    owner = env.jobs.claim(failed.id, "w1").owner
    assert owner is not None
    env.jobs.finish(failed.id, owner, "failed", error={"code": "x", "message": "y"})
    with env.engine.connect() as c:  # a failure says job.failed only
        assert sorted(c.scalars(select(WebhookMessageRecord.type))) == ["job.failed", "job.succeeded", "report.ready",
                                                                        "report.ready"]
