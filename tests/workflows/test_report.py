"""workflows/report.py over a session in this process (the shipped model): every section's facts
read back, the key figures exact, progress after each section, a plan that does not fit refused
before its first turn.  And as a job, with a real Redis and a SQLite file: a report whose worker
died after its first section is run again: that section is replayed as written, the rest
decoded, and the report is the one an uninterrupted run writes (the context check at its start
does not count the job's own sections against it), and the one the in-process session writes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from app.demo import REPORT
from domain import charts, drivers
from model import shipped
from runtime.db import make_engine
from runtime.errors import BadInput
from runtime.jobs.context import JobContext, JobServices
from runtime.jobs.events import JobEvents
from runtime.jobs.routing import Routing
from runtime.jobs.rows import Jobs
from runtime.jobs.specs import ReportSpec
from runtime.sessions.engine import Engine
from runtime.sessions.local import LocalTurns
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from tests.workflows.conftest import long_report_spec, report_spec
from workflows import report
from workflows.report import report_parts, section_payload

SPEC = ReportSpec.model_validate(REPORT)


class Died(Exception):
    pass


def test_a_report_reads_back_every_section_and_fills_its_key_figures(session: Callable[[], LocalTurns]) -> None:
    turns = session()
    r = report.run(turns, SPEC)
    titles = [s.title for s in SPEC.outline]
    assert [x["title"] for x in r["sections"]] == titles
    for x in r["sections"]:
        assert x["facts_total"] > 0 and x["facts_ok"] == x["facts_total"] and x["problems"] == [], x["markdown"]
        assert x["markdown"].startswith(f"## {x['title']}\n") and x["markdown"] in r["markdown"]
    assert r["figures"]["exact"] and r["figures"]["markdown"] in r["markdown"]
    data = SPEC.data.to_payload()
    for item, x in zip(SPEC.outline, r["sections"]):  # each section's chart and drivers: of its own data
        p = section_payload(data, list(item.metrics))
        assert x["chart"] == charts.chart(p, item.title) and x["drivers"] == drivers.drivers(p)
    assert (r["detail"], r["audience"]) == ("standard", None)
    assert r["verified"] and r["attempt"] == "first" and all(x["attempt"] == "first" for x in r["sections"])
    assert r["markdown"].startswith(f"# {SPEC.title}\n") and "<h2>Key figures</h2>" in r["html"]
    assert [x["path"] for x in r["sections"]] + [r["figures"]["path"]] == ["new", "warm", "warm", "warm"]
    assert turns.progress == {"section": 4, "sections": 4, "title": "Key figures"}
    # the session holds part of the context now: a plan that fits an empty session (1705 of its
    # 2048 positions) does not fit what is left, refused at once
    used, long = turns.used(), long_report_spec(4)
    assert sum(report_parts(long, turns.tokenizer)) <= turns.cfg.max_seq_len < used + sum(report_parts(long, turns.tokenizer))
    with pytest.raises(BadInput, match="context_overflow"):
        report.run(turns, long)
    assert turns.used() == used


def test_a_report_without_a_summary_has_no_key_figures(session: Callable[[], LocalTurns]) -> None:
    spec = SPEC.model_copy(update={"summary": False, "outline": SPEC.outline[:1]})
    r = report.run(session(), spec)
    assert r["figures"] is None and "Key figures" not in r["markdown"] and len(r["sections"]) == 1


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
        return JobContext(claim, JobServices("w1", engine, tok, jobs, JobEvents(client, s), Routing(client, s)))

    spec = report_spec(6)  # its own first section must not count twice
    sid = records.create_session("acme", "").id
    job, _ = jobs.create("report", "acme", spec.model_dump(mode="json"), sid)
    first = ctx_for(job.id)
    progress_of_first = first.report

    def dies_after_section_1(**progress: Any) -> None:
        progress_of_first(**progress)
        if progress.get("section") == 1:
            raise Died  # the worker is gone: no finish, no more heartbeats

    first.report = dies_after_section_1  # type: ignore[method-assign]
    with pytest.raises(Died):
        report.run(first, spec)
    first.close()
    time.sleep(0.4)
    [expired] = jobs.expired()
    assert jobs.requeue(expired)
    second = ctx_for(job.id)
    try:
        r = report.run(second, spec)
    finally:
        second.close()
    assert [x["path"] for x in r["sections"]][0] == "done"
    assert all(x["path"] != "done" for x in r["sections"][1:]) and r["figures"]["path"] != "done"
    assert [(t.job_id, t.job_step) for t in records.turns(sid, "acme")] == [(job.id, i) for i in range(7)]

    ref_sid = records.create_session("acme", "").id
    ref_job, _ = jobs.create("report", "acme", spec.model_dump(mode="json"), ref_sid)
    third = ctx_for(ref_job.id)
    try:
        ref = report.run(third, spec)
    finally:
        third.close()
    assert r["markdown"] == ref["markdown"] and r["figures"]["exact"]
    assert report.run(LocalTurns(model, tok), spec)["markdown"] == r["markdown"]  # the in-process session's
    sql.dispose()


def test_a_report_of_six_sections_fits_the_context_and_reads_back(session: Callable[[], LocalTurns]) -> None:
    spec = report_spec(6)
    r = report.run(session(), spec)  # 839 positions planned at most, of the shipped model's 2048
    assert [x["title"] for x in r["sections"]] == [p.title for p in spec.outline] and len(r["sections"]) == 6
    assert r["verified"] and all(x["facts_ok"] == x["facts_total"] > 0 for x in r["sections"]) and r["figures"]["exact"]
