"""runtime/jobs/context.py with the shipped model, a real Redis and a SQLite file: a job that
dies after committing a step and is run again replays that step as written (no second turn),
then decodes the rest; the tokens are those of an uninterrupted run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from model import shipped
from model.params import DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.sessions.records import Records
from runtime.db import make_engine
from runtime.sessions.engine import Engine
from runtime.jobs.events import JobEvents
from runtime.jobs.context import JobContext
from runtime.jobs.rows import Jobs
from runtime.jobs.routing import Routing
from runtime.settings import Settings
from runtime.sessions.store import SessionStore

PARAMS = DecodeParams(policy="prefix", window=8, tau=0.99, max_new_tokens=24)


@pytest.fixture(scope="module")
def loaded() -> tuple[SetDLM, Tokenizer]:
    return shipped.load()


def test_a_rerun_job_replays_committed_steps_and_writes_each_turn_once(
        loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, settings: Settings, tmp_path: Path) -> None:
    model, tok = loaded
    s = settings.model_copy(update={"data_dir": tmp_path, "job_lease_s": 0.3})
    sql = make_engine(s)
    records, jobs = Records(sql), Jobs(sql, s)
    engine = Engine(model, SessionStore(client, s), records, s)
    inputs = [tok.encode("company: Globex\nperiod: 2026-Q3\n"), tok.encode("\nnarrative: ")]

    def ctx_for(job_id: str) -> JobContext:
        claim = jobs.claim(job_id, "w1")
        assert claim.owner is not None, claim.reason
        return JobContext(claim.job, claim.owner, "w1", engine, tok, jobs, JobEvents(client, s), Routing(client, s))

    def workflow(ctx: JobContext, sid: str) -> list[Any]:
        out = []
        ctx.report(section=0, sections=2)
        for i, ids in enumerate(inputs):
            out.append(ctx.turn(sid, ids, PARAMS))
            ctx.report(section=i + 1, sections=2)
        return out

    sid = records.create_session("acme", "").id
    job, _ = jobs.create("turn", "acme", {"text": "x"}, sid)
    first = ctx_for(job.id)
    first.report(section=0, sections=2)
    done_first = first.turn(sid, inputs[0], PARAMS)  # step 0 committed ...
    first.report(section=1, sections=2)
    first.close()  # ... then the worker dies: no finish, no more heartbeats
    time.sleep(0.4)
    [expired] = jobs.expired()
    assert jobs.requeue(expired)
    second = ctx_for(job.id)
    seen: list[int] = []
    publish = second.events.publish
    second.events.publish = lambda j, ev: (seen.append(ev["section"]) if "section" in ev else None,  # type: ignore
                                           publish(j, ev))[-1]
    try:
        r = workflow(second, sid)
    finally:
        second.close()
    assert seen == sorted(seen) and seen[0] == 1 and seen[-1] == 2  # the replay never says less than was said
    assert jobs.get(job.id).progress["section"] == 2
    assert [x.path for x in r] == ["done", "warm"]
    assert r[0].tokens == done_first.tokens and r[0].turn == 0 and r[1].turn == 1
    rows = records.turns(sid, "acme")
    assert [(t.job_id, t.job_step) for t in rows] == [(job.id, 0), (job.id, 1)]
    ref = engine.open("acme")
    assert [engine.run_turn(ref, "acme", ids, PARAMS).tokens for ids in inputs] == [x.tokens for x in r]
    assert jobs.get(job.id).progress["steps"] == 2
    sql.dispose()
