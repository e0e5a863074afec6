"""workflows/report.py as a job, with the shipped model, a real Redis and a SQLite file: a
report whose worker died after its first section is run again: that section is replayed as
written, the rest decoded, and the report is the one an uninterrupted run writes (the context
check at its start does not count the job's own sections against it)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from model import shipped
from runtime.sessions.records import Records
from runtime.db import make_engine
from app.demo import REPORT
from runtime.sessions.engine import Engine
from runtime.jobs.events import JobEvents
from runtime.jobs.context import JobContext
from runtime.jobs.rows import Jobs
from runtime.jobs.routing import Routing
from runtime.settings import Settings
from runtime.sessions.store import SessionStore
from workflows.report import job as report_job


class Died(Exception):
    pass


def test_a_report_rerun_after_its_first_section_replays_it_and_writes_the_same_report(
        client: redis.Redis, settings: Settings, tmp_path: Path) -> None:
    model, tok = shipped.load()
    s = settings.model_copy(update={"data_dir": tmp_path, "job_lease_s": 0.3})
    sql = make_engine(s)
    records, jobs = Records(sql), Jobs(sql, s)
    engine = Engine(model, SessionStore(client, s), records, s)

    def ctx_for(job_id: str) -> JobContext:
        claim = jobs.claim(job_id, "w1")
        assert claim.owner is not None, claim.reason
        return JobContext(claim.job, claim.owner, "w1", engine, tok, jobs, JobEvents(client, s), Routing(client, s))

    sid = records.create_session("acme", "").id
    job, _ = jobs.create("report", "acme", REPORT, sid)
    first = ctx_for(job.id)
    report = first.report

    def dies_after_section_1(**progress: Any) -> None:
        report(**progress)
        if progress.get("section") == 1:
            raise Died  # the worker is gone: no finish, no more heartbeats

    first.report = dies_after_section_1  # type: ignore[method-assign]
    with pytest.raises(Died):
        report_job(first, REPORT)
    first.close()
    time.sleep(0.4)
    [expired] = jobs.expired()
    assert jobs.requeue(expired)
    second = ctx_for(job.id)
    try:
        r = report_job(second, REPORT)  # 1006 of 1024 positions: its own first section must not count twice
    finally:
        second.close()
    assert [x["path"] for x in r["sections"]][0] == "done"
    assert all(x["path"] != "done" for x in r["sections"][1:]) and r["figures"]["path"] != "done"
    assert [(t.job_id, t.job_step) for t in records.turns(sid, "acme")] == [(job.id, i) for i in range(4)]

    ref_sid = records.create_session("acme", "").id
    ref_job, _ = jobs.create("report", "acme", REPORT, ref_sid)
    third = ctx_for(ref_job.id)
    try:
        ref = report_job(third, REPORT)
    finally:
        third.close()
    assert r["markdown"] == ref["markdown"] and r["figures"]["exact"]
    sql.dispose()
