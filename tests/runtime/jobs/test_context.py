"""runtime/jobs/context.py with the shipped model, a real Redis and a SQLite file: a job that
dies after committing a step and is run again replays that step as written (no second turn),
then decodes the rest; the tokens are those of an uninterrupted run.  A result recorded with
Turns.once is replayed from SQL by the next attempt, on another worker.  As the Turns of a
workflow, a job writes what a session in this process writes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from domain import narrative as corpus
from domain.facts import slots_in
from model import shipped
from model.params import DecodeParams
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.db import make_engine
from runtime.errors import ClaimLost
from runtime.jobs.context import JobContext, JobServices
from runtime.jobs.events import JobEvents
from runtime.jobs.routing import Routing
from runtime.jobs.rows import Jobs
from runtime.jobs.specs import NarrativeSpec
from runtime.sessions.engine import Engine
from runtime.sessions.local import LocalTurns
from runtime.sessions.records import Records
from runtime.sessions.store import SessionStore
from runtime.settings import Settings
from workflows import narrative
from workflows.narrative import narrative_input

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
        return JobContext(claim, JobServices("w1", engine, tok, jobs, JobEvents(client, s), Routing(client, s)))

    def workflow(ctx: JobContext) -> list[Any]:
        out = []
        ctx.report(section=0, sections=2)
        for i, ids in enumerate(inputs):
            out.append(ctx.turn(ids, PARAMS))
            ctx.report(section=i + 1, sections=2)
        return out

    sid = records.create_session("acme", "").id
    job, _ = jobs.create("turn", "acme", {"text": "x"}, sid)
    first = ctx_for(job.id)
    first.report(section=0, sections=2)
    done_first = first.turn(inputs[0], PARAMS)  # step 0 committed ...
    first.report(section=1, sections=2)
    first.close()  # ... then the worker dies: no finish, no more heartbeats
    time.sleep(0.4)
    [expired] = jobs.expired()
    assert jobs.requeue(expired)
    second = ctx_for(job.id)
    seen: list[int] = []
    publish = second.events.publish
    second.events.publish = lambda t, j, ev: (seen.append(ev["section"]) if "section" in ev else None,  # type: ignore
                                              publish(t, j, ev))[-1]
    try:
        r = workflow(second)
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


def test_once_is_recorded_in_the_jobs_row_and_replayed_by_its_next_attempt_on_another_worker(
        loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, settings: Settings, tmp_path: Path) -> None:
    """Turns.once: the first attempt runs the side effect and records its result (JSON, in SQL,
    under its claim); the worker dies; the next attempt, on another worker, gets the recorded
    result back from the job's row and never runs the side effect again."""
    model, tok = loaded
    s = settings.model_copy(update={"data_dir": tmp_path, "job_lease_s": 0.3})
    sql = make_engine(s)
    records, jobs = Records(sql), Jobs(sql, s)
    engine = Engine(model, SessionStore(client, s), records, s)
    runs: list[Any] = []

    def effect(value: Any) -> Callable[[], Any]:
        def fn() -> Any:
            runs.append(value)
            return value
        return fn

    def ctx_for(job_id: str, worker: str) -> JobContext:
        claim = jobs.claim(job_id, worker)
        assert claim.owner is not None, claim.reason
        return JobContext(claim, JobServices(worker, engine, tok, jobs, JobEvents(client, s), Routing(client, s)))

    said = {"tool": "metric", "result": "1240", "ok": True, "at": (1, 2)}
    replayed = {**said, "at": [1, 2]}  # what JSON reads back: the first run gets it too
    job, _ = jobs.create("turn", "acme", {"text": "x"}, records.create_session("acme", "").id)
    first = ctx_for(job.id, "w1")
    assert first.once("call_1", effect(said)) == replayed
    assert first.once("call_1", effect("again")) == replayed  # the same attempt replays it too
    with pytest.raises(TypeError):
        first.once("names", lambda: {"x"})  # not JSON: nothing recorded
    first.close()  # ... then the worker dies: no finish, no more heartbeats
    time.sleep(0.4)
    [expired] = jobs.expired()
    assert jobs.requeue(expired)
    second = ctx_for(job.id, "w2")
    try:
        assert second.once("call_1", effect("changed meanwhile")) == replayed
        assert second.once("names", effect(["revenue"])) == ["revenue"]
    finally:
        second.close()
    assert runs == [said, ["revenue"]]  # each side effect ran once
    with pytest.raises(ClaimLost):  # the first worker's claim has gone: it records nothing more
        first.once("late", effect(1))
    kept = jobs.get(job.id).tool_outputs or {}  # the format rows written before once hold
    assert {k: json.loads(v) for k, v in kept.items()} == {"server:call_1": replayed, "server:names": ["revenue"]}
    sql.dispose()


def test_a_narrative_job_writes_the_text_a_session_in_this_process_writes(
        loaded: tuple[SetDLM, Tokenizer], client: redis.Redis, settings: Settings, tmp_path: Path) -> None:
    model, tok = loaded
    s = settings.model_copy(update={"data_dir": tmp_path})
    sql = make_engine(s)
    records, jobs = Records(sql), Jobs(sql, s)
    engine = Engine(model, SessionStore(client, s), records, s)
    payload = {"tenant": "Northwind", "period": "2026-Q3", "style": "formal",
               "metrics": [{"key": "revenue", "value": "1240", "prev": "1105", "target": "1300"},
                           {"key": "churn", "value": "2.4", "prev": "2.6"}]}
    spec = NarrativeSpec.model_validate({"payload": payload})
    sid = records.create_session("acme", "").id
    job, _ = jobs.create("narrative", "acme", {"payload": payload}, sid)
    claim = jobs.claim(job.id, "w1")
    assert claim.owner is not None, claim.reason
    ctx = JobContext(claim, JobServices("w1", engine, tok, jobs, JobEvents(client, s), Routing(client, s)))
    try:
        assert ctx.cfg is model.cfg and ctx.used() == 0
        r = narrative.run(ctx, spec)
        assert ctx.used() == 0  # a job's own turns do not count against its plan
    finally:
        ctx.close()
    local = narrative.run(LocalTurns(model, tok), spec)
    assert r["text"] == local["text"] and r["tokens"] == local["tokens"] and r["nfe"] == local["nfe"]
    assert r["session"] == sid and r["path"] == local["path"] == "new"
    [row] = records.turns(sid, "acme")
    assert records.length(sid, "acme") == len(row.ledger) > 0 and (row.job_id, row.job_step) == (job.id, 0)
    # the model wrote slots (the ledger's positions past the prompt); the job returns them written out
    ids, _, rendered = narrative_input(tok, spec.payload.to_payload())
    written = tok.decode([t for _, t in sorted(row.ledger)][len(ids):], skip_special=True)
    assert slots_in(written) and r["text"] == rendered.slots.lexicalise(written) and not slots_in(r["text"])
    assert corpus.read_back(rendered, written).fully_correct and r["facts_ok"] == r["facts_total"]
    sql.dispose()
