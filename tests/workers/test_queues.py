"""One worker, to see what it serves first (interactive before batch, whatever came first), and
the worker path on PostgreSQL (where one answers)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.settings import CPU_BATCH
from runtime.tables import JobRecord
from tests.conftest import pg_schema
from tests.workers.conftest import make_cluster, reference
from tests.workers.test_faults import LONG, steps_seen
from tests.workers.test_tasks import inputs
from workers.celery_app import TASK
from workers.local import LocalCluster


@pytest.fixture(scope="module")
def solo(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = make_cluster(redis_url, tmp_path_factory.mktemp("solo"))
    try:
        c.start("w1")
        c.ready("w1")
        yield c
    finally:
        c.close()


def interactive_goes_first(c: LocalCluster, slots: int, timeout_s: float = 60) -> tuple[JobRecord, JobRecord]:
    """Fill every slot with long jobs, queue a batch job, then an interactive one: the interactive
    one starts first.  Returns (batch, interactive) as submitted."""
    # long enough that none ends before the two small jobs are queued (a few hundred ms in all, seconds
    # on a loaded machine, where the last slot's first step can come well after the first's),
    # and one clearly first: the slot it frees decides (busy jobs ending together would free two
    # slots at once, and which small job claims first would be a race)
    def long(n: int) -> dict[str, object]:
        return {**LONG, "params": {**LONG["params"], "max_new_tokens": n}}  # type: ignore[dict-item]

    busy = [c.submit(c.open("acme"), long(900 if i == 0 else 1800)) for i in range(slots)]
    for job in busy:
        steps_seen(c, job, 1)
    assert all(c.jobs.get(j.id).status == "running" for j in busy), "every slot busy when the two arrive"
    small = {"text": "company: Acme\n", "params": {"max_new_tokens": 4}}
    batch = c.dispatcher.submit("turn", "acme", small, c.open("acme"), priority="batch")
    time.sleep(0.05)
    inter = c.dispatcher.submit("turn", "acme", small, c.open("acme"), priority="interactive")
    done = [c.wait(j, timeout_s) for j in (*busy, batch, inter)]
    assert [j.status for j in done] == ["succeeded"] * len(done)
    assert done[-1].started_at is not None and done[-2].started_at is not None
    assert done[-1].started_at < done[-2].started_at  # queued later, served first
    return batch, inter


def test_interactive_jobs_go_before_batch_jobs(solo: LocalCluster) -> None:
    """The worker batches CPU_BATCH jobs at once (its default): with every slot busy, what comes
    next waits in the queues, and a free slot takes the interactive job first."""
    batch, inter = interactive_goes_first(solo, CPU_BATCH)
    assert batch.queue.endswith(".batch") and inter.queue.endswith(".interactive")


def test_the_worker_path_on_postgresql(redis_url: str, tmp_path_factory: pytest.TempPathFactory,
                                       loaded: tuple[SetDLM, Tokenizer]) -> None:
    with pg_schema() as url:
        c = make_cluster(redis_url, tmp_path_factory.mktemp("pg"), database_url=url)
        try:
            c.start("w1")
            c.ready("w1")
            specs = inputs(loaded[1], 2)
            sid = c.open("acme")
            done = [c.wait(c.submit(sid, spec)) for spec in specs]
            assert [j.status for j in done] == ["succeeded", "succeeded"]
            assert [j.result["tokens"] for j in done] == reference(loaded, c, specs)  # type: ignore[index]
            again = done[1].id  # delivered again after it finished: no effect
            c.app.send_task(TASK, args=[again], queue=c.dispatcher.routing.shared("interactive"))
            time.sleep(1.0)
            assert c.jobs.get(again).attempts == 1 and len(c.records.turns(sid, "acme")) == 2
        finally:
            c.close()


def test_a_job_past_its_soft_time_limit_fails_and_the_session_stays_usable(
        redis_url: str, tmp_path_factory: pytest.TempPathFactory, loaded: tuple[SetDLM, Tokenizer]) -> None:
    c = make_cluster(redis_url, tmp_path_factory.mktemp("limits"), task_soft_time_limit_s=1,
                     task_time_limit_s=20, visibility_timeout_s=60)
    try:
        c.start("w1")
        c.ready("w1")
        first, follow = inputs(loaded[1], 2)
        sid = c.open("acme")
        done = c.wait(c.submit(sid, first))
        slow = c.wait(c.submit(sid, {**LONG, "params": {**LONG["params"], "max_new_tokens": 900}}))  # type: ignore[dict-item]
        assert slow.status == "failed" and slow.error is not None and slow.error["code"] == "time_limit"
        assert slow.attempts == 1
        nxt = c.wait(c.submit(sid, follow))
        assert nxt.status == "succeeded"
        assert [done.result["tokens"], nxt.result["tokens"]] == reference(loaded, c, [first, follow])  # type: ignore[index]
    finally:
        c.close()
