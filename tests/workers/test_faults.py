"""Faults with real worker processes: a worker killed (-9) in the middle of a turn, Redis killed
and restarted in the middle of a turn, a turn cancelled.  Each time the SQL transcript ends up
token-identical to an uninterrupted run, with no turn missing or written twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.embedded import EmbeddedRedis
from runtime.tables import JobRecord
from tests.workers.conftest import make_cluster, reference
from tests.workers.test_tasks import inputs
from workers.local import LocalCluster

LONG = {"text": "\nnarrative: ", "params": {"policy": "ar", "max_new_tokens": 320, "ignore_eos": True}}


def steps_seen(c: LocalCluster, job: JobRecord, n: int, timeout_s: float = 30.0) -> None:
    """Wait until the job has published n step events (it is mid-turn)."""
    deadline, seen, after = time.monotonic() + timeout_s, 0, "0"
    while seen < n:
        assert time.monotonic() < deadline, f"job {job.id}: {seen} steps in {timeout_s} s"
        for eid, ev in c.dispatcher.events.read(job.id, after, block_ms=200):
            after = eid
            seen += ev["type"] == "step"


def transcript(c: LocalCluster, sid: str) -> list[tuple[str | None, list[int]]]:
    return [(t.job_id, t.token_ids) for t in c.records.turns(sid, "acme")]


@pytest.fixture(scope="module")
def trio(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = make_cluster(redis_url, tmp_path_factory.mktemp("trio"))
    try:
        c.start("w1", "w2", "victim")
        c.ready("w1", "w2", "victim")
        yield c
    finally:
        c.close()


def test_kill_9_mid_turn_completes_elsewhere_token_identical(trio: LocalCluster, loaded: tuple[SetDLM, Tokenizer]) -> None:
    c = trio
    specs = [inputs(loaded[1], 1)[0], LONG]
    sid = c.open("acme")
    first = c.wait(c.submit(sid, specs[0]))
    c.dispatcher.routing.touch(sid, "victim")  # the session's last worker: its next turn goes there
    deadline = time.monotonic() + 10
    while not c.dispatcher.routing.alive("victim") and time.monotonic() < deadline:
        time.sleep(0.05)  # a heartbeat late under load (0.3 s, dead after 3 missed) would route it elsewhere
    job = c.submit(sid, specs[1])
    assert job.queue == c.dispatcher.routing.own("victim")
    steps_seen(c, job, 20)
    c.kill("victim")
    killed_at = time.monotonic()
    done = c.wait(job, 60)
    assert done.status == "succeeded", (done.error, c.log("w1"), c.log("w2"))
    assert done.attempts == 2 and done.result is not None and done.result["worker"] in ("w1", "w2")
    assert time.monotonic() - killed_at < 30
    want = reference(loaded, c, specs)
    assert [first.result["tokens"], done.result["tokens"]] == want  # type: ignore[index]
    rows = transcript(c, sid)
    assert [j for j, _ in rows] == [first.id, job.id]  # none missing, none twice
    assert rows[1][1] == loaded[1].encode(LONG["text"]) + want[1]  # type: ignore[arg-type]
    statuses = [e["status"] for _, e in c.dispatcher.events.read(job.id) if e["type"] == "status"]
    assert statuses == ["queued", "running", "queued", "running", "succeeded"]


def test_cancel_stops_within_one_step_and_the_session_stays_usable(
        trio: LocalCluster, loaded: tuple[SetDLM, Tokenizer]) -> None:
    c = trio
    first_spec, follow = inputs(loaded[1], 2)
    sid = c.open("acme")
    first = c.wait(c.submit(sid, first_spec))
    job = c.submit(sid, LONG)
    steps_seen(c, job, 10)
    asked = time.time()
    assert c.dispatcher.cancel(job.id, "acme").status == "running"
    done = c.wait(job, 30)
    assert done.status == "cancelled" and done.error is not None and done.error["code"] == "cancelled"
    seen = done.error["seen_at"]  # when the request reached the worker: a round trip later
    assert 0 <= seen - asked < 0.5
    events = [e for _, e in c.dispatcher.events.read(job.id)]
    after = [e for e in events if e["type"] == "step" and e["t"] > seen]
    assert len(after) <= 1, after  # the step in flight ended; no other began
    assert sum(e["type"] == "step" for e in events) < 320
    assert [j for j, _ in transcript(c, sid)] == [first.id]  # the cancelled turn left nothing
    nxt = c.wait(c.submit(sid, follow))
    assert nxt.status == "succeeded"
    assert [first.result["tokens"], nxt.result["tokens"]] == reference(loaded, c, [first_spec, follow])  # type: ignore[index]


@pytest.mark.parametrize("batch_sessions", [1, 4], ids=["prefork", "batching"])
def test_redis_restarted_mid_turn_the_job_completes_by_recompute(
        tmp_path_factory: pytest.TempPathFactory, loaded: tuple[SetDLM, Tokenizer], batch_sessions: int) -> None:
    folder = tmp_path_factory.mktemp("rr")
    server = EmbeddedRedis(folder / "redis")
    server.start()
    c = make_cluster(server.url, folder, batch_sessions=batch_sessions)
    try:
        c.start("w1")
        c.ready("w1")
        specs = [inputs(loaded[1], 1)[0], LONG]
        sid = c.open("acme")
        first = c.wait(c.submit(sid, specs[0]))
        job = c.submit(sid, specs[1])
        steps_seen(c, job, 20)
        server.kill()  # kill -9: every key is gone, the broker's queues too
        time.sleep(0.5)
        server.start()
        done = c.wait(job, 90)
        assert done.status == "succeeded", (done.error, c.log("w1"))
        assert done.result is not None and done.result["path"] == "recompute" and done.attempts == 1
        assert c.jobs.get(first.id).status == "succeeded"  # nothing completed is lost
        later = c.wait(c.submit(sid, {"text": "\nnarrative: ", "params": inputs(loaded[1], 1)[0]["params"]}), 60)
        assert later.status == "succeeded", (later.error, c.log("w1"))  # the worker is back on the broker
        want = reference(loaded, c, [*specs, {"text": "\nnarrative: ", "params": specs[0]["params"]}])
        got: list[Any] = [first.result["tokens"], done.result["tokens"], later.result["tokens"]]  # type: ignore[index]
        assert got == want
        assert [j for j, _ in transcript(c, sid)] == [first.id, job.id, later.id]
    finally:
        c.close()
        server.stop()
