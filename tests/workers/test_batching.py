"""A batching worker (batch_sessions > 1: jobs on Celery's thread pool, their turns in one batch)
with real worker processes: its turns match the engine in-process token for token, and a kill -9
with 8 sessions in its batch loses none of them: every job completes on another worker,
token-identical, none written twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from tests.workers.conftest import make_cluster, reference
from tests.workers.test_faults import steps_seen, transcript
from workers.local import LocalCluster

SESSIONS = 8


def spec(i: int) -> dict[str, object]:
    """Turns of different lengths and policies, long enough to be mid-turn when the worker dies:
    at least 400 steps each (a window of 4 decodes up to 4 tokens a step: 3x the tokens, within
    the shipped model's context), many times the steps the last job takes to join the batch."""
    policy = ["ar", "set", "prefix", "block"][i % 4]
    tokens = (400 + 16 * i) * (1 if policy == "ar" else 3)
    return {"text": f"company: Acme {i}\nnarrative: ", "params": {"policy": policy, "window": 4, "tau": 0.9,
                                                              "max_new_tokens": tokens, "ignore_eos": True}}


@pytest.fixture(scope="module")
def batching(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = make_cluster(redis_url, tmp_path_factory.mktemp("batching"), batch_sessions=SESSIONS)
    try:
        yield c
    finally:
        c.close()


def test_kill_9_with_eight_sessions_in_the_batch_completes_all_elsewhere(
        batching: LocalCluster, loaded: tuple[SetDLM, Tokenizer]) -> None:
    c = batching
    c.start("b1")
    c.ready("b1")
    sids = [c.open("acme") for _ in range(SESSIONS)]
    jobs = [c.submit(sid, spec(i)) for i, sid in enumerate(sids)]
    for job in jobs:  # all eight are mid-turn on b1 at once: one batch
        steps_seen(c, job, 5, timeout_s=60)
    running = [c.jobs.get(j.id) for j in jobs]
    assert [(r.worker, r.status) for r in running] == [("b1", "running")] * SESSIONS, "all mid-turn on b1"
    c.kill("b1")
    c.start("b2")
    done = [c.wait(j, 120) for j in jobs]
    assert [d.status for d in done] == ["succeeded"] * SESSIONS, [(d.error, c.log("b2")) for d in done]
    assert [(d.attempts, (d.result or {}).get("worker")) for d in done] == [(2, "b2")] * SESSIONS
    for i, (sid, d) in enumerate(zip(sids, done)):
        want = reference(loaded, c, [spec(i)])[0]
        assert d.result is not None and d.result["tokens"] == want, f"session {i}"
        assert [j for j, _ in transcript(c, sid)] == [d.id], "one turn: none missing, none twice"


def test_a_batching_workers_turns_match_the_engine_in_process(batching: LocalCluster,
                                                              loaded: tuple[SetDLM, Tokenizer]) -> None:
    c = batching
    c.start("b3")
    c.ready("b3")
    sids = [c.open("acme") for _ in range(4)]
    jobs = [c.submit(sid, spec(i)) for i, sid in enumerate(sids)]
    done = [c.wait(j, 120) for j in jobs]
    assert all(d.status == "succeeded" and d.attempts == 1 for d in done), [d.error for d in done]
    for i, d in enumerate(done):
        assert d.result is not None and d.result["tokens"] == reference(loaded, c, [spec(i)])[0]
