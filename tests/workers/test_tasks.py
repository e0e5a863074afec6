"""Turns through real Celery worker processes (tests/workers/conftest.py): the same tokens as the
engine in this process; one effect per job however often it is delivered; a session's turns in
submission order; bad messages fail clearly, once."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from domain.payload import Metric, Payload
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.jobs.routing import own_queue
from tests.workers.conftest import reference
from workers.celery_app import TASK
from workers.local import LocalCluster
from workflows.narrative import prompt_ids

PAYLOAD = Payload("Globex", "2026-Q3", "brief", [Metric("revenue", "1240", "1105", "1300")])
PARAMS = {"policy": "prefix", "window": 8, "tau": 0.99, "max_new_tokens": 64}


def inputs(tok: Tokenizer, n: int) -> list[dict[str, Any]]:
    first = {"input_ids": prompt_ids(tok, PAYLOAD), "params": PARAMS}
    return [first] + [{"text": "\nnarrative: ", "params": PARAMS} for _ in range(n - 1)]


def test_turns_through_celery_match_the_engine_in_process(cluster: LocalCluster, loaded: tuple[SetDLM, Tokenizer]) -> None:
    specs = inputs(loaded[1], 3)
    sid = cluster.open("acme")
    results = []
    for spec in specs:
        job = cluster.wait(cluster.submit(sid, spec))
        assert job.status == "succeeded", (job.error, cluster.log("w1"), cluster.log("w2"))
        assert job.attempts == 1 and job.step == 1 and job.result is not None
        results.append(job.result)
    assert [r["tokens"] for r in results] == reference(loaded, cluster, specs)
    assert results[0]["text"] == loaded[1].decode(results[0]["tokens"], skip_special=True)
    # the second and third turns went to the worker that ran the first, and found it warm
    assert [r["affinity"] for r in results] == ["none", "hit", "hit"]
    assert [r["path"] for r in results] == ["new", "warm", "warm"]
    turns = cluster.records.turns(sid, "acme")
    assert [t.job_step for t in turns] == [0, 0, 0] and len({t.job_id for t in turns}) == 3


def test_the_same_task_delivered_twice_has_one_effect(cluster: LocalCluster, loaded: tuple[SetDLM, Tokenizer]) -> None:
    sid = cluster.open("acme")
    spec = inputs(loaded[1], 1)[0]
    job, _ = cluster.jobs.create("turn", "acme", spec, sid)
    queue = cluster.dispatcher.routing.shared("interactive")
    for _ in range(2):  # at once: both workers take one each
        cluster.app.send_task(TASK, args=[job.id], queue=queue)
    done = cluster.wait(job)
    time.sleep(0.5)  # the other delivery has been looked at by now
    for _ in range(2):  # and again, after it finished, to a worker's own queue
        cluster.app.send_task(TASK, args=[job.id], queue=own_queue(cluster.settings, "w2"))
    time.sleep(1.0)
    again = cluster.jobs.get(job.id)
    assert done.status == again.status == "succeeded" and again.attempts == 1
    turns = cluster.records.turns(sid, "acme")
    assert len(turns) == 1 and turns[0].token_ids[len(spec["input_ids"]):] == done.result["tokens"]  # type: ignore[index]


def test_two_turns_sent_at_once_run_in_submission_order(cluster: LocalCluster, loaded: tuple[SetDLM, Tokenizer]) -> None:
    sid = cluster.open("acme")
    first = cluster.wait(cluster.submit(sid, inputs(loaded[1], 1)[0]))
    a = {"text": "\nnarrative: ", "params": PARAMS}
    b = {"text": "\nnarrative: the", "params": PARAMS}
    jobs: list[Any] = [None, None]
    go = threading.Event()

    def submit(i: int, spec: dict[str, Any]) -> None:
        go.wait()
        jobs[i] = cluster.submit(sid, spec)

    threads = [threading.Thread(target=submit, args=(i, s)) for i, s in enumerate([a, b])]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    done = sorted((cluster.wait(j) for j in jobs), key=lambda j: j.seq)  # submission order
    assert [j.status for j in done] == ["succeeded", "succeeded"]
    order = [a, b] if done[0].id == jobs[0].id else [b, a]
    turns = cluster.records.turns(sid, "acme")
    assert [t.job_id for t in turns] == [first.id, done[0].id, done[1].id]
    expect = reference(loaded, cluster, [inputs(loaded[1], 1)[0], *order])
    assert [first.result["tokens"], done[0].result["tokens"], done[1].result["tokens"]] == expect  # type: ignore[index]


def test_malformed_payloads_and_unknown_jobs_fail_once(cluster: LocalCluster) -> None:
    dead_before = cluster.client.xlen(cluster.dispatcher.k.dead)
    queue = cluster.dispatcher.routing.shared("interactive")
    for args, kwargs in [([], {}), ([123], {}), (["zz"], {}), (["0" * 24], {}), (["0" * 24, 1], {}),
                         ([], {"job": "x"})]:
        cluster.app.send_task(TASK, args=args, kwargs=kwargs, queue=queue)
    sid = cluster.open("acme")
    bad, _ = cluster.jobs.create("turn", "acme", {"input_ids": "not a list"}, sid)  # stored past the API's checks
    cluster.app.send_task(TASK, args=[bad.id], queue=queue)
    failed = cluster.wait(bad, 30)
    good = cluster.wait(cluster.submit(cluster.open("acme"), {"text": "company: Acme\n", "params": {"max_new_tokens": 4}}))
    time.sleep(1.0)  # no retry loop: nothing more happens to them
    failed = cluster.jobs.get(bad.id)
    assert failed.status == "failed" and failed.attempts == 1
    assert failed.error is not None and failed.error["code"] == "bad_input" and "input_ids" in failed.error["message"]
    assert good.status == "succeeded"
    entries = cluster.client.xrange(cluster.dispatcher.k.dead)[dead_before:]
    codes = sorted(json.loads(f[b"data"])["code"] for _, f in entries)
    assert codes == ["bad_input"] * 5 + ["not_found"]
